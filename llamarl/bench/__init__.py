"""`llamarl bench`: benchmarks that print measured figures and write JSON. Never tests.

- `async-vs-sync`: one config in both modes, interleaved pairs, speed-up against its bound.
- `weight-sync`: the weight transports against memcpy and raw torch.distributed send/recv, from
  a trainer of 1 and of 2 ranks to 1, 2 and 4 generators.
- `bus`: messages through the broker against raw pyzmq in the same pattern.
- `resume`: stale drops and redone tickets of a run whose trainer is killed, against one that is
  not.
- `profile`: per-role costs on this machine, the input of `llamarl sim`.
- `sim-check`: `llamarl sim`'s predictions against measured async runs of several layouts.
Each ends with one JSON line on stdout (also written to `--out`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _emit(result: dict[str, Any], args: argparse.Namespace) -> int:
    text = json.dumps(result)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text, flush=True)
    return 0


def async_vs_sync(args: argparse.Namespace) -> int:
    from llamarl.bench.async_vs_sync import bench

    seeds = [int(seed) for seed in args.seeds.split(",")]
    return _emit(bench(Path(args.config), seeds, args.target, Path(args.work_dir)), args)


def weight_sync(args: argparse.Namespace) -> int:
    from llamarl.bench.weight_sync import bench

    sizes = [float(size) for size in args.sizes_mb.split(",")]
    generators = [int(count) for count in args.generators.split(",")]
    ranks = [int(count) for count in args.trainer_ranks.split(",")]
    result = bench(sizes, generators, args.repeats, args.bucket_mb, ranks, args.generator_device)
    return _emit(result, args)


def bus(args: argparse.Namespace) -> int:
    from llamarl.bench.bus import bench

    return _emit(bench(args.messages, args.repeats, args.credit), args)


def resume(args: argparse.Namespace) -> int:
    from llamarl.bench.resume import bench

    seeds = [int(seed) for seed in args.seeds.split(",")]
    result = bench(Path(args.config), seeds, args.steps, args.kill_at, Path(args.work_dir))
    return _emit(result, args)


def profile(args: argparse.Namespace) -> int:
    from llamarl.bench.profile import profile as run_profile

    result = run_profile(Path(args.config), Path(args.work_dir), Path(args.out))
    return _emit(result, argparse.Namespace(out=None))  # --out is the profile itself


def sim_check(args: argparse.Namespace) -> int:
    from llamarl.bench.sim_check import bench

    generators = [int(count) for count in args.generators.split(",")]
    result = bench(Path(args.config), Path(args.profile), generators, args.rounds, args.steps,
                   Path(args.work_dir))  # fmt: skip
    return _emit(result, args)
