"""The prompt-set interface: training items addressed by index (the ticket id is the data
cursor, so any worker derives the same prompt from it) and a disjoint held-out list."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from llamarl.errors import ConfigError


class DataError(ConfigError, ValueError):
    """A prompt file, or one of its rows, that a run cannot use; the message names the config
    field, the file and the row. Raised before any role starts (the launcher builds the prompt
    set first), so it is a configuration error: one line, exit code 2."""


@dataclass(frozen=True)
class Example:
    index: int
    prompt: str
    answer: str
    """The reference the verifier scores against."""
    solution: str | None = None
    """What supervised warm-start teaches the model to write; None means `answer` itself."""
    expression: str | None = None
    """The arithmetic behind the question (`1234*5678`), for a calculator's demonstrations."""
    row: dict[str, Any] = field(default_factory=dict, compare=False)
    """The data row the example came from, every field (a reward function may read them); the
    arithmetic task's: {"a", "b", "answer"}."""
    messages: tuple[dict[str, str], ...] = field(default=(), hash=False)
    """A chat row's conversation up to the model's turn ({role, content} each; `prompt` is then
    its last user message): rendered through the tokenizer's chat template. Empty: `prompt`
    alone is the prompt."""

    @property
    def target(self) -> str:
        return self.answer if self.solution is None else self.solution


class PromptSet(Protocol):
    def train_item(self, index: int) -> Example: ...

    def eval_items(self) -> list[Example]: ...
