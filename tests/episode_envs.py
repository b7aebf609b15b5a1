"""Environments for the episode tests, importable as `tests.episode_envs:Class` like a user's.

Every text they write uses the built model's characters (digits, `+-*= `), so the character
tokenizer spells it exactly."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from llamarl.envs import EnvContext, EnvStep, Message
from llamarl.tasks import Example

RELEASE = threading.Event()
"""Set by a test to let a SlowEnv step finish (it otherwise waits 60 s)."""


class TwoTurnEnv:
    """Replies `= 7` to the first turn; the second turn ends the episode, reward 1 for an even
    prompt index (so a group has rewards that differ between groups, not within)."""

    def __init__(self, context: EnvContext) -> None:
        self.index = 0

    def start(self, example: Example) -> list[Message]:
        self.index = example.index
        return [{"role": "user", "content": example.prompt}]

    def step(self, reply: str) -> EnvStep:
        if not hasattr(self, "replied"):
            self.replied = True
            return EnvStep([{"role": "tool", "content": "= 7 "}], done=False)
        return EnvStep([], done=True, reward=float(len(reply) % 2))


class RaisingEnv(TwoTurnEnv):
    """Raises on every prompt whose index is a multiple of 3."""

    def step(self, reply: str) -> EnvStep:
        if self.index % 3 == 0:
            raise RuntimeError("the environment broke")
        return super().step(reply)


class SlowEnv(TwoTurnEnv):
    """Hangs on its first step for odd prompt indices (until RELEASE, at most 60 s)."""

    def step(self, reply: str) -> EnvStep:
        if self.index % 2:
            RELEASE.wait(60)
        return super().step(reply)


class PacedEnv(TwoTurnEnv):
    """Each step first marks `options.marker_dir/<pid>` (so a test knows this process is inside
    an episode), then takes 0.15 s; raises on prompts whose index is a multiple of 7."""

    def __init__(self, context: EnvContext) -> None:
        super().__init__(context)
        self.marker = Path(str(context.options["marker_dir"])) / str(os.getpid())

    def step(self, reply: str) -> EnvStep:
        self.marker.touch()
        time.sleep(0.15)
        if self.index % 7 == 0:
            raise RuntimeError("the environment broke")
        return super().step(reply)


class BadOutputEnv(TwoTurnEnv):
    """Answers each prompt with another kind of wrong output: not an EnvStep, a message that is
    not text, a reward that is not a number, one outside float32's range."""

    def step(self, reply: str) -> EnvStep:
        wrong: list[object] = [
            {"messages": [], "done": True},
            EnvStep([{"role": "tool", "content": 7}], done=False),  # type: ignore[dict-item]
            EnvStep([], done=True, reward="high"),  # type: ignore[arg-type]
            EnvStep([], done=True, reward=float("nan")),
            EnvStep([], done=True, reward=1e300),
        ]
        return wrong[self.index % len(wrong)]  # type: ignore[return-value]


class EmptyStartEnv(TwoTurnEnv):
    """Starts prompts of an even index with an empty message (no tokens on the built model)."""

    def start(self, example: Example) -> list[Message]:
        first = super().start(example)
        return [{"role": "user", "content": ""}] if example.index % 2 == 0 else first


class AlwaysRaisingEnv(TwoTurnEnv):
    def step(self, reply: str) -> EnvStep:
        raise RuntimeError("always broken")
