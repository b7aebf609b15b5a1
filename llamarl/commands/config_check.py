"""`llamarl config check FILE`: validate a run config and print it resolved (defaults, the
environment and overrides applied); the user's own loss and advantage functions, when it names
them, are imported and called once on a synthetic input (`llamarl.algorithms.user`)."""

from __future__ import annotations

import argparse
import sys

from llamarl.commands.base import OVERRIDES_HELP, Subparsers
from llamarl.config import dump_config, load_config
from llamarl.config.learning import is_user_function


def register(sub: Subparsers) -> None:
    config = sub.add_parser("config", help="config tools")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    check = config_sub.add_parser("check", help="validate FILE and print the resolved config")
    check.add_argument("file")
    check.add_argument("overrides", nargs="*", help=OVERRIDES_HELP)
    check.set_defaults(func=_config_check)


def _config_check(args: argparse.Namespace) -> int:
    config = load_config(args.file)
    algorithm = config.algorithm
    if is_user_function(algorithm.loss) or is_user_function(algorithm.advantage):
        # Imported only here: probing the user's functions needs torch, checking a config not.
        from llamarl.algorithms.user import check_user_functions

        check_user_functions(algorithm)
    sys.stdout.write(dump_config(config))
    return 0
