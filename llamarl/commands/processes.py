"""`llamarl run` and `llamarl worker ROLE`: the two commands that start processes. Their functions
are handed in by the entry point (`workers.cli`), so the library never reaches into `workers`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from llamarl.commands.base import OVERRIDES_HELP, Command, Subparsers
from llamarl.config.recipes import RECIPES


def register(sub: Subparsers, run_command: Command, worker_command: Command, roles: Sequence[str]) -> None:
    run = sub.add_parser("run", help="run a whole job on this machine (private Redis + broker)")
    run.add_argument("config", help="run config YAML")
    run.add_argument("overrides", nargs="*", help=OVERRIDES_HELP)
    run.add_argument(
        "--mode",
        choices=["async", "sync"],
        default="async",
        help="async: the roles laid out by workers.layout; sync: every role in this process, taking "
        "turns (workers.layout one_process). Both keep checkpoints, the ledger and --resume",
    )
    run.add_argument(
        "--recipe", choices=sorted(RECIPES), help="a preset of algorithm options under the config's own (recipe=NAME)"
    )
    run.add_argument(
        "--resume",
        action="store_true",
        help="carry on the stopped run in RUN_DIR (its Redis data and checkpoints)",
    )
    run.add_argument(
        "--launcher",
        choices=["local", "ray"],
        default="local",
        help="local: the roles as child processes; ray: each role as a Ray actor with its "
        "resources (not with one_process; pip install 'llamarl[ray]')",
    )
    run.add_argument(
        "--ray-address",
        help="the Ray cluster to join (default: auto when RAY_ADDRESS is set, else a local Ray instance of this run's)",
    )
    run.set_defaults(func=run_command)

    role = sub.add_parser("worker", help="start one role: " + ", ".join(roles))
    role.add_argument("role", choices=sorted(roles))
    role.add_argument("rest", nargs=argparse.REMAINDER, help="the role's own options (--help)")
    role.set_defaults(func=worker_command)
