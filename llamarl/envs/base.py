"""The environment interface: one instance an episode. `start` turns a prompt row into the
first messages; each `step` takes the text of the model's turn and answers with the messages the
model reads next, whether the episode is done, and its reward (or None: the reward workers score
the model's last turn with the task's verifier).

An environment speaks in messages (`{"role": ..., "content": ...}`); the episode runner turns
them into tokens with the tokenizer's chat template, or as plain text for a tokenizer without
one (`llamarl.engine.turns`). It may raise or hang: the runner bounds every call
(`environment.step_timeout_s`) and ends the episode with the reason, never the worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from llamarl.rewards.verifiers import Verifier
from llamarl.tasks import Example
from llamarl.tools import Tool

Message = dict[str, str]
"""{"role": "user" | "assistant" | "tool", "content": text}."""


@dataclass(frozen=True)
class EnvStep:
    """The environment's answer to one model turn."""

    messages: list[Message]
    """What the model reads before its next turn (empty when done)."""
    done: bool
    reward: float | None = None
    """The episode's reward so far: the last one given counts when the episode ends (done, or
    out of turns or tokens); None throughout leaves it to the reward workers."""


@dataclass(frozen=True)
class EnvContext:
    """What every environment is built with, once an episode."""

    tools: Mapping[str, Tool]
    """The tools the config allows, by the name the model calls them."""
    verifier: Verifier
    """The task's verifier: (text, reference answer) -> reward."""
    discount: float = 0.5
    options: Mapping[str, Any] = field(default_factory=dict)
    """environment.options, for your own environment."""


class Environment(Protocol):
    def start(self, example: Example) -> list[Message]:
        """The first messages of the episode (the prompt)."""
        ...

    def step(self, reply: str) -> EnvStep:
        """The environment's answer to the model's turn `reply` (its text, without EOS)."""
        ...


class Demonstrates(Protocol):
    """An environment that can write a worked episode for supervised warm start."""

    def demonstration(self, example: Example) -> list[Message]:
        """The episode's turns after the first messages, as a good model would play them."""
        ...
