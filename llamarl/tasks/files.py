"""Prompt files: JSONL (one object a line) or Parquet, with configurable field names.

The first `num_eval` rows are held out for evaluation; training cycles through the rest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from llamarl.tasks.base import Example


def _read_rows(path: Path, kind: str) -> list[dict]:
    if kind == "jsonl":
        rows = []
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{number}: not JSON ({err.msg})") from None
        return rows
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


@dataclass(frozen=True)
class FilePromptSet:
    train: list[tuple[str, str]]
    held_out: list[tuple[str, str]]

    @classmethod
    def load(
        cls, path: str, kind: str, prompt_field: str, answer_field: str, num_eval: int
    ) -> FilePromptSet:
        rows = _read_rows(Path(path), kind)
        pairs = []
        for number, row in enumerate(rows, start=1):
            if prompt_field not in row or answer_field not in row:
                raise ValueError(f"{path}: row {number} lacks {prompt_field!r} or {answer_field!r}")
            pairs.append((str(row[prompt_field]), str(row[answer_field])))
        if len(pairs) <= num_eval:
            raise ValueError(
                f"{path}: {len(pairs)} rows leave none for training after {num_eval} held out"
            )
        return cls(train=pairs[num_eval:], held_out=pairs[:num_eval])

    def train_item(self, index: int) -> Example:
        prompt, answer = self.train[index % len(self.train)]
        return Example(index, prompt, answer)

    def eval_items(self) -> list[Example]:
        return [Example(i, p, a) for i, (p, a) in enumerate(self.held_out)]
