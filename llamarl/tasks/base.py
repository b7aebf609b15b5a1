"""The prompt-set interface: training items addressed by index (the ticket id is the data
cursor, so any worker derives the same prompt from it) and a disjoint held-out list."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from llamarl.config import TaskConfig


@dataclass(frozen=True)
class Example:
    index: int
    prompt: str
    answer: str
    """The reference the verifier scores against."""
    solution: str | None = None
    """What supervised warm-start teaches the model to write; None means `answer` itself."""

    @property
    def target(self) -> str:
        return self.answer if self.solution is None else self.solution


class PromptSet(Protocol):
    def train_item(self, index: int) -> Example: ...

    def eval_items(self) -> list[Example]: ...


def make_prompt_set(config: TaskConfig, seed: int) -> PromptSet:
    if config.kind == "arithmetic":
        from llamarl.tasks.arithmetic import ArithmeticTask

        return ArithmeticTask(config.num_digits, config.num_eval, seed, config.show_work)
    from llamarl.tasks.files import FilePromptSet

    if config.path is None:
        raise ValueError(f"task.path is required for task.kind={config.kind}")
    return FilePromptSet.load(
        config.path, config.kind, config.prompt_field, config.answer_field, config.num_eval
    )
