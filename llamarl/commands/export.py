"""`llamarl export RUN_DIR OUT`: a run's model as a standalone Hugging Face model directory."""

from __future__ import annotations

import argparse
from pathlib import Path

from llamarl.commands.base import Subparsers


def register(sub: Subparsers) -> None:
    exported = sub.add_parser("export", help="a run's model as a standalone HF model directory")
    exported.add_argument("run_dir", help="the run directory (its final model or checkpoint)")
    exported.add_argument("out", help="model directory to write (new or empty)")
    exported.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    from llamarl.training.export import export

    source = export(Path(args.run_dir), Path(args.out))
    print(f"wrote {args.out} (from {source})")
    return 0
