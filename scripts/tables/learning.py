"""Learning curves from runs' own records, committed under docs/results/learning/NAME (the run's
`summary.json` and `metrics.jsonl`): held-out accuracy, and each evaluation set's metrics, at
every evaluation of a run."""

from __future__ import annotations

import json
from typing import Any

from tables.figures import RESULTS, rounded


def evaluations(name: str) -> dict[int, dict[str, float]]:
    """Step -> what was evaluated there (step 0: before RL), from run `name`'s records."""
    run = RESULTS / "learning" / name
    summary = json.loads((run / "summary.json").read_text())
    found = {0: {"held_out_accuracy": summary["initial_accuracy"], **summary.get("initial_evaluations", {})}}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record: dict[str, Any] = json.loads(line)
        if "held_out_accuracy" in record:
            figures = {k: v for k, v in record.items() if k == "held_out_accuracy" or k.startswith("eval/")}
            found[record.get("eval_step", record["step"])] = figures
    return found


def summary(name: str) -> dict[str, Any]:
    """Run `name`'s summary line."""
    result: dict[str, Any] = json.loads((RESULTS / "learning" / name / "summary.json").read_text())
    return result


def curves(rows: dict[str, tuple[str, str]]) -> list[str]:
    """A table of one figure per row (label -> run, key) at every step the first run evaluated."""
    runs = {label: evaluations(run) for label, (run, _) in rows.items()}
    steps = sorted(next(iter(runs.values())))
    lines = ["| step | " + " | ".join(str(step) for step in steps) + " |", "|---" * (len(steps) + 1) + "|"]
    for label, (_, key) in rows.items():
        cells = [f"{runs[label][step][key]:.3f}" for step in steps]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def same_in_both(first: str, second: str) -> str:
    """Whether two runs evaluated the same figures at every evaluation."""
    return "the same" if evaluations(first) == evaluations(second) else "not the same"


def _ledger(name: str) -> str:
    ledger = summary(name)["ledger"]
    stale = "none stale" if not ledger["dropped_stale"] else f"{ledger['dropped_stale']} stale"
    return f"{ledger['issued']} tickets issued, {ledger['trained']} trained, {stale}"


def _times(run: dict[str, Any]) -> str:
    return (
        f"{rounded(run['wall_s'], 0)} s of wall time ({rounded(run['rl_wall_s'], 0)} s of RL, "
        f"{rounded(run['eval_s'], 0)} s of it evaluating)"
    )


def own_model() -> list[str]:
    """docs/own-model.md: the worked example's two runs."""
    sets = ("greedy (32 prompts)", "greedy"), ("pass@4", "pass@4"), ("mean@4", "mean@4")
    rows = {"held-out accuracy (64 prompts, greedy)": ("own-model-async", "held_out_accuracy")}
    rows |= {f"`additions` {label}": ("own-model-async", f"eval/additions/{key}") for label, key in sets}
    run, sync = summary("own-model-async"), summary("own-model-sync")
    return [
        *curves(rows),
        "",
        f"Held-out accuracy **{run['initial_accuracy']:.3f} -> {run['final_accuracy']:.3f}** in {run['steps']} "
        f"steps. Both modes gave {same_in_both('own-model-async', 'own-model-sync')} figures, evaluation for "
        f"evaluation. The async run took {_times(run)}, with a checkpoint every 20 steps; the sync run {_times(sync)}.",
    ]


def _range(name: str, key: str) -> str:
    values = [
        json.loads(line)[key] for line in (RESULTS / "learning" / name / "metrics.jsonl").read_text().splitlines()
    ]
    return f"{min(values):.3f} to {max(values):.3f}"


def smollm2_vllm() -> list[str]:
    """docs/engines.md: SmolLM2 learning with vLLM generators, both modes."""
    rows = {
        "held-out accuracy, async": ("smollm2-vllm", "held_out_accuracy"),
        "held-out accuracy, sync": ("smollm2-vllm-sync", "held_out_accuracy"),
    }
    run = summary("smollm2-vllm")
    return [
        *curves(rows),
        "",
        f"Held-out accuracy **{run['initial_accuracy']:.3f} -> {run['final_accuracy']:.3f}** in {run['steps']} "
        f"steps; both modes gave {same_in_both('smollm2-vllm', 'smollm2-vllm-sync')} figures at every evaluation. "
        f"The async run's ledger balanced ({_ledger('smollm2-vllm')}). Over its steps the bfloat16 engine's "
        f"log-probs differ from the float32 trainer's by {_range('smollm2-vllm', 'mismatch_abs_mean')} nats a "
        f"token on a step's average (`mismatch_abs_mean`), the largest gap of a step is "
        f"{_range('smollm2-vllm', 'mismatch_abs_max')} nats, and the KL estimate (`mismatch_kl`) runs from "
        f"{_range('smollm2-vllm', 'mismatch_kl')}.",
    ]
