"""A data row -> an `Example`: its prompt (a field, `task.prompt_template` over the row's fields,
or a chat conversation), its reference answer, and the row itself; and the check of a whole
file before a run starts.

The check never holds the file in Python objects: a missing field is seen in the column names,
a null value in Arrow's null counts, and a conversation is checked a batch of rows at a time.
It names the first row a run cannot use, counted from 1 in the file (or split).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llamarl.config import TaskConfig, template_fields
from llamarl.tasks.base import Example
from llamarl.tasks.sources import Source

if TYPE_CHECKING:
    import datasets

CHECK_BATCH = 1024
"""Conversations turned into Python objects at once by the check."""

Message = dict[str, str]


class Malformed(ValueError):
    """A conversation that is not a list of {role, content} strings with a prompt."""


def split_conversation(value: object) -> tuple[list[Message], str | None]:
    """(the messages up to the model's turn, the final assistant reply or None). Only role and
    content are kept (a row's other keys, such as a tool call's, are not rendered)."""
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise Malformed("is not a list of {role, content} strings")
    messages = []
    for item in value:
        if not isinstance(item, dict) or not all(isinstance(item.get(key), str) for key in ("role", "content")):
            raise Malformed("is not a list of {role, content} strings")
        messages.append({"role": item["role"], "content": item["content"]})
    reply = None
    if messages and messages[-1]["role"] == "assistant":
        reply = messages.pop()["content"]
    if not messages:
        raise Malformed("holds no prompt (no message before the final assistant reply)")
    return messages, reply


def prompt_text(messages: Sequence[Message]) -> str:
    """A conversation's prompt as text (for rewards, judges and samples): its last user
    message, else its last message."""
    users = [m["content"] for m in messages if m["role"] == "user"]
    return users[-1] if users else messages[-1]["content"]


@dataclass(frozen=True)
class RowReader:
    prompt_field: str
    answer_field: str
    prompt_template: str | None = None
    messages_field: str | None = None
    system_prompt: str | None = None

    @classmethod
    def of(cls, task: TaskConfig) -> RowReader:
        return cls(
            task.prompt_field,
            task.answer_field,
            task.prompt_template,
            task.messages_field,
            task.system_prompt,
        )

    def example(self, index: int, row: dict[str, Any]) -> Example:
        """The example of a checked row."""
        if self.messages_field is None:
            if self.prompt_template is None:
                prompt = str(row[self.prompt_field])
            else:
                prompt = self.prompt_template.format(**row)
            return Example(index, prompt, str(row[self.answer_field]), row=row)
        messages, reply = split_conversation(row[self.messages_field])
        if self.system_prompt is not None and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        answer = row.get(self.answer_field)
        # The final reply is the reference when the row has no answer, else the demonstration.
        solution = None if answer is None else reply
        return Example(
            index,
            prompt_text(messages),
            str(reply if answer is None else answer),
            solution=solution,
            row=row,
            messages=tuple(messages),
        )

    def check(self, rows: datasets.Dataset, source: Source) -> None:
        """DataError naming the first row of `rows` that `example` cannot use: a field it
        reads missing or null, a conversation that is not a list of {role, content} strings
        (or has no prompt), no answer."""
        columns = set(rows.column_names)
        fields = ", ".join(sorted(columns))
        if self.prompt_template is not None:
            unknown = sorted(template_fields(self.prompt_template) - columns)
            if unknown:
                raise source.row_error(
                    1,
                    f"has no field {unknown[0]!r} that task.prompt_template names (its fields: {fields})",
                )
        for name in self._needed(columns):
            if name not in columns:
                hint = ""
                if name == self.prompt_field and "messages" in columns:
                    hint = "; chat rows: set task.messages_field: messages"
                raise source.row_error(1, f"lacks {name!r} (its fields: {fields}{hint})")
        for name in self._needed(columns):
            first = _first_null(rows, name)
            if first is not None:
                raise source.row_error(first + 1, f"lacks {name!r}")
        if self.messages_field is None and self.prompt_template is None:
            first = _first_empty(rows, self.prompt_field)
            if first is not None:  # a model without a chat template would be given no token
                raise source.row_error(first + 1, f"has an empty {self.prompt_field!r}")
        if self.messages_field is not None:
            self._check_conversations(rows, source, need_reply=self.answer_field not in columns)

    def _needed(self, columns: set[str]) -> list[str]:
        """The fields every row must have (non-null)."""
        if self.messages_field is not None:
            # Without an answer field, each conversation's final reply is the answer.
            if self.answer_field not in columns:
                return [self.messages_field]
            return [self.messages_field, self.answer_field]
        if self.prompt_template is None:
            return [self.prompt_field, self.answer_field]
        return [*sorted(template_fields(self.prompt_template)), self.answer_field]

    def _check_conversations(self, rows: datasets.Dataset, source: Source, need_reply: bool) -> None:
        assert self.messages_field is not None
        field = self.messages_field
        batches = rows.select_columns([field]).iter(batch_size=CHECK_BATCH)
        for start, batch in enumerate(batches):
            for offset, value in enumerate(batch[field]):
                number = start * CHECK_BATCH + offset + 1
                try:
                    _, reply = split_conversation(value)
                except Malformed as err:
                    raise source.row_error(number, f"{field!r} {err}") from None
                if need_reply and reply is None:
                    raise source.row_error(
                        number,
                        f"lacks {self.answer_field!r}, and its {field!r} has no final "
                        "assistant reply to take as the answer",
                    )


def _first_null(rows: datasets.Dataset, name: str) -> int | None:
    """The position of the first null value of column `name`, from Arrow (no Python copies).
    Datasets read from a file or a saved directory have no indices mapping, so a position in
    the table is a row's position."""
    import pyarrow.compute as pc

    column = rows.data.column(name)
    if column.null_count == 0:
        return None
    return int(pc.index(column.is_null(), True).as_py())


def _first_empty(rows: datasets.Dataset, name: str) -> int | None:
    """The position of the first empty string of text column `name` (None for another type)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = rows.data.column(name)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return None
    empty = pc.equal(pc.utf8_length(column), 0)
    if not pc.any(empty).as_py():
        return None
    return int(pc.index(empty, True).as_py())
