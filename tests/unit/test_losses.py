"""Advantages and losses against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from llamarl.algorithms.advantages import grpo_advantages, rloo_advantages
from llamarl.algorithms.losses import aggregate, policy_loss


def test_grpo_advantages_by_hand() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [3.0, 0.0, 0.0, 0.0]])
    adv = grpo_advantages(rewards)
    assert torch.allclose(adv[0], torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-4)
    assert torch.equal(adv[1], torch.zeros(4)), "zero-std group gets zero advantage"
    std = math.sqrt((2.25**2 + 3 * 0.75**2) / 4)
    assert adv[2, 0].item() == pytest.approx(2.25 / std, rel=1e-4)


def test_rloo_leaves_one_out() -> None:
    adv = rloo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
    assert torch.allclose(adv, torch.tensor([[1 - 1 / 3, -2 / 3, -2 / 3, 1 - 1 / 3]]))
    assert torch.equal(rloo_advantages(torch.tensor([[5.0]])), torch.zeros(1, 1))


def _inputs():
    logp = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.1, 0.4, 0.3]])).requires_grad_()
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([2.0, -1.0])
    return logp, mask, adv


def test_aipo_equals_reinforce_when_pi_equals_mu() -> None:
    logp, mask, adv = _inputs()
    aipo = policy_loss("aipo", logp, logp.detach(), adv, mask)
    reinforce = policy_loss("reinforce", logp, logp.detach(), adv, mask)
    assert aipo.loss.item() == pytest.approx(reinforce.loss.item())
    expected = (
        -(2 * (math.log(0.5) + math.log(0.2)) - (math.log(0.1) + math.log(0.4) + math.log(0.3))) / 5
    )
    assert aipo.loss.item() == pytest.approx(expected, rel=1e-5)
    (g1,) = torch.autograd.grad(aipo.loss, logp)
    assert torch.allclose(g1, torch.tensor([[-0.4, -0.4, 0.0], [0.2, 0.2, 0.2]]))


def test_aipo_truncates_the_ratio_at_rho() -> None:
    logp, mask, adv = _inputs()
    behaviour = logp.detach() - torch.log(torch.tensor([[10.0, 2.0, 1.0], [1.0, 1.0, 1.0]]))
    out = policy_loss("aipo", logp, behaviour, adv, mask, rho=4.0)
    (grad,) = torch.autograd.grad(out.loss, logp)
    # d/dlogp of -w*A*logp / 5 with w = min(ratio, rho): ratio 10 -> 4, ratio 2 -> 2.
    assert torch.allclose(grad[0, :2], torch.tensor([-4 * 2 / 5, -2 * 2 / 5]))
    assert out.ratio_max == pytest.approx(10.0, rel=1e-5)
    assert out.clipped_fraction == pytest.approx(1 / 5)


def test_gradients_flow_only_through_log_pi() -> None:
    logp, mask, adv = _inputs()
    behaviour = (logp.detach() - 0.3).requires_grad_()
    out = policy_loss("aipo", logp, behaviour, adv, mask)
    grad_logp, grad_behaviour = torch.autograd.grad(out.loss, [logp, behaviour], allow_unused=True)
    assert grad_behaviour is None
    # The weight is detached: the gradient is -w*A/N, not the derivative of w*logp.
    weight = math.exp(0.3)
    assert grad_logp[0, 0].item() == pytest.approx(-weight * 2 / 5, rel=1e-5)


def test_ppo_clip_by_hand() -> None:
    logp = torch.log(torch.tensor([[0.6]])).requires_grad_()
    behaviour = torch.log(torch.tensor([[0.4]]))
    out = policy_loss(
        "ppo_clip", logp, behaviour, torch.tensor([1.0]), torch.tensor([[1]]), clip_eps=0.2
    )
    assert out.loss.item() == pytest.approx(-1.2)  # ratio 1.5 clipped to 1.2 for A > 0
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert grad.item() == 0.0
    out = policy_loss("ppo_clip", logp, behaviour, torch.tensor([-1.0]), torch.tensor([[1]]))
    assert out.loss.item() == pytest.approx(1.5)  # A < 0: the unclipped, larger penalty


def test_masks_exclude_padding() -> None:
    logp, mask, adv = _inputs()
    poisoned = logp.detach().clone()
    poisoned[0, 2] = 1e6  # a padding position with an absurd behaviour log-prob
    out = policy_loss("aipo", logp, poisoned, adv, mask)
    assert math.isfinite(out.loss.item())
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert grad[0, 2] == 0


def test_sequence_mean_weights_sequences_equally() -> None:
    per_token = torch.tensor([[1.0, 1.0, 0.0], [4.0, 4.0, 4.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert aggregate(per_token, mask, "token_mean").item() == pytest.approx(14 / 5)
    assert aggregate(per_token, mask, "sequence_mean").item() == pytest.approx(2.5)


def test_k3_kl_penalty_to_reference() -> None:
    logp, mask, adv = _inputs()
    ref = logp.detach() + 0.5
    base = policy_loss("reinforce", logp, logp.detach(), adv, mask)
    with_kl = policy_loss("reinforce", logp, logp.detach(), adv, mask, ref_logp=ref, kl_coef=0.1)
    k3 = math.exp(0.5) - 0.5 - 1
    assert with_kl.kl_ref == pytest.approx(k3, rel=1e-5)
    assert with_kl.loss.item() == pytest.approx(base.loss.item() + 0.1 * k3, rel=1e-5)
