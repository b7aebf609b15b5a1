"""`llamarl bench async-vs-sync`: the same config run both ways, side by side, in one go.

Runs interleave, one pair per seed (`--seeds`, default 0,1,2), so the accuracy figures cover
three seeds in each mode; the order alternates (sync then async in even pairs, async then sync in
odd ones: a machine whose speed drifts within a pair favours neither arm). Both runs of a pair start from one shared
supervised warm start (run once per seed, `llamarl sft`), train on the same prompts (ticket i is
prompt i in both) and, with fixed-length completions (`min_new_tokens`), generate and train
exactly the same number of tokens; the benchmark checks that and reports it (`equal_work`). An
async generator also decodes tokens it throws away, when it restarts a group whose oldest token
fell out of the staleness bound: they are counted (`discarded_tokens`, per run) and reported
beside `equal_work` as the extra decode work async did (`extra_decode_fraction`: discarded over
kept generated tokens).

Per run: run seconds per step (RL wall time over steps, evaluations included: what a user
waits for), seconds per RL step (the mean over steps no evaluation slowed: a trainer's
evaluation, its step and the next; a shared one, the steps from the one after the version it
evaluated to the one its result reached the trainer, and the next) and the wall seconds
evaluations cost per step (the difference); tokens per second; the time to the target held-out
accuracy (RL time less the time the trainer spent evaluating); initial and final accuracy; each
role's busy seconds per step and idle fraction (async, from the workers' own timers) or each
phase's seconds per step (sync). The target counts as reached when the mean of the last three
evaluations reaches it (one evaluation is noisy), so it should be a level the runs reach
mid-run, not in their first steps, when the async pipeline is still filling.

Per pair: the speed-up, sync run s/step / async run s/step (evaluations included: the
headline), and beside it the RL-only speed-up, sync s/step / async s/step over RL steps, with
the bound that perfect overlap would give it from the measured per-role times. Each role's time
is measured alone, at the threads the async run gives it (`llamarl.launch.cores`), in short
synchronous "solo" runs of the same work (generation and training phases timed separately,
nothing else running); perfect overlap makes an RL step as long as the slowest role, so
rl_bound = sync s/step / max(solo generation, solo training) s/step, and rl_efficiency =
RL speed-up / rl_bound: what contention between the roles, the bus, Redis and weight sync cost.
The output ends with one JSON line (medians with min and max over the pairs).

Every bench that runs `llamarl run` goes through `run_once`, which keeps a finished run's records
(summary, metrics, timers, logs) and deletes its weights (final model, adapters, checkpoints):
a bench measures time, and a grid of SmolLM2 runs would otherwise leave gigabytes behind.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from llamarl.bench.stats import median, median_time, spread
from llamarl.config import parse_config
from llamarl.config.run import read_tree
from llamarl.launch.cores import plan_threads
from llamarl.launch.supervise import llamarl_command


@dataclass(frozen=True)
class RunResult:
    summary: dict[str, Any]
    records: list[dict[str, Any]]
    timers: dict[str, dict[str, Any]]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed `llamarl` command (beside this interpreter), as a user runs it."""
    return subprocess.run(_command(*args), capture_output=True, text=True, check=False)


def _command(*args: str) -> list[str]:
    return llamarl_command("--log-format", "json", *args)


def warm_start(tree: dict[str, Any], work_dir: Path) -> dict[str, Any]:
    """The config a pair's runs use: with the supervised warm start done once, up front."""
    if not tree.get("trainer", {}).get("sft_steps") or tree.get("model", {}).get("path"):
        return tree
    start = work_dir / f"start-{tree['seed']}"
    config = work_dir / f"start-{tree['seed']}.yaml"
    config.write_text(yaml.safe_dump(tree | {"run_dir": str(start)}))
    done = _cli("sft", str(config), "--out", str(start))
    if done.returncode != 0:
        raise RuntimeError(f"warm start failed: {done.stderr[-2000:]}")
    return tree | {
        "model": tree.get("model", {}) | {"path": str(start)},
        "trainer": tree["trainer"] | {"sft_steps": 0},
    }


def profile_config(config: Path, fresh: bool = False) -> float:
    """`llamarl bench profile CONFIG` (cached, as `workers.layout: auto` reads it; `fresh`
    measures it anew); the seconds it took."""
    started = time.perf_counter()
    done = _cli("bench", "profile", str(config), *(["--fresh"] if fresh else []))
    if done.returncode != 0:
        raise RuntimeError(f"profile of {config} failed: {done.stderr[-2000:]}")
    return round(time.perf_counter() - started, 2)


def run_variant(tree: dict[str, Any], mode: str, name: str, work_dir: Path) -> subprocess.Popen[str]:
    """Start `llamarl run` of the config `tree` as run `name` under `work_dir`."""
    variant = work_dir / f"{name}.yaml"
    variant.write_text(yaml.safe_dump(tree | {"run_dir": str(work_dir / name), "run_id": name}))
    return subprocess.Popen(
        _command("run", str(variant), "--mode", mode), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def collect(run_dir: Path, stdout: str) -> RunResult:
    """A finished run's summary (its last stdout line), metrics and timers."""
    summary: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    timers = {path.stem: json.loads(path.read_text()) for path in sorted((run_dir / "timers").glob("*.json"))}
    return RunResult(summary, records, timers)


WEIGHTS = ("model", "adapter", "checkpoints")
"""What a finished run keeps in its directory that a bench does not read: its final model, its
LoRA adapters and its checkpoints."""


def drop_weights(run_dir: Path) -> None:
    """Delete a finished run's weights (WEIGHTS), keeping its records."""
    for name in WEIGHTS:
        shutil.rmtree(run_dir / name, ignore_errors=True)


def run_once(tree: dict[str, Any], mode: str, name: str, work_dir: Path) -> RunResult:
    """Run `tree` to the end as run `name`; its records, with its weights deleted."""
    proc = run_variant(tree, mode, name, work_dir)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} run {name} failed: {err[-2000:]}")
    result = collect(work_dir / name, out)
    drop_weights(work_dir / name)
    return result


def evaluation_slowed(records: list[dict[str, Any]]) -> set[int]:
    """Steps an evaluation slowed: a trainer's own (its step and the next) and a generator's
    (from the step after the version it evaluated to the step its result reached the trainer,
    and the next: meanwhile the trainer waits for that generator's groups)."""
    slowed: set[int] = set()
    for record in records:
        if "eval_s" in record:
            slowed |= {record["step"], record["step"] + 1}
        if "eval_step" in record:
            slowed |= set(range(record["eval_step"] + 1, record["step"] + 2))
    return slowed


def clean_step_s(records: list[dict[str, Any]], mode: str, warmup: int = 1) -> float:
    """Mean seconds per step over steps past the first `warmup` that no evaluation slowed
    (`evaluation_slowed`)."""
    slowed = evaluation_slowed(records)
    times = []
    for index, record in enumerate(records):
        if record["step"] in slowed or index < warmup:
            continue
        previous = records[index - 1]
        times.append(record["step_s"] if mode == "sync" else record["wall_s"] - previous["wall_s"])
    return sum(times) / len(times)


TARGET_WINDOW = 3
"""Evaluations averaged to decide that the target is reached (one noisy evaluation is not)."""


def time_to(records: list[dict[str, Any]], target: float) -> float | None:
    """RL seconds, less evaluation time, until the mean held-out accuracy of the last
    TARGET_WINDOW evaluations first reached `target`."""
    evaluating = 0.0
    recent: list[float] = []
    for record in records:
        evaluating += record.get("eval_s", 0.0)
        if "held_out_accuracy" in record:
            recent = [*recent, record["held_out_accuracy"]][-TARGET_WINDOW:]
            if sum(recent) / len(recent) >= target:
                return round(float(record["rl_s"]) - evaluating, 2)
    return None


def role_times(result: RunResult, mode: str, steps: int) -> dict[str, Any]:
    """Busy seconds per step and idle fraction of each async role; phase seconds per step of
    the sync loop."""
    if mode == "sync":
        clean = [r for r in result.records if "eval_s" not in r]
        return {
            phase: round(sum(r[f"{phase}_s"] for r in clean) / len(clean), 4)
            for phase in ("generate", "score", "train")
        }
    roles: dict[str, dict[str, float]] = {}
    for timer in result.timers.values():
        busy = timer["busy_s"] - timer.get("eval_s", 0.0)
        total = timer["busy_s"] + timer["idle_s"]
        role = roles.setdefault(timer["role"], {"busy_s": 0.0, "idle": 0.0, "count": 0, "bus_s": 0.0})
        role["busy_s"] += busy
        role["bus_s"] += timer.get("bus_s", 0.0)
        role["idle"] += 1 - timer["busy_s"] / total if total else 1.0
        role["count"] += 1
    return {
        role: {
            # Processes of one role share its work side by side.
            "busy_s_per_step": round(v["busy_s"] / steps / v["count"], 4),
            "bus_s_per_step": round(v["bus_s"] / steps / v["count"], 5),
            "idle_fraction": round(v["idle"] / v["count"], 3),
            "processes": int(v["count"]),
        }
        for role, v in roles.items()
    }


def describe(result: RunResult, mode: str, target: float) -> dict[str, Any]:
    records = result.records
    steps = len(records)
    step_s = clean_step_s(records, result.summary["mode"])  # a default run may take turns: sync's steps
    trained_tokens = sum(r["num_tokens"] for r in records)
    generated = sum(t.get("generated_tokens", 0) for t in result.timers.values())
    discarded = sum(t.get("discarded_tokens", 0) for t in result.timers.values())
    run_s_per_step = result.summary["rl_wall_s"] / steps
    return {
        "steps": steps,
        "s_per_step": round(step_s, 4),
        "run_s_per_step": round(run_s_per_step, 4),
        "eval_s_per_step": round(run_s_per_step - step_s, 4),
        "trained_tokens": int(trained_tokens),
        "generated_tokens": int(generated if mode == "async" else trained_tokens),
        "discarded_tokens": int(discarded),
        "tokens_per_s": round(trained_tokens / steps / step_s, 1),
        "initial_accuracy": result.summary["initial_accuracy"],
        "final_accuracy": result.summary["final_accuracy"],
        "s_to_target": time_to(records, target),
        "roles": role_times(result, mode, steps),
    }


SOLO_STEPS = 40


def solo_times(tree: dict[str, Any], name: str, work_dir: Path) -> dict[str, float]:
    """Generation and training seconds per step, each at the threads the async run gives its
    role, measured alone (synchronous runs of the same work, SOLO_STEPS steps)."""
    split = plan_threads(parse_config(tree))
    steps = min(SOLO_STEPS, tree["trainer"]["num_steps"])
    short = tree | {"trainer": tree["trainer"] | {"num_steps": steps, "eval_every": steps}}
    measured: dict[int, dict[str, float]] = {}
    times: dict[str, float] = {}
    for phase, threads in (("generate", split.generator_threads), ("train", split.trainer_threads)):
        if threads not in measured:
            solo = short | {"workers": tree.get("workers", {}) | {"num_cores": threads}}
            result = run_once(solo, "sync", f"{name}-solo-{threads}", work_dir)
            measured[threads] = role_times(result, "sync", steps)
        times[phase] = measured[threads][phase]
    return times


ARM_ORDER = (("sync", "async"), ("async", "sync"))
"""The order of a pair's two runs, alternating pair by pair."""


def bench(config_path: Path, seeds: list[int], target: float, work_dir: Path) -> dict[str, Any]:
    work_dir.mkdir(parents=True, exist_ok=True)
    base = read_tree(config_path)
    runs: list[dict[str, Any]] = []
    for index, seed in enumerate(seeds):
        tree = warm_start(base | {"seed": seed}, work_dir)
        pair: dict[str, Any] = {"seed": seed}
        for mode in ARM_ORDER[index % 2]:
            result = run_once(tree, mode, f"{mode}-{index}", work_dir)
            pair[mode] = describe(result, mode, target)
            print(f"pair {index} {mode}: {json.dumps(pair[mode])}", file=sys.stderr, flush=True)
        pair["solo"] = solo_times(tree, f"pair-{index}", work_dir)
        roles = pair["async"]["roles"].values()
        pair["async"]["bus_fraction"] = round(max(r["bus_s_per_step"] for r in roles) / pair["async"]["s_per_step"], 5)
        sync, asynchronous = pair["sync"], pair["async"]
        pair["speedup"] = round(sync["run_s_per_step"] / asynchronous["run_s_per_step"], 3)
        pair["rl_speedup"] = round(sync["s_per_step"] / asynchronous["s_per_step"], 3)
        pair["rl_bound"] = round(sync["s_per_step"] / max(pair["solo"].values()), 3)
        pair["rl_efficiency"] = round(pair["rl_speedup"] / pair["rl_bound"], 3)
        pair["equal_work"] = all(sync[key] == asynchronous[key] for key in ("trained_tokens", "generated_tokens"))
        kept = max(1, asynchronous["generated_tokens"])
        pair["extra_decode_fraction"] = round(asynchronous["discarded_tokens"] / kept, 5)
        runs.append(pair)
    speedups = [p["speedup"] for p in runs]
    rl_speedups = [p["rl_speedup"] for p in runs]
    sync_target = median_time([p["sync"]["s_to_target"] for p in runs])
    async_target = median_time([p["async"]["s_to_target"] for p in runs])
    return {
        "config": str(config_path),
        "pairs": runs,
        "target_accuracy": target,
        "speedup": spread(speedups),
        "speedup_median": spread(speedups)["median"],
        "speedup_min": min(speedups),
        "rl_speedup": spread(rl_speedups),
        "rl_bound": spread([p["rl_bound"] for p in runs])["median"],
        "rl_efficiency": spread([p["rl_efficiency"] for p in runs])["median"],
        "sync_eval_s_per_step": spread([p["sync"]["eval_s_per_step"] for p in runs], 4),
        "async_eval_s_per_step": spread([p["async"]["eval_s_per_step"] for p in runs], 4),
        "equal_work": all(p["equal_work"] for p in runs),
        "async_extra_decode_fraction": max(p["extra_decode_fraction"] for p in runs),
        "async_bus_fraction": max(p["async"]["bus_fraction"] for p in runs),
        "sync_s_per_step": spread([p["sync"]["s_per_step"] for p in runs], 4),
        "async_s_per_step": spread([p["async"]["s_per_step"] for p in runs], 4),
        "sync_initial_accuracy": median([p["sync"]["initial_accuracy"] for p in runs]),
        "sync_final_accuracy": median([p["sync"]["final_accuracy"] for p in runs]),
        "async_final_accuracy": median([p["async"]["final_accuracy"] for p in runs]),
        "sync_s_to_target": sync_target,
        "async_s_to_target": async_target,
        "target_speedup": (round(sync_target / async_target, 3) if sync_target and async_target else None),
    }
