"""`llamarl bench sim-check`: `llamarl sim`'s predictions against measured async runs.

One layout per generator count (`--generators`, default 1,2,3; the config's other settings
kept, threads as `llamarl run` splits the cores), measured in interleaved rounds (1, 2, 3, 1, 2,
3, ...). Each run starts from the config without its warm start (timing does not depend on what
the model knows: EOS is banned, every completion is max_new_tokens long) and evaluates only at
its end. Per layout: measured seconds per step and each role's idle fraction (median, min-max
over rounds) next to the simulator's, the error of each, and which layout each says is fastest;
the runs check the recommendation of `llamarl sim CONFIG --sweep` (over every core split and
staleness bound, not only these layouts): confirmed when its generator count measures fastest
at its staleness bound (the config's).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from llamarl.bench.async_vs_sync import clean_step_s, role_times, run_once
from llamarl.bench.stats import spread
from llamarl.config import parse_config
from llamarl.config.run import read_tree
from llamarl.sim.calibrate import calibrated
from llamarl.sim.costs import Costs
from llamarl.sim.predict import layout_of, lengths_of, sweep
from llamarl.sim.rl import simulate_async

ROLES = ("generator", "trainer")


def layout_tree(base: dict[str, Any], generators: int, steps: int) -> dict[str, Any]:
    config = parse_config(base)
    generation = dict(base.get("generation", {})) | {"min_new_tokens": config.generation.max_new_tokens}
    trainer = dict(base.get("trainer", {})) | {
        "num_steps": steps,
        "eval_every": steps,
        "sft_steps": 0,
        "checkpoint_every": 0,
    }
    task = dict(base.get("task", {})) | {"num_eval": min(config.task.num_eval, 8)}
    workers = dict(base.get("workers", {})) | {"num_generators": generators}
    return base | {"generation": generation, "trainer": trainer, "task": task, "workers": workers}


def error(predicted: float, measured: float) -> float:
    return round((predicted - measured) / measured, 3) if measured else float("nan")


def bench(
    config_path: Path, profile: Path, generators: list[int], rounds: int, steps: int, work_dir: Path
) -> dict[str, Any]:
    work_dir.mkdir(parents=True, exist_ok=True)
    base = read_tree(config_path)
    costs = Costs.load(profile)
    measured: dict[int, list[dict[str, Any]]] = {count: [] for count in generators}
    for round_index in range(rounds):
        for count in generators:
            tree = layout_tree(base, count, steps)
            result = run_once(tree, "async", f"g{count}-r{round_index}", work_dir)
            roles = role_times(result, "async", len(result.records))
            row = {"s_per_step": clean_step_s(result.records, "async")}
            row |= {f"{role}_idle": roles[role]["idle_fraction"] for role in ROLES}
            measured[count].append(row)
            print(f"sim-check {count} generator(s) round {round_index}: {row}", file=sys.stderr, flush=True)
    layouts = []
    for count in generators:
        config = parse_config(layout_tree(base, count, steps))
        lengths = lengths_of(config, None, 0.0)
        checked, _ = calibrated(costs, layout_of(config, costs.cores, costs), lengths, steps)
        layout = layout_of(config, config.workers.num_cores or costs.cores, checked)
        predicted = simulate_async(layout, checked, lengths, steps)
        rows = measured[count]
        entry: dict[str, Any] = {
            "generators": count,
            "layout": layout.describe(),
            "predicted_s_per_step": round(predicted.s_per_step, 4),
            "measured_s_per_step": spread([r["s_per_step"] for r in rows], 4),
        }
        entry["step_error"] = error(predicted.s_per_step, entry["measured_s_per_step"]["median"])
        for role in ROLES:
            got = spread([r[f"{role}_idle"] for r in rows])
            entry[f"{role}_idle"] = {
                "predicted": round(predicted.idle_fraction[role], 3),
                "measured": got,
                "difference": round(predicted.idle_fraction[role] - got["median"], 3),
            }
        layouts.append(entry)
    fastest_predicted = min(layouts, key=lambda e: e["predicted_s_per_step"])["generators"]
    fastest_measured = min(layouts, key=lambda e: e["measured_s_per_step"]["median"])["generators"]
    recommended = recommendation(base, costs, steps)
    return {
        "config": str(config_path),
        "profile": str(profile),
        "steps": steps,
        "rounds": rounds,
        "layouts": layouts,
        "max_step_error": max(abs(e["step_error"]) for e in layouts),
        "max_idle_difference": max(abs(e[f"{r}_idle"]["difference"]) for e in layouts for r in ROLES),
        "fastest_predicted": fastest_predicted,
        "sweep_recommends": recommended,
        "fastest_measured": fastest_measured,
        "recommendation_confirmed": recommended["num_generators"] == fastest_measured
        and recommended["max_staleness"] == parse_config(base).staleness.max_staleness,
    }


def recommendation(base: dict[str, Any], costs: Costs, steps: int) -> dict[str, Any]:
    """What `llamarl sim CONFIG --sweep` recommends for the config's cores."""
    config = parse_config(layout_tree(base, 1, steps))
    cores = config.workers.num_cores or costs.cores
    layout = layout_of(config, cores, costs)
    return dict(sweep(layout, costs, lengths_of(config, None, 0.0), steps, cores)["best"])
