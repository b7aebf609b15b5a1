"""Prompt files: JSONL (one object a line) or Parquet, read with the Hugging Face `datasets`
library (local files only: nothing is downloaded), with configurable field names.

The first `num_eval` rows are held out for evaluation; training cycles through the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llamarl.tasks.base import Example

BUILDERS = {"jsonl": "json", "parquet": "parquet"}


def _read_rows(path: Path, kind: str) -> list[dict]:
    import datasets  # heavy: only for runs with a prompt file

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    try:
        table = datasets.load_dataset(BUILDERS[kind], data_files=str(path), split="train")
    except Exception as err:  # malformed JSON lines or Parquet: one line naming the file
        cause = err.__cause__ or err
        raise ValueError(f"{path}: not readable as {kind} ({str(cause).splitlines()[0]})") from None
    return list(table)


def _prompt(row: dict, prompt_field: str, template: str | None, path: str, number: int) -> str:
    if template is None:
        return str(row[prompt_field])
    try:
        return template.format(**row)
    except KeyError as err:
        raise ValueError(
            f"{path}: row {number} has no field {err.args[0]!r} that task.prompt_template names "
            f"(its fields: {', '.join(sorted(row))})"
        ) from None


@dataclass(frozen=True)
class FilePromptSet:
    train: list[tuple[str, str]]
    held_out: list[tuple[str, str]]

    @classmethod
    def load(
        cls,
        path: str,
        kind: str,
        prompt_field: str,
        answer_field: str,
        num_eval: int,
        prompt_template: str | None = None,
    ) -> FilePromptSet:
        """`prompt_template`, when given, writes each prompt from the row's fields in place of
        `prompt_field`."""
        rows = _read_rows(Path(path), kind)
        pairs = []
        for number, row in enumerate(rows, start=1):
            if prompt_template is None and row.get(prompt_field) is None:
                raise ValueError(f"{path}: row {number} lacks {prompt_field!r}")
            if row.get(answer_field) is None:
                raise ValueError(f"{path}: row {number} lacks {answer_field!r}")
            pairs.append((_prompt(row, prompt_field, prompt_template, path, number),
                          str(row[answer_field])))  # fmt: skip
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
