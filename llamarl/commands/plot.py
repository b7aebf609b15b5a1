"""`llamarl plot RUN_DIR... --out DIR`: PNG figures of runs, overlaid."""

from __future__ import annotations

import argparse
from pathlib import Path

from llamarl.commands.base import Subparsers


def register(sub: Subparsers) -> None:
    plotted = sub.add_parser("plot", help="PNG figures of runs (overlaid): learning, staleness")
    plotted.add_argument("run_dirs", nargs="+", help="run directories")
    plotted.add_argument("--out", default="plots", help="directory for the PNG files")
    plotted.set_defaults(func=_plot)


def _plot(args: argparse.Namespace) -> int:
    from llamarl.observe.plot import plot

    for path in plot([Path(d) for d in args.run_dirs], Path(args.out)):
        print(f"wrote {path}")
    return 0
