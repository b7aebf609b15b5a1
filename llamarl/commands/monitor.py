"""`llamarl monitor`: watch a run from its Redis (the view itself is `llamarl.observe.monitor`)."""

from __future__ import annotations

import argparse

from llamarl.commands.base import OVERRIDES_HELP, Subparsers


def register(sub: Subparsers) -> None:
    monitor = sub.add_parser("monitor", help="watch a run from its Redis: progress, workers")
    monitor.add_argument("--config", help="run config (redis.url, run_id; env overrides apply)")
    monitor.add_argument("overrides", nargs="*", help=OVERRIDES_HELP)
    monitor.add_argument("--interval", type=float, default=2.0, help="seconds between snapshots")
    monitor.add_argument("--once", action="store_true", help="print one snapshot and exit")
    monitor.set_defaults(func=_monitor)


def _monitor(args: argparse.Namespace) -> int:
    from llamarl.observe.monitor import main as monitor

    return monitor(args)
