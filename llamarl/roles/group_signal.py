"""Dynamic sampling (DAPO) at the trainer's door: which scored groups a step skips.

A group whose rewards are all equal gets zero advantage from either group baseline, so it moves
nothing but the step's normalisation. With `sampling.dynamic_sampling` the trainer skips it: its
ticket ends `skipped`, which gives its slot in the admission gate back, so generators draw a new
prompt in its place. The cap: at most (max_draws_factor - 1) x prompts_per_step groups are
skipped between two steps; after that the next groups are kept whatever their rewards, and the
step fills as it would without dynamic sampling.
"""

from __future__ import annotations

import numpy as np

from llamarl.config import RunConfig


def has_signal(rewards: np.ndarray) -> bool:
    """Whether a group's rewards differ at all (then some advantage is not zero)."""
    return bool(rewards.max() > rewards.min())


class SignalFilter:
    """Decides, group by group, which to skip, and counts the skips of the step being filled."""

    def __init__(self, enabled: bool, max_skips: int) -> None:
        self.enabled = enabled
        self.max_skips = max_skips
        """Skips allowed between two steps."""
        self.num_skipped = 0
        """Groups skipped since the last step."""

    @classmethod
    def of(cls, config: RunConfig) -> SignalFilter:
        sampling = config.sampling
        max_skips = (sampling.max_draws_factor - 1) * config.trainer.prompts_per_step
        return cls(sampling.dynamic_sampling, max_skips)

    def skips(self, rewards: np.ndarray) -> bool:
        """True (and counted) when the group with these (shaped) rewards is to be skipped."""
        if not self.enabled or has_signal(rewards) or self.num_skipped >= self.max_skips:
            return False
        self.num_skipped += 1
        return True

    def step_done(self) -> int:
        """The groups skipped for the step just assembled; the next step starts from none."""
        skipped, self.num_skipped = self.num_skipped, 0
        return skipped
