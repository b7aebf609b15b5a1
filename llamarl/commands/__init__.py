"""The `llamarl` command: one module of this package per command, each registering its own
subcommand (`register(sub)`) and importing what it runs only when it runs, and `main`, which runs
one. The two that start processes, `run` and `worker`, are handed in by the entry point
(`workers.cli`), so the library never reaches into `workers`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from llamarl.commands import (
    agent,
    bench,
    config_check,
    evaluation,
    export,
    keys,
    model,
    monitor,
    plot,
    processes,
    sft,
    sim,
)
from llamarl.commands.base import Command
from llamarl.config import apply_overrides
from llamarl.errors import ConfigError, ServiceStartError

COMMANDS = (sft, bench, sim, evaluation, export, plot, monitor, model, keys, agent, config_check)
"""The library's commands, in the order `llamarl --help` lists them after run and worker."""


def build_parser(run_command: Command, worker_command: Command, roles: Sequence[str]) -> argparse.ArgumentParser:
    """The whole command tree; `run` and `worker` start processes, `roles` are `worker`'s."""
    parser = argparse.ArgumentParser(
        prog="llamarl",
        description="Asynchronous message-bus RL for causal LMs. Roles: " + ", ".join(roles),
    )
    parser.add_argument("--log-format", choices=["auto", "console", "json"], default="auto")
    sub = parser.add_subparsers(dest="command", required=True)
    processes.register(sub, run_command, worker_command, roles)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse and run; a config mistake is one line and exit code 2. Overrides may also come
    after options (`run CONFIG --mode sync trainer.lr=1e-5`)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any("=" not in item for item in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    if getattr(args, "recipe", None):
        args.overrides = [f"recipe={args.recipe}", *args.overrides]
    try:
        apply_overrides(getattr(args, "overrides", []))
        return int(args.func(args))
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    except ServiceStartError as err:  # the service's own line and its log
        print(err, file=sys.stderr)
        return 2 if err.config_error else 1
    except KeyboardInterrupt:
        return 130
