"""What a reward worker applies to a rollout group: a `GroupScorer` returns one reward per
completion and the group's named components. `VerifierScorer` applies a built-in verifier;
`SampleScorer` the user's `task.reward`, which sees the prompt, the data row and an episode's
turns; `reward_model.RewardModelScorer` runs a Hugging Face reward model and `judge.JudgeScorer`
a generative judge, each adding its score to another scorer's.

The held-out evaluation scores with the same functions, through `TextScorer`: a list of
completions of one example."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from llamarl.protocol import RolloutGroup
from llamarl.protocol.episodes import parse_episodes
from llamarl.rewards.custom import Sample, UserReward
from llamarl.rewards.verifiers import Verifier
from llamarl.tasks import Example


def group_texts(group: RolloutGroup) -> list[str]:
    """The group's decoded completions, in sample order."""
    return group.completions.data.decode("utf-8", "replace").split("\0")


@dataclass(frozen=True)
class Scores:
    """A group's rewards and their named parts (means over the group)."""

    rewards: np.ndarray
    """float32 (n,)."""
    components: dict[str, float] = field(default_factory=dict)


class GroupScorer(Protocol):
    name: str
    """Recorded with every scored group (which scorer produced its rewards)."""

    def score(self, group: RolloutGroup) -> Scores:
        """One reward per completion of the group, and its components."""
        ...


TextScorer = Callable[[Example, Sequence[str], Sequence[Sequence[Any]]], list[float]]
"""(example, its completions, each completion's episode turns or []) -> one reward each."""


class VerifierScorer:
    """A built-in verifier of (completion, reference answer), applied to each completion."""

    def __init__(self, function: Verifier, name: str) -> None:
        self.function = function
        self.name = name

    def score(self, group: RolloutGroup) -> Scores:
        texts = group_texts(group)
        rewards = [self.function(text, group.answer) for text in texts]
        return Scores(np.array(rewards, dtype=np.float32))

    def score_texts(self, example: Example, texts: Sequence[str], turns: Sequence[Sequence[Any]]) -> list[float]:
        return [self.function(text, example.answer) for text in texts]


class SampleScorer:
    """The user's `task.reward`, given each completion with its prompt, data row and turns."""

    def __init__(self, reward: UserReward, example_of: Callable[[int], Example] | None = None) -> None:
        self.reward = reward
        self.example_of = example_of
        """The training example of a group's prompt index (its row); None: evaluation only."""
        self.name = reward.spec

    def score(self, group: RolloutGroup) -> Scores:
        texts = group_texts(group)
        turns: list[Sequence[Any]] = [[] for _ in texts]
        if group.episodes:
            records = parse_episodes(group.episodes, len(texts))
            turns = [record["turns"] for record in records]
        assert self.example_of is not None, "a scorer of groups needs the prompt set"
        example = self.example_of(group.prompt_index)
        outcomes = self.reward.score(_samples(example, texts, turns, group.prompt))
        components: dict[str, float] = {}
        for outcome in outcomes:
            for name, part in outcome.components.items():
                components[name] = components.get(name, 0.0) + part / len(outcomes)
        return Scores(np.array([o.total for o in outcomes], dtype=np.float32), components)

    def score_texts(self, example: Example, texts: Sequence[str], turns: Sequence[Sequence[Any]]) -> list[float]:
        outcomes = self.reward.score(_samples(example, texts, turns, example.prompt))
        return [outcome.total for outcome in outcomes]


def _samples(example: Example, texts: Sequence[str], turns: Sequence[Sequence[Any]], prompt: str) -> list[Sample]:
    return [Sample(text, example.answer, prompt, example.row, each) for text, each in zip(texts, turns, strict=True)]


def with_part(base: GroupScorer | None, group: RolloutGroup, name: str, part: np.ndarray) -> Scores:
    """`part` (n,) added to `base`'s rewards of `group` (when there is a base), as the component
    `name`; the base's own components are kept, or its rewards are one named after it."""
    components = {name: float(part.mean())}
    if base is None:
        return Scores(part.astype(np.float32), components)
    scores = base.score(group)
    components |= scores.components or {base.name: float(scores.rewards.mean())}
    return Scores((scores.rewards + part).astype(np.float32), components)
