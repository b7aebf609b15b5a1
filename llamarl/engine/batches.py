"""The running batch a generator decodes with continuous batching, whichever engine samples:
the interface both engines' batches keep, and the one to use."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol

from llamarl.engine.continuous import FinishedGroup, RunningBatch, Sampler
from llamarl.engine.model import Policy
from llamarl.engine.vllm_batch import VllmBatch
from llamarl.engine.vllm_engine import VllmEngine


class DecodingBatch(Protocol):
    """Groups of n sequences that prompts join and finished groups leave between steps."""

    def __len__(self) -> int:
        """Sequences being decoded."""
        ...

    def free_groups(self, capacity: int) -> int:
        """How many more groups fit in `capacity` groups' sequences."""
        ...

    def oldest_version(self, key: Hashable) -> int | None:
        """The version of group `key`'s oldest sampled token (None before its first)."""
        ...

    def admit(self, prompts: Sequence[tuple[Hashable, list[int]]]) -> None:
        """Start n sequences of each (key, prompt ids)."""
        ...

    def drop(self, key: Hashable) -> int:
        """Stop group `key` and forget what it sampled; how many tokens that was."""
        ...

    def step(self, version: int) -> list[FinishedGroup]:
        """Sample the next tokens (recorded as `version`'s); the groups that ended."""
        ...


def running_batch(policy: Policy, sampler: Sampler, engine: VllmEngine | None) -> DecodingBatch:
    """The native engine's running batch on `policy`, or `engine`'s."""
    if engine is None:
        return RunningBatch(policy, sampler)
    return VllmBatch(engine, sampler, policy.pad_id)
