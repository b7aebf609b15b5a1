"""`llamarl sft CONFIG --out DIR`: just the supervised warm start, written as a Hugging Face model
directory."""

from __future__ import annotations

import argparse
from pathlib import Path

from llamarl.commands.base import OVERRIDES_HELP, Subparsers
from llamarl.config import load_config


def register(sub: Subparsers) -> None:
    sft = sub.add_parser("sft", help="supervised warm-start; writes a transformers checkpoint")
    sft.add_argument("config", help="run config YAML (trainer.sft_* fields)")
    sft.add_argument("overrides", nargs="*", help=OVERRIDES_HELP)
    sft.add_argument("--out", help="checkpoint directory (default RUN_DIR/sft)")
    sft.set_defaults(func=_sft)


def _sft(args: argparse.Namespace) -> int:
    from llamarl.engine.model import save_policy
    from llamarl.tasks import make_prompt_set
    from llamarl.training.sft import starting_policy

    config = load_config(args.config)
    out = Path(args.out or Path(config.run_dir) / "sft")
    policy = starting_policy(config, make_prompt_set(config.task, config.seed))
    save_policy(policy, out)
    print(out)
    return 0
