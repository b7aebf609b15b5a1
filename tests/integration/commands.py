"""The command line a user types (`llamarl`, run as this interpreter's `workers.cli`) and the
smallest model a test's config names."""

from __future__ import annotations

import sys

LLAMARL = [sys.executable, "-m", "workers.cli"]
TINY_MODEL = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32}
