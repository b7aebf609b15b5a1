"""The lines `llamarl run` prints before it starts anything: what will run. The model and whether
it is warm-started first, the mode and layout, what the run keeps (checkpoints, `--resume`, the
Redis ledger) and what it evaluates (the held-out prompts, each named evaluation set)."""

from __future__ import annotations

from llamarl.config import EvalSetConfig, RunConfig
from llamarl.engine.vllm_engine import engine_dtype


def startup_summary(config: RunConfig, layout: str) -> str:
    """The summary of a run laid out as `layout`."""
    trainer, task = config.trainer, config.task
    model = config.model.path or "the built character model"
    warm = f"warm start: {trainer.sft_steps} supervised steps first" if trainer.sft_steps else "no warm start"
    lines = [f"run {config.run_id}: {model} ({warm}), {_layout(layout)}"]
    if trainer.checkpoint_every:
        lines.append(
            f"  keeps: a checkpoint every {trainer.checkpoint_every} steps (the last "
            f"{trainer.keep_checkpoints}), --resume, the Redis ledger"
        )
    else:
        lines.append("  keeps: the Redis ledger; no checkpoints (trainer.checkpoint_every 0)")
    scorer = task.reward or task.verifier
    lines.append(
        f"  evaluates every {trainer.eval_every} steps: held-out prompts (up to {task.num_eval}, greedy, {scorer})"
    )
    lines += [f"    set {each.name}: {_set(each, scorer)}" for each in config.evaluation.sets]
    lines.append(_engine(config))
    return "\n".join(lines)


def _engine(config: RunConfig) -> str:
    gen = config.generation
    if gen.engine == "native":
        return f"  generates with: the native engine ({gen.dtype}, {gen.batching} batching)"
    options = gen.vllm
    dtype = engine_dtype(options, gen.device)
    line = f"  generates with: vLLM in each generator's process ({dtype}"
    line += ", prefix caching" if options.prefix_caching else ""
    line += ")"
    if config.model.lora is not None:
        line += (
            "; LoRA versions are merged into the base weights on the way in (vLLM's own LoRA "
            "layers are not used: it would load each version's adapters from files)"
        )
    return line


def _layout(layout: str) -> str:
    if layout == "one_process":
        return "layout one_process (every role in this process, taking turns)"
    return f"async, layout {layout}"


def _set(each: EvalSetConfig, task_scorer: str) -> str:
    scorer = each.reward or each.verifier or task_scorer
    limit = f"the first {each.max_prompts} rows of " if each.max_prompts else ""
    sampled = ""
    if each.num_samples:
        ks = ", ".join(f"pass@{k}" for k in each.ks)
        sampled = f", {ks} and mean@{each.num_samples} at temperature {each.temperature:g}"
    return f"{limit}{each.path}, greedy{sampled}, {scorer}"
