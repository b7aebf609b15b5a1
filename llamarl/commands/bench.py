"""`llamarl bench ...`: each benchmark's subcommand and the function that runs it (the benchmark
itself is imported only then). Each ends with one JSON line on stdout (also written to --out)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from llamarl.commands.base import Subparsers


def register(sub: Subparsers) -> None:
    bench = sub.add_parser("bench", help="benchmarks (JSON out); not tests")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    avs = bench_sub.add_parser("async-vs-sync", help="same config, both modes, side by side")
    avs.add_argument("--config", default="configs/tiny.yaml")
    avs.add_argument("--seeds", default="0,1,2", help="one interleaved sync/async pair per seed")
    avs.add_argument("--target", type=float, default=0.75, help="held-out accuracy to time")
    avs.add_argument("--work-dir", default="runs/bench")
    avs.add_argument("--json", action="store_true", help="accepted; the last line is JSON anyway")
    avs.add_argument("--out", help="also write the JSON here")
    avs.set_defaults(func=async_vs_sync)
    sync = bench_sub.add_parser("weight-sync", help="transports against memcpy and raw gloo")
    sync.add_argument("--sizes-mb", default="4,538", help="weight sizes (538 MB: a 135M model)")
    sync.add_argument("--generators", default="1,2,4", help="generator processes pulling at once")
    sync.add_argument("--repeats", type=int, default=5)
    sync.add_argument("--bucket-mb", type=float, default=16.0)
    sync.add_argument("--trainer-ranks", default="1,2", help="data-parallel trainer ranks")
    sync.add_argument(
        "--generator-device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where the generators' weights live (cuda: against a raw host-to-GPU copy)",
    )
    sync.add_argument(
        "--across-hosts",
        action="store_true",
        help="trainer and generators on two simulated hosts (network namespaces, root)",
    )
    sync.add_argument("--out", help="also write the JSON here")
    sync.set_defaults(func=weight_sync)
    _register_others(bench_sub)
    _register_engines(bench_sub)


def _register_others(bench_sub: Subparsers) -> None:
    bus = bench_sub.add_parser("bus", help="messages through the broker against raw pyzmq")
    bus.add_argument("--messages", type=int, default=100_000)
    bus.add_argument("--repeats", type=int, default=3)
    bus.add_argument("--credit", type=int, default=100, help="consumer credit (work pattern)")
    bus.add_argument("--out", help="also write the JSON here")
    bus.set_defaults(func=bus_bench)
    resumed = bench_sub.add_parser("resume", help="stale drops after a trainer crash and resume")
    resumed.add_argument("--config", default="configs/tiny.yaml")
    resumed.add_argument("--seeds", default="0,1,2", help="one interleaved pair per seed")
    resumed.add_argument("--steps", type=int, default=200, help="RL steps of each run")
    resumed.add_argument("--kill-at", type=int, default=130, help="SIGKILL the trainer at this step")
    resumed.add_argument("--work-dir", default="runs/bench-resume")
    resumed.add_argument("--out", help="also write the JSON here")
    resumed.set_defaults(func=resume)
    profiled = bench_sub.add_parser("profile", help="per-role costs on this machine, for sim")
    profiled.add_argument("config", help="run config YAML")
    profiled.add_argument("--out", help="also copy the profile here (it is cached either way)")
    profiled.add_argument("--fresh", action="store_true", help="measure again, not the cache")
    profiled.set_defaults(func=profile)
    check = bench_sub.add_parser("sim-check", help="sim predictions against measured runs")
    check.add_argument("--config", default="configs/tiny.yaml")
    check.add_argument("--profile", required=True, help="from `llamarl bench profile`")
    check.add_argument("--generators", default="1,2,3", help="the layouts: generators each")
    check.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the layouts")
    check.add_argument("--steps", type=int, default=120, help="RL steps of each measured run")
    check.add_argument("--work-dir", default="runs/sim-check")
    check.add_argument("--out", help="also write the JSON here")
    check.set_defaults(func=sim_check)
    peaks = bench_sub.add_parser("memory", help="trainer ranks' peak memory against the estimate")
    peaks.add_argument("--sizes", default="0.1b,0.5b,0.7b,1b", help="0.1b, 0.5b, 0.7b, 1b")
    peaks.add_argument(
        "--configs",
        default="ddp,fsdp,fsdp-rs,fsdp-ac,lora",
        help="ddp, fsdp, fsdp-rs (reduced each micro-batch), fsdp-ac (2 ranks each), lora (1 rank)",
    )
    peaks.add_argument("--steps", type=int, default=2, help="steps per row (the first untimed)")
    peaks.add_argument("--out", help="also write the JSON here")
    peaks.set_defaults(func=memory_bench)
    presets = bench_sub.add_parser("recipes", help="the demo with each recipe, seeds, both modes")
    presets.add_argument("--config", default="configs/tiny.yaml")
    presets.add_argument(
        "--recipes", default="default,dapo,gspo,dr_grpo", help="default (the config as it is) and recipe names"
    )
    presets.add_argument("--seeds", default="0,1,2")
    presets.add_argument("--modes", default="sync,async")
    presets.add_argument("--target", type=float, default=0.75, help="held-out accuracy to time")
    presets.add_argument("--work-dir", default="runs/bench-recipes")
    presets.add_argument("--out", help="also write the JSON here")
    presets.set_defaults(func=recipes_bench)
    adapters = bench_sub.add_parser("adapters", help="LoRA's cost to decoding: peft layers/merged")
    adapters.add_argument("--config", default="configs/smollm2_lora.yaml")
    adapters.add_argument("--pairs", type=int, default=3, help="interleaved plain/adapters pairs")
    adapters.add_argument("--threads", type=int, default=1, help="a generator's threads")
    adapters.add_argument("--prompts", type=int, default=2, help="prompts a batch")
    adapters.add_argument("--out", help="also write the JSON here")
    adapters.set_defaults(func=adapters_bench)
    batching = bench_sub.add_parser("batching", help="generator tokens/s: static vs continuous")
    batching.add_argument("config", help="run config YAML")
    batching.add_argument("--pairs", type=int, default=3, help="interleaved static/continuous")
    batching.add_argument("--threads", type=int, default=1, help="a generator's threads")
    batching.add_argument("--batches", type=int, default=4, help="prompts_per_batch batches")
    batching.add_argument("--out", help="also write the JSON here")
    batching.set_defaults(func=batching_bench)
    grid = bench_sub.add_parser("grid", help="default run vs sync on a grid of shapes")
    grid.add_argument(
        "--shapes",
        default="demo,generation_heavy,train_heavy,variable_length,smollm2_train_heavy,smollm2_generation_heavy",
    )
    grid.add_argument("--pairs", type=int, default=3, help="interleaved rounds per shape")
    grid.add_argument("--work-dir", default="runs/bench-grid")
    grid.add_argument("--out", help="also write the JSON here")
    grid.set_defaults(func=grid_bench)
    sandbox = bench_sub.add_parser("sandbox", help="seconds per Python tool call, start to result")
    sandbox.add_argument("--calls", type=int, default=30, help="calls, each timed")
    sandbox.add_argument("--out", help="also write the JSON here")
    sandbox.set_defaults(func=sandbox_bench)


def _register_engines(bench_sub: Subparsers) -> None:
    engines = bench_sub.add_parser("engines", help="tokens/s: native against vLLM, both dtypes")
    engines.add_argument("--model", default="models/smollm2-135m", help="a model directory")
    engines.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the arms")
    engines.add_argument("--threads", type=int, default=2, help="each arm's threads")
    engines.add_argument(
        "--arms",
        default="native-float32,native-bfloat16,vllm-float32,vllm-bfloat16",
        help="which of native-float32, native-bfloat16, vllm-float32, vllm-bfloat16",
    )
    engines.add_argument("--out", help="also write the JSON here")
    engines.set_defaults(func=engines_bench)


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
    result = bench(
        sizes,
        generators,
        args.repeats,
        args.bucket_mb,
        ranks,
        args.generator_device,
        args.across_hosts,
    )
    return _emit(result, args)


def bus_bench(args: argparse.Namespace) -> int:
    from llamarl.bench.bus import bench

    return _emit(bench(args.messages, args.repeats, args.credit), args)


def resume(args: argparse.Namespace) -> int:
    from llamarl.bench.resume import bench

    seeds = [int(seed) for seed in args.seeds.split(",")]
    result = bench(Path(args.config), seeds, args.steps, args.kill_at, Path(args.work_dir))
    return _emit(result, args)


def profile(args: argparse.Namespace) -> int:
    from llamarl.bench.profile import profile as run_profile

    result = run_profile(Path(args.config), Path(args.out) if args.out else None, args.fresh)
    return _emit(result, argparse.Namespace(out=None))  # --out is the profile itself


def adapters_bench(args: argparse.Namespace) -> int:
    from llamarl.bench.adapters import bench

    return _emit(bench(Path(args.config), args.pairs, args.threads, args.prompts), args)


def sim_check(args: argparse.Namespace) -> int:
    from llamarl.bench.sim_check import bench

    generators = [int(count) for count in args.generators.split(",")]
    result = bench(Path(args.config), Path(args.profile), generators, args.rounds, args.steps, Path(args.work_dir))
    return _emit(result, args)


def recipes_bench(args: argparse.Namespace) -> int:
    from llamarl.bench.recipes import bench

    seeds = [int(seed) for seed in args.seeds.split(",")]
    return _emit(
        bench(
            Path(args.config), args.recipes.split(","), seeds, args.modes.split(","), args.target, Path(args.work_dir)
        ),
        args,
    )


def memory_bench(args: argparse.Namespace) -> int:
    from llamarl.bench.memory import bench

    return _emit(bench(args.sizes.split(","), args.configs.split(","), args.steps), args)


def batching_bench(args: argparse.Namespace) -> int:
    from llamarl.bench.batching import bench

    return _emit(bench(Path(args.config), args.pairs, args.threads, args.batches), args)


def grid_bench(args: argparse.Namespace) -> int:
    from llamarl.bench.grid import SHAPES, bench

    names = args.shapes.split(",")
    unknown = [name for name in names if name not in SHAPES]
    if unknown:
        from llamarl.errors import ConfigError

        raise ConfigError(f"--shapes: unknown {', '.join(unknown)}; choose from {', '.join(SHAPES)}")
    return _emit(bench(names, args.pairs, Path(args.work_dir), Path(args.out) if args.out else None), args)


def sandbox_bench(args: argparse.Namespace) -> int:
    from llamarl.bench.sandbox import bench

    return _emit(bench(args.calls), args)


def engines_bench(args: argparse.Namespace) -> int:
    from llamarl.bench.engines import bench

    return _emit(bench(args.model, args.rounds, args.threads, args.arms.split(",")), args)
