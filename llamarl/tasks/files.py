"""A user's own data as a prompt set: a local file or save_to_disk directory read with Hugging
Face `datasets` (`llamarl.tasks.sources`), each row made an example when it is asked for
(`llamarl.tasks.rows`), so a file of any size stays memory-mapped Arrow.

Which rows are held out, and the training order, come from the config and the run's seed
alone, so every process (generators, reward workers, trainer) that builds the set maps a ticket
index to the same row:
- held-out rows are a split (`task.eval_split`), another file (`task.eval_path`), or the first
  `eval_fraction` of the rows (or `num_eval` of them) in the shuffled order; never trained on;
- the training rows are the rest, in an order shuffled by the seed (`task.shuffle`, the
  default; otherwise file order), cycled through by ticket index.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from llamarl.config import TaskConfig
from llamarl.tasks.base import DataError, Example
from llamarl.tasks.rows import RowReader
from llamarl.tasks.sources import Source, open_source

if TYPE_CHECKING:
    import datasets

TRAIN_STREAM, EVAL_STREAM = 0, 1
"""Seed streams of the training file's order and of a separate held-out source's."""

LEGACY_FORMATS = {"jsonl": "json", "parquet": "parquet"}
"""The kinds that are kind file with a format."""

Order = range | np.ndarray
"""Row positions in the order they are used (a range: file order)."""


def row_order(num_rows: int, seed: int, shuffle: bool, stream: int) -> Order:
    """Row positions in the order they are used: a permutation seeded by (seed, stream), or
    file order."""
    if not shuffle:
        return range(num_rows)
    return np.random.default_rng([seed, stream]).permutation(num_rows)


@dataclass(frozen=True)
class FilePromptSet:
    reader: RowReader
    train_rows: datasets.Dataset
    train_order: Order
    """Positions in train_rows, in training order: ticket index i is row train_order[i % n]."""
    eval_rows: datasets.Dataset
    eval_order: Order
    """Positions in eval_rows of the held-out prompts evaluated (at most num_eval)."""

    @classmethod
    def load(cls, task: TaskConfig, seed: int) -> FilePromptSet:
        """The task's data, every row checked; DataError naming the field, the file and the
        row of the first problem."""
        # TaskConfig refuses a data kind without a path.
        assert task.path is not None
        reader = RowReader.of(task)
        fmt = LEGACY_FORMATS.get(task.kind, task.format)
        rows, source = open_source(Source("task.path", task.path, task.split), fmt)
        reader.check(rows, source)
        order = row_order(len(rows), seed, task.shuffle, TRAIN_STREAM)
        if task.eval_path is None and task.eval_split is None:
            num_held = task.num_eval
            if task.eval_fraction is not None:
                num_held = max(1, round(task.eval_fraction * len(rows)))
            if num_held >= len(rows):
                raise source.error(f"{len(rows)} rows leave none for training after {num_held} held out")
            held = order[:num_held][: task.num_eval]
            return cls(reader, rows, order[num_held:], rows, held)
        held_rows, held_source = _held_out_source(task, fmt)
        reader.check(held_rows, held_source)
        held = row_order(len(held_rows), seed, task.shuffle, EVAL_STREAM)[: task.num_eval]
        return cls(reader, rows, order, held_rows, held)

    def train_item(self, index: int) -> Example:
        position = self.train_order[index % len(self.train_order)]
        return self.reader.example(index, self.train_rows[int(position)])

    def eval_items(self) -> list[Example]:
        return [self.reader.example(i, self.eval_rows[int(position)]) for i, position in enumerate(self.eval_order)]


def _held_out_source(task: TaskConfig, fmt: str | None) -> tuple[datasets.Dataset, Source]:
    """The rows of eval_path, or of the eval_split of eval_path's (or path's) DatasetDict."""
    path = task.eval_path if task.eval_path is not None else task.path
    assert path is not None
    field = "task.eval_path" if task.eval_path is not None else "task.path"
    rows, source = open_source(Source(field, path, task.eval_split), fmt)
    if task.eval_split is not None and source.split is None:
        raise DataError(
            f"task.eval_split {task.eval_split}: {field} {path} has no splits (it is not a DatasetDict directory)"
        )
    return rows, source


def read_examples(path: str, task: TaskConfig, field: str, limit: int | None = None) -> list[Example]:
    """The first `limit` rows (all: None) of another data file, such as an evaluation set's, in
    file order, read like the task's rows (its fields, template and chat settings); DataError
    naming `field`, the file and the row of the first problem."""
    reader = RowReader.of(task)
    rows, source = open_source(Source(field, path), LEGACY_FORMATS.get(task.kind, task.format))
    reader.check(rows, source)
    count = len(rows) if limit is None else min(limit, len(rows))
    return [reader.example(i, rows[i]) for i in range(count)]
