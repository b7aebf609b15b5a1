"""`workers.layout`: how `llamarl run` lays a run's roles out on the machine's cores.

- `split`: trainer and generators side by side, the cores split by their measured work at
  launch (`llamarl.launch.cores.plan_threads`), or by the config's thread counts.
- `one_process`: every role in the launcher's process, taking turns (the lock-step loop,
  `llamarl.launch.one_process`; `--mode sync` runs the same program).
- `colocated`: one generator process and the trainer process, each with every core, taking turns
  (max_staleness 0); scoring and the weight handover run beside them. For what cannot share the
  trainer's process (a generator on another device or dtype); auto does not start it.
- `auto` (the default): the config's profile on this machine (`llamarl bench profile`, cached by
  config and machine: measured once, in about half a minute for the demo) and the simulator's
  prediction for every candidate (`llamarl.sim.predict.candidates`: thread splits, the trainer
  given more threads than it has cores of its own, 1 to cores+1 generators, staleness bounds up
  to the config's `max_staleness`) against taking turns. A split starts only where it is
  predicted faster than taking turns by more than the profile's own spread, and by at least
  SPLIT_FLOOR (`margin`); otherwise one_process
  does (colocated where one_process cannot run: several trainer ranks, or generators unlike the
  trainer). Fields the config sets explicitly (`num_generators`, `trainer_threads`,
  `generator_threads`) are kept. Every layout keeps checkpoints, `--resume` and the ledger. The
  choice, its predicted s/step against lock-step's and the alternatives are printed and written
  to RUN_DIR/layout.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llamarl.config import RunConfig
from llamarl.errors import ConfigError
from llamarl.launch.cores import CoreSplit, pin_cores, plan_threads, usable_cores
from llamarl.launch.supervise import llamarl_command

if TYPE_CHECKING:
    from llamarl.sim.costs import Costs

SIMULATED_STEPS = 60
SPLIT_FLOOR = 0.10
"""The least a split must be predicted faster than taking turns, whatever the profile's spread:
taking turns is the sync program itself, so it cannot lose to sync, where a split can. On the
layout grid here (2-core cloud machine, calibrated simulator) the chosen splits' predictions
erred by -34% to +23%, and the closest call, `bench_smollm2_train_heavy`'s split predicted 7%
faster than taking turns (its profile's spread 4%), ran 7-9% slower than sync."""
SHOWN = 4
"""Alternatives printed beside the choice."""


@dataclass(frozen=True)
class Plan:
    config: RunConfig
    """The config as laid out (generators, threads, staleness bound)."""
    split: CoreSplit
    kind: str
    """split, colocated or one_process."""
    overrides: dict[str, str] = field(default_factory=dict)
    """Environment overrides that give the workers the plan's fields."""
    prediction: dict[str, Any] | None = None
    """auto: the chosen layout's predicted s/step, the sync run's and the alternatives'."""


def _laid_out(config: RunConfig, generators: int, trainer: int, generator: int, staleness: int) -> RunConfig:
    workers = config.workers.model_copy(
        update={
            "num_generators": generators,
            "trainer_threads": trainer,
            "generator_threads": generator,
        }
    )
    staleness_section = config.staleness.model_copy(update={"max_staleness": staleness})
    return config.model_copy(update={"workers": workers, "staleness": staleness_section})


def _plan(
    config: RunConfig,
    kind: str,
    generators: int,
    trainer: int,
    generator: int,
    staleness: int,
    prediction: dict[str, Any] | None = None,
) -> Plan:
    laid = _laid_out(config, generators, trainer, generator, staleness)
    cores = config.workers.num_cores or usable_cores()
    usable = sorted(os.sched_getaffinity(0))[:cores]
    pins = {}
    if kind == "split" and config.workers.pin_cores:
        pins = pin_cores(usable, trainer, generator, generators)
    overrides = {
        "LLAMARL__WORKERS__LAYOUT": kind,
        "LLAMARL__WORKERS__NUM_GENERATORS": str(generators),
        "LLAMARL__STALENESS__MAX_STALENESS": str(staleness),
    }
    return Plan(laid, CoreSplit(trainer, generator, None, pins), kind, overrides, prediction)


def colocated(config: RunConfig) -> Plan:
    cores = config.workers.num_cores or usable_cores()
    return _plan(config, "colocated", 1, cores, cores, 0)


def one_process(config: RunConfig, prediction: dict[str, Any] | None = None) -> Plan:
    cores = config.workers.num_cores or usable_cores()
    return replace(_plan(config, "one_process", 1, cores, cores, 0, prediction), overrides={})


def shares_the_trainers_weights(config: RunConfig) -> bool:
    """Whether one_process can run `config`: one trainer process, generating on its device and
    dtype (`llamarl.launch.local.check_devices` says why not)."""
    gen, trainer = config.generation, config.trainer
    return trainer.ranks == 1 and (gen.device, gen.dtype) == (trainer.device, trainer.dtype)


def split(config: RunConfig) -> Plan:
    threads = plan_threads(config)
    workers = config.workers
    plan = _plan(
        config,
        "split",
        workers.num_generators,
        threads.trainer_threads,
        threads.generator_threads,
        config.staleness.max_staleness,
    )
    return Plan(plan.config, threads, "split", plan.overrides)


def profiled(config_path: str) -> dict[str, Any]:
    """`llamarl bench profile CONFIG`'s JSON, from a process of its own (the model it loads is
    gone when it ends; the config's overrides travel in the environment)."""
    command = llamarl_command("bench", "profile", config_path)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(
            f"layout auto: profiling the config failed ({last}); set "
            "workers.layout: split (or colocated) to start without a profile"
        )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _describe(row: dict[str, Any]) -> str:
    if row.get("one_process"):
        return f"one_process ({row['trainer_threads']} threads, every role in turn)"
    if row["colocated"]:
        return f"colocated ({row['trainer_threads']} threads each, in turn)"
    return (
        f"{row['num_generators']} generator(s) x {row['generator_threads']} thread(s), "
        f"trainer {row['trainer_threads']} thread(s), max_staleness {row['max_staleness']}"
    )


def _print_choice(best: dict[str, Any], sync_s: float, others: list[dict[str, Any]]) -> None:
    print(
        f"layout auto: best {_describe(best)}: predicted {best['s_per_step']:.3f} s/step (lock-step sync {sync_s:.3f})",
        file=sys.stderr,
    )
    for row in others:
        print(f"  alternative: {_describe(row)}: {row['s_per_step']:.3f} s/step", file=sys.stderr)


def auto(config: RunConfig, config_path: str, launcher: str = "local") -> Plan:
    """The fastest predicted layout for `config` on this machine (see the module docstring)."""
    from llamarl.sim.calibrate import calibrated
    from llamarl.sim.costs import Costs
    from llamarl.sim.predict import layout_of, lengths_of, sweep

    workers = config.workers
    explicit = workers.model_fields_set & {"num_generators", "trainer_threads", "generator_threads"}
    if {"trainer_threads", "generator_threads"} <= explicit:
        return split(config)
    print(
        f"layout auto: profiling {config_path} on this machine (cached after the first run)",
        file=sys.stderr,
        flush=True,
    )
    measured = profiled(config_path)
    costs = Costs.load(Path(measured["profile"]))
    cores = workers.num_cores or usable_cores()
    lengths = lengths_of(config, None, 0.0, costs.completion_lengths)
    costs, scales = calibrated(costs, layout_of(config, cores, costs), lengths, SIMULATED_STEPS)
    result = sweep(
        layout_of(config, cores, costs),
        costs,
        lengths,
        SIMULATED_STEPS,
        cores,
        max_staleness=config.staleness.max_staleness,
    )
    rows = [
        r for r in result["layouts"] if all(r[name] == getattr(workers, name) for name in explicit) or r["colocated"]
    ]
    sync_s = result["sync_s_per_step"]
    if launcher == "local" and shares_the_trainers_weights(config):  # the lock-step loop, in turn
        turns = next(r for r in rows if r["colocated"])
        rows = [r for r in rows if not r["colocated"]]
        measured_s = costs.turns_s_per_step  # run for real by the profile; 0 in older ones
        turns_s = round(measured_s, 4) if measured_s > 0 else sync_s
        turns |= {"one_process": True, "colocated": False, "s_per_step": turns_s, "measured": measured_s > 0}
        rows.append(turns)
        rows.sort(key=lambda r: r["s_per_step"])
    best = choose(rows, margin(costs, SPLIT_FLOOR))
    others = [r for r in rows if r is not best][:SHOWN]
    prediction = {
        "chosen": best,
        "sync_s_per_step": sync_s,
        "alternatives": others,
        "margin": margin(costs, SPLIT_FLOOR),
        "turns_s_per_step": costs.turns_s_per_step,
        "calibration": scales,
        "profile": measured["profile"],
        "profile_cached": measured["cached"],
        "profile_s": measured["seconds"],
    }
    _print_choice(best, sync_s, others)
    if best.get("one_process"):
        return one_process(config, prediction)
    kind = "colocated" if best["colocated"] else "split"
    return _plan(
        config,
        kind,
        best["num_generators"],
        best["trainer_threads"],
        best["generator_threads"],
        best["max_staleness"],
        prediction,
    )


def margin(costs: Costs, floor: float) -> float:
    """How much faster than taking turns a split must be predicted to start: the profile's own
    spread (the largest coefficient of variation of its repeated probes), at least `floor`."""
    return round(max([floor, *costs.jitter_cv.values()]), 4)


def choose(rows: list[dict[str, Any]], margin: float) -> dict[str, Any]:
    """Taking turns in one process where no split is predicted faster by more than `margin`,
    else the cheapest of the rows within `margin` of the fastest (`llamarl.sim.predict.recommend`)."""
    from llamarl.sim.predict import recommend

    turns = [r for r in rows if r.get("one_process")]
    splits = [r for r in rows if not r.get("one_process")]
    if turns and (not splits or min(r["s_per_step"] for r in splits) >= turns[0]["s_per_step"] * (1 - margin)):
        return turns[0]
    return recommend(splits, margin)


def plan_layout(config: RunConfig, config_path: str, launcher: str = "local") -> Plan:
    """The layout `llamarl run` starts (under Ray, unpinned: Ray places the roles, not this
    host); written to RUN_DIR/layout.json."""
    layout = config.workers.layout
    if layout == "auto":
        plan = auto(config, config_path, launcher)
    else:
        plan = {"split": split, "colocated": colocated, "one_process": one_process}[layout](config)
    if launcher == "ray":
        plan = replace(plan, split=replace(plan.split, pins={}))
    record = {
        "layout": layout,
        "kind": plan.kind,
        "num_generators": plan.config.workers.num_generators,
        "trainer_threads": plan.split.trainer_threads,
        "generator_threads": plan.split.generator_threads,
        "max_staleness": plan.config.staleness.max_staleness,
        "prediction": plan.prediction,
    }
    (Path(config.run_dir) / "layout.json").write_text(json.dumps(record, indent=2) + "\n")
    return plan
