"""KL to the reference policy, estimated per token from sampled tokens (Schulman's k1, k2, k3),
and that KL as a penalty on each sequence's reward.

With r = log pi - log ref at a sampled token: k1 = r (unbiased, can be negative),
k2 = r^2 / 2, k3 = exp(-r) + r - 1 (unbiased for KL(pi || ref), never negative).
"""

from __future__ import annotations

import torch


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """The per-token estimate of KL(pi || ref) (differentiable through `logp`)."""
    if estimator == "k1":
        return logp - ref_logp
    if estimator == "k2":
        return 0.5 * (logp - ref_logp) ** 2
    if estimator == "k3":
        delta = ref_logp - logp
        return torch.exp(delta) - delta - 1
    raise ValueError(f"unknown KL estimator {estimator!r}")


def sequence_kl(
    behaviour_logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, estimator: str
) -> torch.Tensor:
    """(B,): each sequence's summed KL estimate over its real tokens, of the generator's
    log-probs against the reference (detached: a reward carries no gradient)."""
    kl = kl_estimate(behaviour_logp.detach(), ref_logp.detach(), estimator)
    return torch.where(mask.bool(), kl, torch.zeros_like(kl)).sum(-1)
