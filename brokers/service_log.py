"""What a service that failed to start wrote: the text of its log since it was started, and the
one line worth showing a user (its own error, without Redis's pid and timestamp prefix)."""

from __future__ import annotations

import re
from pathlib import Path

_REDIS_PREFIX = re.compile(r"^\d+:[A-Z] .*? [#*.-] ")


def log_size(path: Path) -> int:
    """Where a service about to start will begin writing in its (appended) log."""
    return path.stat().st_size if path.exists() else 0


def written_since(path: Path, offset: int) -> str:
    if not path.exists():
        return ""
    with open(path, "rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")


def error_line(text: str, default: str) -> str:
    """The last plain-text line of `text` (JSON log records are skipped: the services print
    their error in words after them), else `default`."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line and not line.startswith("{"):
            return _REDIS_PREFIX.sub("", line)
    return default
