"""Per-token policy losses with masks, and their aggregation.

Inputs are (B, L): `logp` = log pi (with grad), `behaviour_logp` = log mu recorded by the
generator, `mask` = 1 on real completion tokens; `advantages` is (B,).

- AIPO: -min(pi/mu, rho).detach() * A * log pi. The weight is a constant, so gradients flow only
  through log pi; with pi == mu it is exactly REINFORCE.
- PPO-clip: -min(r A, clip(r, 1-eps, 1+eps) A), r = pi/mu.
- REINFORCE: -A * log pi.
Optional k3 KL to a reference policy: exp(ref - logp) - (ref - logp) - 1, weighted by kl_coef.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LossOutput:
    loss: torch.Tensor
    ratio_mean: float
    ratio_max: float
    clipped_fraction: float
    kl_ref: float


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    mask = mask.to(per_token.dtype)
    if how == "token_mean":
        return (per_token * mask).sum() / mask.sum().clamp(min=1)
    if how == "sequence_mean":
        per_sequence = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        return per_sequence.mean()
    raise ValueError(f"unknown aggregation {how!r}")


def policy_loss(
    kind: str,
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    rho: float = 4.0,
    clip_eps: float = 0.2,
    aggregation: str = "token_mean",
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> LossOutput:
    adv = advantages[:, None].to(logp.dtype)
    ratio = torch.exp(logp - behaviour_logp)
    real = mask.bool()
    if kind == "aipo":
        weight = ratio.detach().clamp(max=rho)
        per_token = -weight * adv * logp
        clipped = ratio.detach() > rho
    elif kind == "ppo_clip":
        clipped_ratio = ratio.clamp(1 - clip_eps, 1 + clip_eps)
        per_token = -torch.minimum(ratio * adv, clipped_ratio * adv)
        clipped = (ratio.detach() - clipped_ratio.detach()).abs() > 0
    elif kind == "reinforce":
        per_token = -adv * logp
        clipped = torch.zeros_like(real)
    else:
        raise ValueError(f"unknown loss {kind!r}")
    kl_value = 0.0
    if ref_logp is not None and kl_coef > 0:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + kl_coef * kl
        kl_value = float(aggregate(kl.detach(), mask, aggregation))
    loss = aggregate(per_token, mask, aggregation)
    ratios = ratio.detach()[real]
    return LossOutput(
        loss=loss,
        ratio_mean=float(ratios.mean()) if ratios.numel() else 1.0,
        ratio_max=float(ratios.max()) if ratios.numel() else 1.0,
        clipped_fraction=float(clipped[real].float().mean()) if ratios.numel() else 0.0,
        kl_ref=kl_value,
    )
