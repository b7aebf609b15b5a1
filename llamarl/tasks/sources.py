"""Opening a user's data with Hugging Face `datasets`, from local files only: JSON lines or JSON,
Parquet and CSV files (the format from the extension, or named), and directories that
`Dataset.save_to_disk` or `DatasetDict.save_to_disk` wrote (a DatasetDict's split named).

The result is a `datasets.Dataset`: Arrow, memory-mapped from the datasets cache
(`HF_DATASETS_CACHE`, by default ~/.cache/huggingface/datasets, where a file is converted once)
or from the saved directory, so rows are read when indexed and a large file never sits in
memory. Every problem is a `DataError` naming the config field and the file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from llamarl.tasks.base import DataError

if TYPE_CHECKING:
    import datasets

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
"""A file's extension -> the `datasets` builder that reads it."""


@dataclass(frozen=True)
class Source:
    """Where rows come from, as errors name it: the config field, its path, and a split."""

    field: str
    path: str
    split: str | None = None

    def __str__(self) -> str:
        split = f" (split {self.split})" if self.split is not None else ""
        return f"{self.field} {self.path}{split}"

    def error(self, problem: str) -> DataError:
        return DataError(f"{self}: {problem}")

    def row_error(self, number: int, problem: str) -> DataError:
        """`problem` of the row at 1-based `number` of the file or split."""
        return self.error(f"row {number} {problem}")


def _datasets() -> ModuleType:
    # Local files need no hub; offline, `datasets` never tries one.
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets  # heavy: only for runs with a data file

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


def file_format(path: Path, named: str | None) -> str:
    """The builder for a data file: its extension's, else `named` (task.format: for the files
    whose extension does not say it)."""
    known = FORMATS.get(path.suffix.lower())
    if known is not None:
        return known
    if named is not None:
        return named
    raise DataError(
        f"{path}: no format known for extension {path.suffix or '(none)'!r}; name it with "
        "task.format: json, parquet or csv (and kind: file)"
    )


def open_source(source: Source, named_format: str | None) -> tuple[datasets.Dataset, Source]:
    """The rows at `source`, and the source as errors should name them (its split only when it
    is a DatasetDict's); DataError when there is nothing readable there, or no rows."""
    path = Path(source.path)
    if path.is_dir():
        rows, source = _saved(source, path)
    elif path.is_file():
        rows, source = (
            _file(source, path, file_format(path, named_format)),
            replace(source, split=None),
        )
    else:
        raise DataError(f"{source.field} {path}: no such file or directory")
    if len(rows) == 0:
        raise source.error("no rows")
    return rows, source


def _file(source: Source, path: Path, builder: str) -> datasets.Dataset:
    if path.stat().st_size == 0:
        raise DataError(f"{source.field} {path}: no rows (the file is empty)")
    hf = _datasets()
    try:
        return hf.load_dataset(builder, data_files=str(path), split="train")
    except Exception as err:  # malformed JSON lines, CSV or Parquet: one line naming the file
        cause = str(err.__cause__ or err) or type(err).__name__
        if "corresponds to no data" in cause:  # a CSV file with a header only
            raise DataError(f"{source.field} {path}: no rows") from None
        raise DataError(f"{source.field} {path}: not readable as {builder} ({cause.splitlines()[0]})") from None


def _saved(source: Source, path: Path) -> tuple[datasets.Dataset, Source]:
    """A save_to_disk directory; of a DatasetDict's, the split `source` names, alone."""
    hf = _datasets()
    splits_file = path / hf.config.DATASETDICT_JSON_FILENAME
    if splits_file.is_file():
        splits = json.loads(splits_file.read_text())["splits"]
        listed = ", ".join(sorted(splits))
        if source.split is None:
            raise source.error(f"a DatasetDict; name its held-out split with task.eval_split (its splits: {listed})")
        if source.split not in splits:
            raise DataError(f"{source.field} {path}: no split {source.split!r} (its splits: {listed})")
        directory = path / source.split
    else:
        directory, source = path, replace(source, split=None)
    state = directory / hf.config.DATASET_STATE_JSON_FILENAME
    if state.is_file() and not json.loads(state.read_text()).get("_data_files", True):
        raise source.error("no rows")  # saved with no shards, which datasets cannot load
    try:
        return hf.load_from_disk(str(directory)), source
    except FileNotFoundError:
        raise DataError(
            f"{source.field} {path}: a directory, but not one that Dataset.save_to_disk or "
            "DatasetDict.save_to_disk wrote (no dataset_info.json or dataset_dict.json)"
        ) from None
    except Exception as err:  # a damaged save: one line naming the directory
        cause = str(err) or type(err).__name__
        raise source.error(f"not readable as a saved dataset ({cause.splitlines()[0]})") from None
