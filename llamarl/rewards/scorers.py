"""What a reward worker applies to a rollout group: a `GroupScorer` returns one reward per
completion. `FunctionScorer` calls a per-completion function (a built-in verifier or the user's
`task.reward`); `reward_model.RewardModelScorer` runs a Hugging Face reward model."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from llamarl.protocol import RolloutGroup
from llamarl.rewards.verifiers import Verifier


def group_texts(group: RolloutGroup) -> list[str]:
    """The group's decoded completions, in sample order."""
    return group.completions.data.decode("utf-8", "replace").split("\0")


class GroupScorer(Protocol):
    name: str
    """Recorded with every scored group (which scorer produced its rewards)."""

    def score(self, group: RolloutGroup) -> np.ndarray:
        """float32 (n,): one reward per completion of the group."""
        ...


class FunctionScorer:
    """A function of (completion, reference answer), applied to each completion."""

    def __init__(self, function: Verifier, name: str) -> None:
        self.function = function
        self.name = name

    def score(self, group: RolloutGroup) -> np.ndarray:
        texts = group_texts(group)
        return np.array([self.function(text, group.answer) for text in texts], dtype=np.float32)
