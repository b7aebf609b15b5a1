"""`llamarl bench profile CONFIG --out FILE`: what each role's work costs on this machine, for
`llamarl sim`.

For each thread count from 1 to the machine's cores: a generator's batch and a sync step's
batch (or its double), each timed in a process of its own as a generator decodes it (EOS
banned, every completion max_new_tokens long), give the generation cost per decode position (a
fixed part and a part per sequence in the batch); two short sync runs of the config, as
configured and with twice the prompts per step, give the training cost (a fixed part and a part
per token). The sync run's generation against the generator's at the same batch gives the sync
process's own slowdown (it also holds the trainer), charged to sync predictions. Scoring comes
from the 1-thread run; staging and pulling a version of the model's size over the shared-memory
transport from the weight-sync benchmark's rounds. The
co-run slowdown: a generation batch repeated on one core beside a training step repeated on
another, against each alone; and, with one process more than there are cores, how much slower
than a fair share of the cores they run (switching and caches). The step-to-step spread of each phase in the 1-thread run (its
coefficient of variation) lets the simulator vary durations as the machine does. Nothing here is fitted to async runs: `llamarl bench sim-check`
compares the simulator with those.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import yaml

from llamarl.bench.async_vs_sync import RunResult, run_once
from llamarl.bench.decode_probe import batch_seconds
from llamarl.bench.weight_sync import transport_rounds
from llamarl.config import parse_config
from llamarl.config.run import read_tree
from llamarl.launch.cores import usable_cores, work_probes
from llamarl.sim.costs import Costs, ThreadCosts

PROFILE_STEPS = 12
CORUN_S = 8.0
SYNC_ROUNDS = 5


def profile_tree(base: dict[str, Any], threads: int, prompts_per_step: int) -> dict[str, Any]:
    """The config for one profile run: `prompts_per_step` prompts a step (a sync run decodes
    them as one batch), every completion max_new_tokens long, a short run with evaluation only
    at its end."""
    generation = dict(base.get("generation", {}))
    trainer = dict(base.get("trainer", {}))
    config = parse_config(base)
    generation["min_new_tokens"] = config.generation.max_new_tokens
    generation["prompts_per_batch"] = min(config.generation.prompts_per_batch, prompts_per_step)
    trainer |= {"prompts_per_step": prompts_per_step,
                "num_steps": PROFILE_STEPS, "eval_every": PROFILE_STEPS, "sft_steps": 0,
                "checkpoint_every": 0}  # fmt: skip
    task = dict(base.get("task", {})) | {"num_eval": min(config.task.num_eval, 8)}
    workers = dict(base.get("workers", {})) | {"num_cores": threads}
    return base | {"generation": generation, "trainer": trainer, "task": task, "workers": workers}


def phase_means(result: RunResult) -> dict[str, float]:
    """Mean seconds per step of each sync phase and tokens per step, and the coefficient of
    variation of generation and training from step to step, over the steps after the first
    that did not evaluate."""
    kept = [r for r in result.records[1:] if "eval_s" not in r]
    means = {key: statistics.mean(r[key] for r in kept)
             for key in ("generate_s", "score_s", "train_s", "num_tokens")}  # fmt: skip
    for key in ("generate_s", "train_s"):
        means[f"{key}_cv"] = statistics.stdev(r[key] for r in kept) / means[key]
    return means


def line(x: tuple[float, float], y: tuple[float, float]) -> tuple[float, float]:
    """(intercept, slope) through two points; where the intercept would be negative (the cost
    grows faster than linearly), the proportional line through the first point, the
    configured size, which the simulator then reproduces exactly."""
    slope = (y[1] - y[0]) / (x[1] - x[0])
    intercept = y[0] - slope * x[0]
    if intercept < 0 or slope < 0:
        return 0.0, y[0] / x[0]
    return intercept, slope


def fit(small: dict[str, float], large: dict[str, float], base: dict[str, Any],
        decode: Sequence[tuple[int, float]]) -> ThreadCosts:  # fmt: skip
    """The decode cost line through two (sequences, seconds of a batch) points, and the
    training cost line through a sync run and its double."""
    length = parse_config(base).generation.max_new_tokens
    (x0, y0), (x1, y1) = decode
    decode_s, per_seq = line((x0, x1), (y0 / length, y1 / length))
    train_s, per_token = line(
        (small["num_tokens"], large["num_tokens"]), (small["train_s"], large["train_s"])
    )
    return ThreadCosts(decode_s=decode_s, decode_s_per_seq=per_seq, train_s=train_s,
                       train_s_per_token=per_token)  # fmt: skip


def _probe_loop(tree: dict[str, Any], label: str, core: int | None, ready: Any, go: Any,
                out: Any) -> None:  # fmt: skip
    """Repeat one role's unit of work (a generation batch or a training step) for CORUN_S
    seconds once told to go, on `core` (None: wherever the OS puts it); report the median
    seconds of one."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    generate, train = work_probes(parse_config(tree))
    work = generate if label.startswith("generate") else train
    work()  # warm
    ready.put(label)
    go.wait()
    times: list[float] = []
    ends = time.perf_counter() + CORUN_S
    while time.perf_counter() < ends:
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    out.put((label, statistics.median(times)))


def probe_times(tree: dict[str, Any], labels: list[str], pin: bool = True) -> dict[str, float]:
    """Median seconds of each probe's unit of work (label "generate..." or "train..."), all at
    once: on cores of their own (`pin`), or left to the OS scheduler."""
    ctx = mp.get_context("spawn")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    cores = sorted(os.sched_getaffinity(0))
    procs = [ctx.Process(target=_probe_loop,
                         args=(tree, label, cores[i] if pin else None, ready, go, out))
             for i, label in enumerate(labels)]  # fmt: skip
    for proc in procs:
        proc.start()
    for _ in labels:
        ready.get(timeout=600)
    go.set()
    times = dict(out.get(timeout=600) for _ in labels)
    for proc in procs:
        proc.join(60)
    return times


def corun(tree: dict[str, Any]) -> tuple[dict[str, float], float, dict[str, Any]]:
    """Each role's time beside the other (generation on one core, training on another) / its
    time alone; and the oversubscription slowdown: with one process more than there are cores
    (a trainer and `cores` generators, left to the scheduler), how much slower each runs than
    a fair share of the cores would make it, on average; and the probes' seconds."""
    alone = {role: probe_times(tree, [role])[role] for role in ("generate", "train")}
    together = probe_times(tree, ["generate", "train"])
    slowdown = {role: max(1.0, together[role] / alone[role]) for role in alone}
    cores = len(os.sched_getaffinity(0))
    crowd = probe_times(tree, ["train"] + [f"generate-{i}" for i in range(cores)], pin=False)
    fair = (cores + 1) / cores
    ratios = [crowd[label] / alone[label.split("-")[0]] / (fair * slowdown[label.split("-")[0]])
              for label in crowd]  # fmt: skip
    probes = {"alone": alone, "side_by_side": together, "crowded": crowd}
    return slowdown, max(1.0, statistics.mean(ratios)), probes


def model_bytes(tree: dict[str, Any]) -> int:
    from llamarl.engine.model import make_policy

    config = parse_config(tree)
    policy = make_policy(config.model, config.seed)
    return sum(p.numel() * p.element_size() for p in policy.model.parameters())


def decode_batches(per_batch: int, per_step: int) -> tuple[int, int]:
    """Prompts in the two timed batches: a generator's and a sync step's (or its double)."""
    return (per_batch, per_step) if per_batch < per_step else (per_step, 2 * per_step)


def profile(config_path: Path, work_dir: Path, out: Path) -> dict[str, Any]:
    work_dir.mkdir(parents=True, exist_ok=True)
    base = read_tree(config_path)
    cores = usable_cores()
    threads: dict[int, ThreadCosts] = {}
    measured: dict[str, Any] = {}
    config = parse_config(base)
    per_step, samples = config.trainer.prompts_per_step, config.generation.num_samples
    batches = decode_batches(config.generation.prompts_per_batch, per_step)
    decoded: dict[str, Any] = {}
    for count in range(1, cores + 1):
        runs = {f"x{scale}": phase_means(run_once(profile_tree(base, count, per_step * scale),
                                                  "sync", f"t{count}-x{scale}", work_dir))
                for scale in (1, 2)}  # fmt: skip
        measured[str(count)] = runs
        decode = [(prompts * samples, batch_seconds(base, count, prompts)) for prompts in batches]
        decoded[str(count)] = decode
        threads[count] = fit(runs["x1"], runs["x2"], base, decode)
        print(f"profile {count} thread(s): {threads[count]}", file=sys.stderr, flush=True)
    one = measured["1"]["x1"]
    length = config.generation.max_new_tokens
    alone = threads[cores].generate_s(per_step * samples, length)
    in_sync = measured[str(cores)]["x1"]["generate_s"] / alone
    slowdown, crowded, probes = (
        corun(profile_tree(base, 1, per_step)) if cores > 1 else ({}, 1.0, {})
    )
    size = model_bytes(base)
    rounds = transport_rounds("shm", "auto", size, 1, SYNC_ROUNDS, 16.0)
    costs = Costs(
        threads=threads,
        score_s_per_group=one["score_s"] / per_step,
        stage_s=statistics.median(rounds["stage_s"]),
        pull_s=statistics.median(rounds["pull_s"]),
        prompt_tokens=one["num_tokens"] / (per_step * samples) - length,
        corun_slowdown=slowdown,
        cores=cores,
        jitter_cv={"generate": one["generate_s_cv"], "train": one["train_s_cv"]},
        oversubscribed_slowdown=crowded,
        sync_generate_slowdown=in_sync,
    )
    extra = {"config": str(config_path), "model_bytes": size, "phase_means": measured,
             "decode_batches_s": decoded,
             "probes_s": probes,
             "host": os.uname().nodename}  # fmt: skip
    costs.save(out, extra)
    return {"profile": str(out), **extra, "costs": yaml.safe_load(out.read_text())}
