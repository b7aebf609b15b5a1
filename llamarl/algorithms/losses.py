"""Per-token policy losses with masks, and their aggregation.

Inputs are (B, L): `logp` = log pi (with grad), `behaviour_logp` = log mu recorded by the
generator, `mask` = 1 on real completion tokens; `advantages` is (B,). The ratio r = pi/mu is
each token's, or with `ratio_level: sequence` its sequence's geometric mean
(`llamarl.algorithms.ratios`).

- AIPO (truncated importance sampling): -min(r, rho).detach() * A * log pi. The weight is a
  constant, so gradients flow only through log pi; with pi == mu it is exactly REINFORCE.
- PPO-clip: -min(r A, clip(r, low, high) A), the range [1 - clip_eps, 1 + clip_eps] unless
  `clip_low` / `clip_high` decouple it (DAPO); with sequence ratios and `sequence_mean` aggregation it is GSPO.
- REINFORCE: -A * log pi.
- The user's own, `module:function` (`llamarl.algorithms.user`): called as these three are, and
  returning what they return.
Then, per token: minus `entropy_coef` times the entropy (a bonus); plus `kl_coef` times the
KL estimate to the reference (`llamarl.algorithms.kl`) when the KL is in the loss; and masked
importance sampling zeroes the loss of tokens (or sequences) whose ratio leaves the band.

A batch may be computed in micro-batches: `token_terms` gives one micro-batch's per-token
losses, and `aggregate` with the whole batch's token and row counts gives its share of the
batch loss, so the shares add up to exactly the loss of the whole batch at once. A dropped
token still counts in those totals: they are fixed before any log-prob is computed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from llamarl.algorithms.kl import kl_estimate
from llamarl.algorithms.ratios import outside_band, sequence_ratio, token_ratio
from llamarl.config import AlgorithmConfig
from llamarl.user_code import load_function


@dataclass(frozen=True)
class TokenTerms:
    """Per-token policy loss (KL and entropy bonus included), the KL in it, the token ratios,
    where the loss's ratio was clipped or truncated, and where masked IS dropped the token."""

    per_token: torch.Tensor
    kl: torch.Tensor | None
    ratio: torch.Tensor
    clipped: torch.Tensor
    dropped: torch.Tensor


@dataclass(frozen=True)
class LossOutput:
    loss: torch.Tensor
    ratio_mean: float
    ratio_max: float
    clipped_fraction: float
    dropped_fraction: float
    kl_ref: float


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    how: str,
    num_tokens: float | None = None,
    num_rows: int | None = None,
    constant: float | None = None,
) -> torch.Tensor:
    """Mean over real tokens (`token_mean`), over sequences of their token means
    (`sequence_mean`), or over sequences of their token sums divided by `constant`
    (`constant_sum`, Dr. GRPO). Pass the whole batch's `num_tokens` / `num_rows` when
    `per_token` is one micro-batch of it; by default they are this tensor's own."""
    mask = mask.to(per_token.dtype)
    rows = per_token.shape[0] if num_rows is None else num_rows
    if how == "token_mean":
        total = mask.sum().clamp(min=1) if num_tokens is None else max(num_tokens, 1.0)
        return (per_token * mask).sum() / total
    if how == "sequence_mean":
        per_sequence = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        return per_sequence.sum() / max(rows, 1)
    if how == "constant_sum":
        if constant is None:
            raise ValueError("aggregation constant_sum needs its constant")
        return (per_token * mask).sum() / (max(rows, 1) * constant)
    raise ValueError(f"unknown aggregation {how!r}")


def clip_range(algorithm: AlgorithmConfig) -> tuple[float, float]:
    """PPO-clip's [low, high] for the ratio."""
    low = 1 - algorithm.clip_eps if algorithm.clip_low is None else algorithm.clip_low
    high = 1 + algorithm.clip_eps if algorithm.clip_high is None else algorithm.clip_high
    return low, high


PolicyLoss = Callable[..., tuple[torch.Tensor, torch.Tensor]]
"""A policy loss, built in or the user's own (`AlgorithmConfig.loss`, `llamarl.algorithms.user`):
called with the keywords `logp`, `behaviour_logp`, `ratio`, `advantages`, `mask` and
`algorithm`; returns the per-token loss and where its ratio was clipped, both (B, L)."""


def aipo(
    *, logp: Tensor, ratio: Tensor, advantages: Tensor, algorithm: AlgorithmConfig, **_: Any
) -> tuple[Tensor, Tensor]:
    """-min(r, rho).detach() * A * log pi, truncated where r > rho."""
    weight = ratio.detach().clamp(max=algorithm.rho)
    clipped = ratio.detach() > algorithm.rho
    return (-weight * advantages * logp).expand_as(logp), clipped.expand_as(logp)


def ppo_clip(
    *, logp: Tensor, ratio: Tensor, advantages: Tensor, algorithm: AlgorithmConfig, **_: Any
) -> tuple[Tensor, Tensor]:
    """-min(r A, clip(r, low, high) A), clipped where the clip changed r."""
    clipped_ratio = ratio.clamp(*clip_range(algorithm))
    per_token = -torch.minimum(ratio * advantages, clipped_ratio * advantages)
    clipped = (ratio.detach() - clipped_ratio.detach()).abs() > 0
    return per_token.expand_as(logp), clipped.expand_as(logp)


def reinforce(*, logp: Tensor, advantages: Tensor, **_: Any) -> tuple[Tensor, Tensor]:
    """-A * log pi, never clipped."""
    return -advantages * logp, torch.zeros_like(logp, dtype=torch.bool)


LOSSES: dict[str, PolicyLoss] = {"aipo": aipo, "ppo_clip": ppo_clip, "reinforce": reinforce}
LOSS_HINT = (
    "name a function taking (logp, behaviour_logp, ratio, advantages, mask, algorithm) and "
    "returning (per_token_loss, clipped), both (B, L) (docs/learning.md, Your own loss)"
)


def loss_function(name: str) -> PolicyLoss:
    """The built-in loss `name`, or the user's own `module:function` (ConfigError naming
    algorithm.loss when it cannot be loaded)."""
    return LOSSES.get(name) or load_function(name, "algorithm.loss", LOSS_HINT)


def ratio_at(level: str, logp: Tensor, behaviour_logp: Tensor, mask: Tensor, token: Tensor) -> Tensor:
    """The ratio at `level`: `token` (the token ratios, (B, L)), or each sequence's (B, 1)."""
    return token if level == "token" else sequence_ratio(logp, behaviour_logp, mask)


def loss_inputs(
    algorithm: AlgorithmConfig,
    logp: Tensor,
    behaviour_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    token: Tensor | None = None,
) -> dict[str, Any]:
    """The keywords a policy loss is called with (`PolicyLoss`), from (B,) `advantages` and the
    token ratios `token` (computed when not given)."""
    token = token_ratio(logp, behaviour_logp) if token is None else token
    return {
        "logp": logp,
        "behaviour_logp": behaviour_logp,
        "ratio": ratio_at(algorithm.ratio_level, logp, behaviour_logp, mask, token),
        "advantages": advantages[:, None].to(logp.dtype),
        "mask": mask,
        "algorithm": algorithm,
    }


def token_terms(
    algorithm: AlgorithmConfig,
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    entropy: torch.Tensor,
    ref_logp: torch.Tensor | None = None,
) -> TokenTerms:
    """One micro-batch's per-token terms; `ref_logp` for a KL in the loss."""
    ratio = token_ratio(logp, behaviour_logp)
    inputs = loss_inputs(algorithm, logp, behaviour_logp, advantages, mask, ratio)
    per_token, clipped = loss_function(algorithm.loss)(**inputs)
    if algorithm.entropy_coef > 0:
        per_token = per_token - algorithm.entropy_coef * entropy
    kl = None
    if ref_logp is not None and algorithm.kl_coef > 0 and algorithm.kl_in == "loss":
        kl = kl_estimate(logp, ref_logp, algorithm.kl_estimator)
        per_token = per_token + algorithm.kl_coef * kl
    band = (algorithm.mis_low, algorithm.mis_high)
    mis_ratio = ratio_at(algorithm.mis_level, logp, behaviour_logp, mask, ratio)
    dropped = outside_band(mis_ratio, *band, like=logp)
    if band != (None, None):
        per_token = torch.where(dropped, torch.zeros_like(per_token), per_token)
    return TokenTerms(per_token, kl, ratio.detach(), clipped, dropped)


def policy_loss(
    kind: str,
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    **options: Any,
) -> LossOutput:
    """The loss of one whole batch, with its ratio statistics; `options` are `AlgorithmConfig`
    fields, and `entropy` (zeros when not given) feeds the entropy bonus."""
    algorithm = AlgorithmConfig(loss=kind, **options)
    entropy = torch.zeros_like(logp) if entropy is None else entropy
    terms = token_terms(algorithm, logp, behaviour_logp, advantages, mask, entropy, ref_logp)
    real = mask.bool()
    ratios = terms.ratio[real]
    share = (mask, algorithm.aggregation, None, None, algorithm.loss_constant)
    kl = 0.0 if terms.kl is None else float(aggregate(terms.kl.detach(), *share))
    return LossOutput(
        loss=aggregate(terms.per_token, *share),
        ratio_mean=float(ratios.mean()) if ratios.numel() else 1.0,
        ratio_max=float(ratios.max()) if ratios.numel() else 1.0,
        clipped_fraction=float(terms.clipped[real].float().mean()) if ratios.numel() else 0.0,
        dropped_fraction=float(terms.dropped[real].float().mean()) if ratios.numel() else 0.0,
        kl_ref=kl,
    )
