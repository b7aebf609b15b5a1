"""The README's config reference lists every config field (regenerate with
`python scripts/config_reference.py` when a field changes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_config_reference_is_current() -> None:
    table = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "config_reference.py")],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    readme = (REPO / "README.md").read_text()
    missing = [row for row in table.splitlines() if row not in readme]
    assert missing == []
