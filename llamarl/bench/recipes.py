"""`llamarl bench recipes`: the demo trained with each recipe (`llamarl.config.recipes`) and with
today's default, for several seeds, in both modes; JSON out.

Every run of a seed starts from one shared supervised warm start (`llamarl sft`, once per seed)
and trains on the same prompts; runs interleave (for each seed: each recipe, sync then async), so
a drift of the machine's speed falls on every recipe alike. Per run: final held-out accuracy, RL
seconds (less evaluation) until the mean of the last three evaluations reaches `--target`,
completion tokens trained, and the fractions of what was drawn that did not train: groups skipped
by dynamic sampling (no signal) and tokens masked by masked importance sampling. Per recipe and
mode: the median with min and max over the seeds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from llamarl.bench.async_vs_sync import run_once, time_to, warm_start
from llamarl.bench.stats import median_time, spread
from llamarl.config import parse_config
from llamarl.config.recipes import RECIPES
from llamarl.config.run import read_tree
from llamarl.errors import ConfigError

DEFAULT = "default"
"""The config as it is, less any recipe it names."""


def describe(
    records: list[dict[str, Any]], summary: dict[str, Any], groups_per_step: int, target: float
) -> dict[str, Any]:
    """One run's figures from its metrics and summary line."""
    steps = len(records)
    skipped = sum(float(r.get("groups_skipped", 0.0)) for r in records)
    tokens = sum(float(r["num_tokens"]) for r in records)
    dropped = sum(float(r.get("mis_dropped_fraction", 0.0)) * float(r["num_tokens"]) for r in records)
    return {
        "steps": steps,
        "initial_accuracy": summary["initial_accuracy"],
        "final_accuracy": summary["final_accuracy"],
        "s_to_target": time_to(records, target),
        "trained_tokens": int(tokens),
        "skipped_group_fraction": round(skipped / (skipped + steps * groups_per_step), 4),
        "dropped_token_fraction": round(dropped / tokens, 4) if tokens else 0.0,
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median (min-max) over the seeds of one recipe in one mode."""
    return {
        "final_accuracy": spread([r["final_accuracy"] for r in runs]),
        "s_to_target": median_time([r["s_to_target"] for r in runs]),
        "s_to_target_each": [r["s_to_target"] for r in runs],
        "trained_tokens": spread([r["trained_tokens"] for r in runs], 0),
        "skipped_group_fraction": spread([r["skipped_group_fraction"] for r in runs], 4),
        "dropped_token_fraction": spread([r["dropped_token_fraction"] for r in runs], 4),
    }


def bench(
    config_path: Path, recipes: list[str], seeds: list[int], modes: list[str], target: float, work_dir: Path
) -> dict[str, Any]:
    unknown = [r for r in recipes if r != DEFAULT and r not in RECIPES]
    if unknown:
        names = ", ".join([DEFAULT, *sorted(RECIPES)])
        raise ConfigError(f"--recipes: {', '.join(unknown)} unknown; use {names}")
    if not modes or any(mode not in ("sync", "async") for mode in modes):
        raise ConfigError(f"--modes: {','.join(modes)}; use sync, async or sync,async")
    work_dir.mkdir(parents=True, exist_ok=True)
    base = {key: value for key, value in read_tree(config_path).items() if key != "recipe"}
    groups_per_step = parse_config(base).trainer.prompts_per_step
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {r: {m: [] for m in modes} for r in recipes}
    for seed in seeds:
        start = warm_start(base | {"seed": seed}, work_dir)
        for recipe in recipes:
            tree = start if recipe == DEFAULT else start | {"recipe": recipe}
            for mode in modes:
                name = f"{recipe}-{mode}-{seed}"
                result = run_once(tree, mode, name, work_dir)
                run = describe(result.records, result.summary, groups_per_step, target)
                runs[recipe][mode].append(run | {"seed": seed})
                print(f"{name}: {json.dumps(run)}", file=sys.stderr, flush=True)
    return {
        "config": str(config_path),
        "seeds": seeds,
        "target_accuracy": target,
        "recipes": {r: {m: summarise(runs[r][m]) for m in modes} for r in recipes},
        "runs": runs,
    }
