"""The prompt-set interface: training items addressed by index (the ticket id is the data
cursor, so any worker derives the same prompt from it) and a disjoint held-out list."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


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

    @property
    def target(self) -> str:
        return self.answer if self.solution is None else self.solution


class PromptSet(Protocol):
    def train_item(self, index: int) -> Example: ...

    def eval_items(self) -> list[Example]: ...
