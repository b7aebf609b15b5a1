"""A loss and an advantage of a user's own, for `algorithm.loss` and `algorithm.advantage`
(docs/learning.md, Your own loss; the signatures are in `llamarl.algorithms.user`).

    algorithm:
      loss: examples.own_algorithm:cispo
      advantage: examples.own_algorithm:group_mean_batch_std

`cispo` is CISPO (MiniMax-M1): the policy gradient weighted by the ratio clipped to
[clip_low, clip_high] (1 -/+ clip_eps unless set) and detached. PPO-clip drops the gradient of
a token whose ratio left the range; CISPO keeps every token's gradient and bounds its weight
instead, so rare tokens with large ratios still learn. On-policy (ratio 1) it is REINFORCE.

`group_mean_batch_std` centres each reward on its group's mean, as GRPO does, and divides by
the std of the whole step's rewards rather than the group's, so a group whose rewards barely
differ is not blown up to unit scale.
"""

from __future__ import annotations

from typing import Any

import torch

from llamarl.algorithms.losses import clip_range
from llamarl.config import AlgorithmConfig


def cispo(
    *,
    logp: torch.Tensor,
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    algorithm: AlgorithmConfig,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """-clip(pi/mu, low, high).detach() * A * log pi per token, and where the clip bit."""
    low, high = clip_range(algorithm)
    weight = ratio.detach().clamp(low, high)
    clipped = (ratio.detach() < low) | (ratio.detach() > high)
    return (-weight * advantages * logp).expand_as(logp), clipped.expand_as(logp)


def group_mean_batch_std(rewards: torch.Tensor) -> torch.Tensor:
    """(r - group mean) / std of every reward of the step; 0 where the step's rewards are all
    equal."""
    centered = rewards - rewards.mean(dim=1, keepdim=True)
    return centered / (rewards.std(unbiased=False) + 1e-6)
