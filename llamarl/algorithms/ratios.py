"""Importance ratios pi/mu of the trainer's to the generator's probabilities, per token or per
sequence, and the masked-importance-sampling band that drops tokens or sequences.

Inputs are (B, L) with `mask` = 1 on real completion tokens. A sequence's ratio is the geometric
mean of its tokens' ratios (GSPO's), exp of their mean log ratio; it keeps a (B, 1) shape so
it broadcasts over the sequence's tokens. Padding never enters a sum, whatever it holds.
"""

from __future__ import annotations

import torch


def token_ratio(logp: torch.Tensor, behaviour_logp: torch.Tensor) -> torch.Tensor:
    """pi/mu of every token (differentiable through `logp`)."""
    return torch.exp(logp - behaviour_logp)


def sequence_ratio(logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, 1): exp of each sequence's mean log pi/mu over its real tokens (differentiable)."""
    real = mask.bool()
    log_ratio = torch.where(real, logp - behaviour_logp, torch.zeros_like(logp))
    length = real.sum(-1, keepdim=True).clamp(min=1)
    return torch.exp(log_ratio.sum(-1, keepdim=True) / length)


def outside_band(ratio: torch.Tensor, low: float | None, high: float | None, like: torch.Tensor) -> torch.Tensor:
    """Bool, shaped as `like`: where the (detached) `ratio` is below `low` or above `high`."""
    ratio = ratio.detach()
    dropped = torch.zeros_like(ratio, dtype=torch.bool)
    if low is not None:
        dropped |= ratio < low
    if high is not None:
        dropped |= ratio > high
    return dropped.expand_as(like)
