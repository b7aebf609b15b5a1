"""Builds the prompt set a task config names. It lives apart from `base` (the interface) so the
task modules import the interface and this module imports them, never the other way round."""

from __future__ import annotations

from llamarl.config import TaskConfig
from llamarl.tasks.arithmetic import ArithmeticTask
from llamarl.tasks.base import PromptSet
from llamarl.tasks.files import FilePromptSet


def make_prompt_set(config: TaskConfig, seed: int) -> PromptSet:
    if config.kind == "arithmetic":
        return ArithmeticTask(
            config.num_digits,
            config.num_eval,
            seed,
            config.show_work,
            config.prompt_template,
            config.operation,
        )
    return FilePromptSet.load(config, seed)
