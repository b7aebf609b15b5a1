"""`llamarl eval CONFIG --model DIR|RUN_DIR`: evaluate a saved model, or a run's, on the config's
held-out prompts and evaluation sets, as the trainer does (the same prompts, chunks, scorers and
seeds, in the trainer's dtype), with the metrics as JSON on stdout (and in `--out`).

The model is a Hugging Face model directory, or a run directory: its final model (RUN_DIR/model)
or else its newest complete checkpoint. A finished run's final model evaluated with the run's
config gives its last held-out accuracy exactly.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llamarl.commands.base import Subparsers

if TYPE_CHECKING:
    from llamarl.config import RunConfig


def register(sub: Subparsers) -> None:
    evaluated = sub.add_parser("eval", help="evaluate a saved model or a run's on the config's sets")
    evaluated.add_argument("config", help="run config: its held-out prompts and evaluation sets")
    evaluated.add_argument(
        "--model",
        required=True,
        help="a model directory, or a run directory (final or newest checkpoint)",
    )
    evaluated.add_argument("--out", help="also write the JSON result to this file")
    evaluated.add_argument("overrides", nargs="*", help="section.field=value overrides")
    evaluated.set_defaults(func=_evaluate)


def _evaluate(args: argparse.Namespace) -> int:
    from llamarl.config import load_config
    from llamarl.observe.log import configure_logging

    configure_logging("eval", "eval", args.log_format)  # logs on stderr: stdout is the JSON
    config = load_config(args.config)
    result = evaluate_model(config, Path(args.model))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


def evaluate_model(config: RunConfig, source: Path) -> dict[str, Any]:
    """The evaluation of the model at `source` (see the module docstring) under `config`."""
    from llamarl.engine.model import place, use_chat_template
    from llamarl.roles.build import held_out_evaluation
    from llamarl.training.eval_sets import set_metrics

    started = time.monotonic()
    policy, used = _load(source)
    use_chat_template(policy, config.model)
    place(policy, config.trainer.device, config.trainer.dtype)
    evaluation = held_out_evaluation(config, policy)()
    return {
        "model": str(used),
        "held_out_accuracy": evaluation.accuracy,
        "held_out_prompts": evaluation.num_prompts,
        **set_metrics(evaluation.sets),
        "eval_s": round(time.monotonic() - started, 2),
    }


def _load(source: Path) -> tuple[Any, Path]:
    """(policy, the directory it came from)."""
    from llamarl.engine.model import load_policy
    from llamarl.errors import ConfigError
    from llamarl.training.export import FINAL_MODEL, checkpoint_model, newest_checkpoint

    if (source / "config.json").is_file():
        return load_policy(source), source
    if (source / FINAL_MODEL / "config.json").is_file():
        return load_policy(source / FINAL_MODEL), source / FINAL_MODEL
    if (source / "checkpoints").is_dir():
        checkpoint = newest_checkpoint(source)
        return checkpoint_model(checkpoint), checkpoint
    raise ConfigError(
        f"--model {source}: neither a model directory (config.json) nor a run directory "
        "(model/ or checkpoints/); give one"
    )
