"""Losses and advantages of a user's, for the tests that run `llamarl` with them (importable as
`tests.user_losses` from the repository root, where the commands run): the example's, counted,
and the mistakes the check before a run refuses."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from examples.own_algorithm import cispo, group_mean_batch_std

CALLS = "LLAMARL_TEST_ALGORITHM_CALLS"
"""The file each counted call appends a line to: its name and its input's shape."""


def _note(name: str, tensor: torch.Tensor) -> None:
    with Path(os.environ[CALLS]).open("a") as calls:
        calls.write(f"{name} {tuple(tensor.shape)}\n")


def counted_cispo(**inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    _note("loss", inputs["logp"])
    return cispo(**inputs)


def counted_advantages(rewards: torch.Tensor) -> torch.Tensor:
    _note("advantage", rewards)
    return group_mean_batch_std(rewards)


def one_per_sequence(*, logp: torch.Tensor, advantages: torch.Tensor, **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A mistake: one loss a sequence, (B, 1), where one a token belongs."""
    per_sequence = -(advantages * logp).sum(-1, keepdim=True)
    return per_sequence, torch.zeros_like(per_sequence, dtype=torch.bool)


def loss_only(*, logp: torch.Tensor, advantages: torch.Tensor, **_: Any) -> torch.Tensor:
    """A mistake: the loss alone, without where it clipped."""
    return -advantages * logp


def detached(*, logp: torch.Tensor, advantages: torch.Tensor, **_: Any) -> tuple[Any, Any]:
    """A mistake: a loss that gives no gradient."""
    return -advantages * logp.detach(), torch.zeros_like(logp, dtype=torch.bool)


def sqrt_of_zero(*, logp: torch.Tensor, mask: torch.Tensor, **_: Any) -> tuple[Any, Any]:
    """A mistake: a finite loss whose gradient is not (d sqrt(x)/dx at 0)."""
    return torch.sqrt(logp - logp) * mask, torch.zeros_like(logp, dtype=torch.bool)


def positional(logp: torch.Tensor, ratio: torch.Tensor) -> tuple[Any, Any]:
    """A mistake: parameters that are not the keywords a loss is called with."""
    return -ratio * logp, torch.zeros_like(logp, dtype=torch.bool)


def std_of_equal_rewards(rewards: torch.Tensor) -> torch.Tensor:
    """A mistake: GRPO without its guard, NaN for a group whose rewards are all equal."""
    mean = rewards.mean(dim=1, keepdim=True)
    return (rewards - mean) / rewards.std(dim=1, keepdim=True, unbiased=False)


def one_per_group(rewards: torch.Tensor) -> torch.Tensor:
    """A mistake: one advantage a group."""
    return rewards.mean(dim=1)


def signs(rewards: torch.Tensor) -> torch.Tensor:
    """A mistake: integer advantages."""
    return torch.sign(rewards - rewards.mean(dim=1, keepdim=True)).long()


NOT_A_FUNCTION = 3
