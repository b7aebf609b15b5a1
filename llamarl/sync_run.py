"""The synchronous baseline: generate -> score -> train in one process, one version at a time.

It uses the same packing, scoring, collation and learner code as the async workers, so the async
run can be judged against it. Writes RUN_DIR/metrics.jsonl and returns the run summary.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from llamarl.config import RunConfig
from llamarl.engine.model import Policy, make_policy
from llamarl.engine.sampling import sample
from llamarl.evaluate import accuracy
from llamarl.learner import Learner
from llamarl.metrics import MetricsWriter
from llamarl.rewards import make_verifier
from llamarl.rollouts import pack_groups, score_group, train_group
from llamarl.sft import supervised_warm_start
from llamarl.tasks import PromptSet, make_prompt_set


def prepare_policy(config: RunConfig, prompt_set: PromptSet) -> Policy:
    """The starting policy: loaded or built, then warm-started when sft_steps > 0."""
    policy = make_policy(config.model, config.seed)
    if config.trainer.sft_steps:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            supervised_warm_start(
                policy,
                prompt_set,
                steps=config.trainer.sft_steps,
                lr=config.trainer.sft_lr,
                batch_size=config.trainer.sft_batch_size,
            )
    return policy


def run_sync(config: RunConfig) -> dict[str, Any]:
    started = time.monotonic()
    prompt_set = make_prompt_set(config.task, config.seed)
    verifier = make_verifier(config.task.verifier)
    held_out = prompt_set.eval_items()
    gen = config.generation
    policy = prepare_policy(config, prompt_set)
    learner = Learner(
        policy, config.algorithm, config.trainer, gen.temperature,
        min_new_tokens=gen.min_new_tokens,
    )  # fmt: skip
    generator = torch.Generator().manual_seed(config.seed)
    metrics = MetricsWriter(Path(config.run_dir) / "metrics.jsonl")

    def evaluate() -> float:
        return accuracy(policy, held_out, verifier, gen.max_new_tokens, gen.min_new_tokens)

    initial = evaluate()
    rl_started = time.monotonic()
    final = initial
    eval_total = 0.0
    pps = config.trainer.prompts_per_step
    for step in range(config.trainer.num_steps):
        step_started = time.monotonic()
        examples = [prompt_set.train_item(step * pps + i) for i in range(pps)]
        batch = sample(
            policy,
            [policy.encode_prompt(e.prompt) for e in examples],
            num_samples=gen.num_samples,
            max_new_tokens=gen.max_new_tokens,
            min_new_tokens=gen.min_new_tokens,
            temperature=gen.temperature,
            top_p=gen.top_p,
            generator=generator,
        )
        tickets = [(e.index, 0) for e in examples]
        groups = pack_groups(policy, batch, examples, tickets, policy_version=step)
        generated = time.monotonic()
        scored = [score_group(g, verifier, config.task.verifier) for g in groups]
        record: dict[str, Any] = {"step": step + 1, "policy_version": step + 1}
        scored_at = time.monotonic()
        record |= learner.step([train_group(item) for item in scored])
        trained = time.monotonic()
        record |= {"generate_s": generated - step_started, "score_s": scored_at - generated,
                   "train_s": trained - scored_at}  # fmt: skip
        if (step + 1) % config.trainer.eval_every == 0 or step + 1 == config.trainer.num_steps:
            final = record["held_out_accuracy"] = evaluate()
            record["eval_s"] = time.monotonic() - trained
            eval_total += record["eval_s"]
        step_s = time.monotonic() - step_started
        record |= {"step_s": step_s, "tokens_per_s": record["num_tokens"] / step_s}
        record["wall_s"] = time.monotonic() - started
        record["rl_s"] = time.monotonic() - rl_started
        metrics.write(record)
    metrics.close()
    return {
        "mode": "sync",
        "steps": config.trainer.num_steps,
        "wall_s": round(time.monotonic() - started, 2),
        "rl_wall_s": round(time.monotonic() - rl_started, 2),
        "eval_s": round(eval_total, 2),
        "initial_accuracy": initial,
        "final_accuracy": final,
    }
