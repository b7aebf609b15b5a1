"""Rolling the trainer's JSON-lines logs (trained.jsonl, metrics.jsonl) back to a checkpoint.

Both are appended once a step. After a crash, the lines of steps past the checkpoint the trainer
resumes from describe updates its model no longer has: `rewind` keeps the lines up to that step,
rewrites the file atomically and returns the records it removed. A line torn by a kill mid-write
is dropped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def rewind(path: Path, step: int) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    kept: list[str] = []
    removed: list[dict[str, Any]] = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if int(record.get("step", 0)) <= step:
            kept.append(line + "\n")
        else:
            removed.append(record)
    temp = path.with_name(path.name + ".tmp")
    temp.write_text("".join(kept))
    os.replace(temp, path)
    return removed
