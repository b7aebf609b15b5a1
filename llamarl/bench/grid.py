"""`llamarl bench grid`: the default `llamarl run` against `--mode sync` on a grid of shapes.

For each shape (a config): the profile is measured fresh and timed, then read back from the cache
and timed again (what `workers.layout: auto` pays before a run: once per config and machine).
Then `--pairs` interleaved rounds of three runs of the same work: sync, the default run (layout
auto: taking turns in one_process unless a split is predicted faster by more than the profile's
spread) and the alternative of the other kind (colocated when auto chose a split, else the split
`workers.layout: split` starts), so the choice is checked against a measured alternative; sync
and the default swap places in odd rounds (default, sync, alternative), so a machine whose speed
drifts within a round favours neither. Per
run: seconds per RL step (`clean_step_s`: steps past the shape's warm-up (WARMUP) that neither
evaluated nor followed an evaluation), the layout it ran and, for the auto run, the prediction it
printed; for async runs each generator's and the trainer's idle fraction (their own timers).

Per shape: speed-up of the default over sync (sync s/step / default s/step) and of the alternative;
the prediction error of the chosen layout (predicted / measured - 1); whether the choice was the
fastest measured within the spread (its median no slower than the alternative's, or their
min-max ranges overlap); and the phase limit: sync s/step / the longer of its two phases (what
overlap would give were each role as fast alone as on every core). It is not the bound of
`llamarl bench async-vs-sync` (docs/benchmarks.md, Definitions), which times each role alone at
the threads async gives it: a role on one core can be nearly as fast as on two, so a speed-up can
pass the phase limit. With
`min_new_tokens` the work is equal in both modes (the runs' generated tokens are reported).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from llamarl.bench.async_vs_sync import clean_step_s, profile_config, run_once
from llamarl.bench.stats import spread
from llamarl.config.run import read_tree

SHAPES = {
    "demo": "configs/tiny.yaml",
    "generation_heavy": "configs/bench_generation_heavy.yaml",
    "train_heavy": "configs/bench_train_heavy.yaml",
    "variable_length": "configs/bench_variable_length.yaml",
    "smollm2_train_heavy": "configs/bench_smollm2_train_heavy.yaml",
    "smollm2_generation_heavy": "configs/bench_smollm2_generation_heavy.yaml",
}
STEPS = {"smollm2_train_heavy": 13, "smollm2_generation_heavy": 13}
"""RL steps of each run (default DEFAULT_STEPS): SmolLM2's take seconds each."""
DEFAULT_STEPS = 40
WARMUP = {"smollm2_train_heavy": 3, "smollm2_generation_heavy": 3}
"""Steps left out of seconds per step at the start of every run, sync and async alike (default
1): a 135M model's first training steps grow the process's heap and optimizer state (a
one-thread trainer's first three took 19, 10 and 5 s, then 2.6-3.1 s each)."""


def _tree(config: str, steps: int) -> dict[str, Any]:
    """The shape's config for one timed run: `steps` RL steps, one evaluation at the end, no
    warm start (seconds per step do not depend on what the model knows)."""
    tree = read_tree(Path(config))
    trainer = tree.get("trainer", {}) | {"num_steps": steps, "eval_every": steps, "sft_steps": 0, "checkpoint_every": 0}
    task = tree.get("task", {}) | {"num_eval": min(tree.get("task", {}).get("num_eval", 8), 16)}
    return tree | {"trainer": trainer, "task": task}


def _run(tree: dict[str, Any], mode: str, layout: str | None, name: str, work_dir: Path, warmup: int) -> dict[str, Any]:
    variant = tree
    if layout is not None:
        variant = tree | {"workers": tree.get("workers", {}) | {"layout": layout}}
    result = run_once(variant, mode, name, work_dir)
    ran = result.summary["mode"]
    row: dict[str, Any] = {
        "s_per_step": round(clean_step_s(result.records, ran, warmup), 4),
        "generated_tokens": sum(r.get("num_tokens", 0) for r in result.records),
    }
    if mode == "sync":
        kept = result.records[warmup:-1]
        for phase in ("generate_s", "train_s"):
            row[phase] = round(sum(r[phase] for r in kept) / len(kept), 4)
    else:
        row["layout"] = json.loads((work_dir / name / "layout.json").read_text())
        row["ran"] = ran
        row["idle_fraction"] = {
            role: round(timer["idle_s"] / (timer["idle_s"] + timer["busy_s"]), 3)
            for role, timer in result.timers.items()
            if timer.get("busy_s") and role.split("-")[0] in ("generator", "trainer")
        }
    return row


def _other(layout: dict[str, Any]) -> str:
    """The alternative a default run is checked against: a split run where auto chose to take
    turns (one_process), else colocated."""
    return "colocated" if layout["kind"] == "split" else "split"


def shape(name: str, config: str, pairs: int, work_dir: Path) -> dict[str, Any]:
    steps, warmup = STEPS.get(name, DEFAULT_STEPS), WARMUP.get(name, 1)
    profile = {"fresh_s": profile_config(Path(config), fresh=True), "cached_s": profile_config(Path(config))}
    tree = _tree(config, steps)
    runs: dict[str, list[dict[str, Any]]] = {"sync": [], "default": [], "other": []}
    for pair in range(pairs):
        if pair % 2 == 0:  # sync and the default swap places pair by pair: drift favours neither
            runs["sync"].append(_run(tree, "sync", None, f"{name}-sync-{pair}", work_dir, warmup))
        default = _run(tree, "async", None, f"{name}-default-{pair}", work_dir, warmup)
        runs["default"].append(default)
        if pair % 2 == 1:
            runs["sync"].append(_run(tree, "sync", None, f"{name}-sync-{pair}", work_dir, warmup))
        other = _other(default["layout"])
        runs["other"].append(_run(tree, "async", other, f"{name}-{other}-{pair}", work_dir, warmup))
        print(
            f"grid {name} pair {pair}: " + ", ".join(f"{arm} {rows[-1]['s_per_step']}" for arm, rows in runs.items()),
            file=sys.stderr,
            flush=True,
        )
    sync = [r["s_per_step"] for r in runs["sync"]]
    default_s = [r["s_per_step"] for r in runs["default"]]
    other_s = [r["s_per_step"] for r in runs["other"]]
    chosen = runs["default"][0]["layout"]
    predicted = (chosen["prediction"] or {}).get("chosen", {}).get("s_per_step")
    phase_limit = [s / max(r["generate_s"], r["train_s"]) for s, r in zip(sync, runs["sync"], strict=True)]
    default_median = spread(default_s)["median"]
    return {
        "config": config,
        "steps": steps,
        "profile_s": profile,
        "chosen": {
            key: chosen[key]
            for key in (
                "kind",
                "num_generators",
                "trainer_threads",
                "generator_threads",
                "max_staleness",
            )
        },
        "s_per_step": {
            "sync": spread(sync, 4),
            "default": spread(default_s, 4),
            "other": spread(other_s, 4),
        },
        "default_over_sync": spread([s / d for s, d in zip(sync, default_s, strict=True)]),
        "other_over_sync": spread([s / o for s, o in zip(sync, other_s, strict=True)]),
        "phase_limit": spread(phase_limit),
        "predicted_s_per_step": predicted,
        "prediction_error": round(predicted / default_median - 1, 3) if predicted else None,
        "chose_fastest": (default_median <= spread(other_s)["median"] or min(default_s) <= max(other_s)),
        "runs": runs,
    }


def bench(names: list[str], pairs: int, work_dir: Path, out: Path | None = None) -> dict[str, Any]:
    """Every shape of `names` in turn; with `out`, the JSON so far is written there after each
    shape, so a shape that fails (a model not imported) keeps the shapes before it."""
    work_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("LLAMARL_CACHE_DIR", str(work_dir / "cache"))
    result: dict[str, Any] = {"bench": "grid", "pairs": pairs, "shapes": {}}
    for name in names:
        result["shapes"][name] = shape(name, SHAPES[name], pairs, work_dir)
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result) + "\n")
    return result
