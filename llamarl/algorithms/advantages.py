"""Group baselines over the n samples of one prompt: GRPO (mean, and by default std) and RLOO
(leave-one-out), or the user's own `module:function`.

Rewards come as (G, n): G prompt groups of n samples. A group whose rewards are all equal carries
no signal and gets zero advantage (not a division by ~0). Dr. GRPO drops GRPO's division by the
std (`scale_by_std=False`), which favours groups whose rewards barely differ.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from llamarl.user_code import load_function

EPS = 1e-6


def grpo_advantages(rewards: torch.Tensor, scale_by_std: bool = True) -> torch.Tensor:
    """r - group mean, divided by the group's (population) std unless `scale_by_std` is false;
    zero where the group's std is zero."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, unbiased=False)
    centered = rewards - mean
    scaled = centered / (std + EPS) if scale_by_std else centered
    return torch.where(std > EPS, scaled, torch.zeros_like(centered))


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """r_i minus the mean of the other n - 1 rewards of its group; zero for groups of one."""
    n = rewards.shape[1]
    if n < 2:
        return torch.zeros_like(rewards)
    others = (rewards.sum(dim=1, keepdim=True) - rewards) / (n - 1)
    return rewards - others


Advantages = Callable[[torch.Tensor], torch.Tensor]
"""Group advantages, built in or the user's own (`AlgorithmConfig.advantage`,
`llamarl.algorithms.user`): the step's rewards (G, n) float32 in, the advantages (G, n) out."""
ADVANTAGE_HINT = (
    "name a function taking the step's rewards, (G, n) float32, and returning their "
    "advantages, the same shape (docs/learning.md, Your own loss)"
)


def advantage_function(kind: str, scale_by_std: bool = True) -> Advantages:
    """The built-in baseline `kind`, or the user's own `module:function` (ConfigError naming
    algorithm.advantage when it cannot be loaded)."""
    if kind == "grpo":
        return functools.partial(grpo_advantages, scale_by_std=scale_by_std)
    if kind == "rloo":
        return rloo_advantages
    return load_function(kind, "algorithm.advantage", ADVANTAGE_HINT)


def group_advantages(rewards: torch.Tensor, kind: str, scale_by_std: bool = True) -> torch.Tensor:
    """(G, n) advantages of (G, n) rewards by the baseline `kind`."""
    return advantage_function(kind, scale_by_std)(rewards)
