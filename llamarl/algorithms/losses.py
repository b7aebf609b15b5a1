"""Per-token policy losses with masks, and their aggregation.

Inputs are (B, L): `logp` = log pi (with grad), `behaviour_logp` = log mu recorded by the
generator, `mask` = 1 on real completion tokens; `advantages` is (B,).

- AIPO: -min(pi/mu, rho).detach() * A * log pi. The weight is a constant, so gradients flow only
  through log pi; with pi == mu it is exactly REINFORCE.
- PPO-clip: -min(r A, clip(r, 1-eps, 1+eps) A), r = pi/mu.
- REINFORCE: -A * log pi.
Optional k3 KL to a reference policy: exp(ref - logp) - (ref - logp) - 1, weighted by kl_coef.

A batch may be computed in micro-batches: `token_terms` gives one micro-batch's per-token
losses, and `aggregate` with the whole batch's token and row counts gives its share of the
batch loss, so the shares add up to exactly the loss of the whole batch at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenTerms:
    """Per-token policy loss (KL included), the KL alone, importance ratios and clip flags."""

    per_token: torch.Tensor
    kl: torch.Tensor | None
    ratio: torch.Tensor
    clipped: torch.Tensor


@dataclass(frozen=True)
class LossOutput:
    loss: torch.Tensor
    ratio_mean: float
    ratio_max: float
    clipped_fraction: float
    kl_ref: float


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    how: str,
    num_tokens: float | None = None,
    num_rows: int | None = None,
) -> torch.Tensor:
    """Mean over real tokens (`token_mean`) or over sequences of their token means
    (`sequence_mean`). Pass the whole batch's `num_tokens` / `num_rows` when `per_token` is one
    micro-batch of it; by default they are this tensor's own."""
    mask = mask.to(per_token.dtype)
    if how == "token_mean":
        total = mask.sum().clamp(min=1) if num_tokens is None else max(num_tokens, 1.0)
        return (per_token * mask).sum() / total
    if how == "sequence_mean":
        per_sequence = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        rows = per_sequence.shape[0] if num_rows is None else num_rows
        return per_sequence.sum() / max(rows, 1)
    raise ValueError(f"unknown aggregation {how!r}")


def token_terms(
    kind: str,
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    rho: float = 4.0,
    clip_eps: float = 0.2,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> TokenTerms:
    adv = advantages[:, None].to(logp.dtype)
    ratio = torch.exp(logp - behaviour_logp)
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
        clipped = torch.zeros_like(logp, dtype=torch.bool)
    else:
        raise ValueError(f"unknown loss {kind!r}")
    kl = None
    if ref_logp is not None and kl_coef > 0:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + kl_coef * kl
    return TokenTerms(per_token, kl, ratio.detach(), clipped)


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
    """The loss of one whole batch, with its ratio statistics."""
    terms = token_terms(
        kind, logp, behaviour_logp, advantages,
        rho=rho, clip_eps=clip_eps, ref_logp=ref_logp, kl_coef=kl_coef,
    )  # fmt: skip
    real = mask.bool()
    ratios = terms.ratio[real]
    kl = 0.0 if terms.kl is None else float(aggregate(terms.kl.detach(), mask, aggregation))
    return LossOutput(
        loss=aggregate(terms.per_token, mask, aggregation),
        ratio_mean=float(ratios.mean()) if ratios.numel() else 1.0,
        ratio_max=float(ratios.max()) if ratios.numel() else 1.0,
        clipped_fraction=float(terms.clipped[real].float().mean()) if ratios.numel() else 0.0,
        kl_ref=kl,
    )
