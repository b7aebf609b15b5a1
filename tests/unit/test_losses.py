"""Advantages and losses against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from llamarl.algorithms.advantages import group_advantages, grpo_advantages, rloo_advantages
from llamarl.algorithms.kl import sequence_kl
from llamarl.algorithms.losses import aggregate, policy_loss
from llamarl.algorithms.ratios import sequence_ratio


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
    expected = -(2 * (math.log(0.5) + math.log(0.2)) - (math.log(0.1) + math.log(0.4) + math.log(0.3))) / 5
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
    out = policy_loss("ppo_clip", logp, behaviour, torch.tensor([1.0]), torch.tensor([[1]]), clip_eps=0.2)
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


def test_dr_grpo_advantages_are_centred_only() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [3.0, 0.0, 0.0, 0.0]])
    adv = grpo_advantages(rewards, scale_by_std=False)
    assert torch.allclose(adv[0], torch.tensor([0.5, -0.5, -0.5, 0.5]))
    assert torch.equal(adv[1], torch.zeros(4))
    assert torch.allclose(adv[2], torch.tensor([2.25, -0.75, -0.75, -0.75]))


def test_decoupled_clip_range_by_hand() -> None:
    # Ratios 1.5, 1.25, 0.5 (pi / mu = 0.6/0.4, 0.5/0.4, 0.2/0.4), one token each.
    logp = torch.log(torch.tensor([[0.6], [0.5], [0.2]])).requires_grad_()
    behaviour = torch.log(torch.tensor([[0.4], [0.4], [0.4]]))
    adv, mask = torch.tensor([1.0, 1.0, -1.0]), torch.ones(3, 1)
    out = policy_loss("ppo_clip", logp, behaviour, adv, mask, aggregation="sequence_mean", clip_low=0.8, clip_high=1.28)
    # 1.5 -> 1.28 (A > 0); 1.25 inside [0.8, 1.28]; 0.5 with A < 0: max(0.5, 0.8) = 0.8.
    assert out.loss.item() == pytest.approx((-1.28 - 1.25 + 0.8) / 3)
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert torch.allclose(grad, torch.tensor([[0.0], [-1.25 / 3], [0.0]]))
    assert out.clipped_fraction == pytest.approx(2 / 3)
    symmetric = policy_loss("ppo_clip", logp, behaviour, adv, mask, aggregation="sequence_mean")
    assert symmetric.loss.item() == pytest.approx((-1.2 - 1.2 + 0.8) / 3), "clip_eps 0.2"


def test_constant_sum_divides_each_sequence_sum_by_the_constant() -> None:
    per_token = torch.tensor([[1.0, 1.0, 0.0], [4.0, 4.0, 4.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    # Sequence sums 2 and 12, each over the constant 4, averaged over 2 sequences.
    assert aggregate(per_token, mask, "constant_sum", constant=4).item() == pytest.approx(1.75)
    logp, mask, adv = _inputs()
    out = policy_loss("reinforce", logp, logp.detach(), adv, mask, aggregation="constant_sum", loss_constant=4)
    logs = [math.log(p) for p in (0.5, 0.2, 0.1, 0.4, 0.3)]
    assert out.loss.item() == pytest.approx((-2 * (logs[0] + logs[1]) + sum(logs[2:])) / 8)


@pytest.mark.parametrize("how", ["token_mean", "sequence_mean", "constant_sum"])
def test_micro_batch_shares_add_up_to_the_whole_batch(how: str) -> None:
    per_token = torch.tensor([[1.0, 1.0, 0.0], [4.0, 4.0, 4.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    whole = aggregate(per_token, mask, how, constant=5)
    parts = [
        aggregate(per_token[rows], mask[rows], how, num_tokens=6, num_rows=3, constant=5)
        for rows in (slice(0, 2), slice(2, 3))
    ]
    assert sum(parts).item() == pytest.approx(whole.item())
    expected = {"token_mean": 16 / 6, "sequence_mean": (1 + 4 + 2) / 3, "constant_sum": 16 / 15}
    assert whole.item() == pytest.approx(expected[how])


def _two_sequences():
    """Token ratios pi/mu [2, 8 | pad] and [0.5, 0.5, 0.5]: sequence ratios 4 and 0.5."""
    logp = torch.log(torch.tensor([[0.2, 0.8, 0.9], [0.1, 0.2, 0.3]])).requires_grad_()
    ratios = torch.tensor([[2.0, 8.0, 1.0], [0.5, 0.5, 0.5]])
    behaviour = logp.detach() - torch.log(ratios)
    behaviour[0, 2] = 1e6  # padding, whatever it holds, never enters a sequence's ratio
    return logp, behaviour, torch.tensor([[1, 1, 0], [1, 1, 1]])


def test_sequence_ratio_is_the_geometric_mean_of_token_ratios() -> None:
    logp, behaviour, mask = _two_sequences()
    assert torch.allclose(sequence_ratio(logp, behaviour, mask), torch.tensor([[4.0], [0.5]]))


def test_gspo_clips_whole_sequences() -> None:
    logp, behaviour, mask = _two_sequences()
    out = policy_loss(
        "ppo_clip",
        logp,
        behaviour,
        torch.tensor([1.0, -1.0]),
        mask,
        ratio_level="sequence",
        aggregation="sequence_mean",
    )
    # Sequence 0: ratio 4, A = 1: -min(4, 1.2) = -1.2. Sequence 1: ratio 0.5, A = -1:
    # -min(-0.5, -0.8) = 0.8. Both take the clipped term, which has no gradient.
    assert out.loss.item() == pytest.approx((-1.2 + 0.8) / 2)
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert torch.equal(grad, torch.zeros_like(grad))
    assert out.clipped_fraction == pytest.approx(1.0)


def test_gspo_gradient_spreads_the_sequence_ratio_over_its_tokens() -> None:
    logp, behaviour, mask = _two_sequences()
    out = policy_loss(
        "ppo_clip", logp, behaviour, torch.tensor([1.0, 1.0]), mask, ratio_level="sequence", aggregation="sequence_mean"
    )
    # Sequence 1 (ratio 0.5, A = 1) is inside its clip side: loss -0.5, and
    # d(-s / 2) / d log pi_t = -s / (2 * 3) for each of its 3 tokens.
    assert out.loss.item() == pytest.approx((-1.2 - 0.5) / 2)
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert torch.allclose(grad, torch.tensor([[0.0, 0.0, 0.0], [-0.5 / 6] * 3]))


def test_sequence_level_tis_truncates_the_sequence_ratio_at_rho() -> None:
    logp, behaviour, mask = _two_sequences()
    out = policy_loss("aipo", logp, behaviour, torch.tensor([1.0, -1.0]), mask, rho=2.0, ratio_level="sequence")
    (grad,) = torch.autograd.grad(out.loss, logp)
    # Weights min(4, 2) = 2 and min(0.5, 2) = 0.5, detached; token mean over 5 tokens.
    assert torch.allclose(grad, torch.tensor([[-2 / 5, -2 / 5, 0.0], [0.5 / 5] * 3]))
    assert out.clipped_fraction == pytest.approx(2 / 5)


def _mismatched():
    """Token ratios [3, 1 | pad] and [0.25, 1, 1] on _inputs' log-probs."""
    logp, mask, adv = _inputs()
    behaviour = logp.detach() - torch.log(torch.tensor([[3.0, 1.0, 1.0], [0.25, 1.0, 1.0]]))
    behaviour[0, 2] = -1e6  # an infinite ratio on padding: neither dropped nor counted
    return logp, behaviour, mask, adv


def test_token_level_mis_drops_tokens_outside_the_band() -> None:
    logp, behaviour, mask, adv = _mismatched()
    out = policy_loss("reinforce", logp, behaviour, adv, mask, mis_low=0.5, mis_high=2.0)
    assert out.dropped_fraction == pytest.approx(2 / 5)
    # Left: token (0, 1) with A = 2, tokens (1, 1) and (1, 2) with A = -1; still over 5 tokens.
    expected = (-2 * math.log(0.2) + math.log(0.4) + math.log(0.3)) / 5
    assert out.loss.item() == pytest.approx(expected, rel=1e-5)
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert torch.allclose(grad, torch.tensor([[0.0, -2 / 5, 0.0], [0.0, 1 / 5, 1 / 5]]))


def test_sequence_level_mis_drops_whole_sequences() -> None:
    logp, behaviour, mask, adv = _mismatched()
    # Geometric means: sqrt(3 * 1) = 1.73 (kept), (0.25 * 1 * 1) ** (1 / 3) = 0.63 (dropped).
    out = policy_loss("reinforce", logp, behaviour, adv, mask, mis_low=0.7, mis_high=2.0, mis_level="sequence")
    assert out.dropped_fraction == pytest.approx(3 / 5)
    assert out.loss.item() == pytest.approx(-2 * (math.log(0.5) + math.log(0.2)) / 5, rel=1e-5)


def test_entropy_bonus_is_subtracted_per_token() -> None:
    logp, mask, adv = _inputs()
    entropy = torch.tensor([[1.0, 2.0, 9.0], [3.0, 4.0, 5.0]])  # 9 sits on padding
    base = policy_loss("reinforce", logp, logp.detach(), adv, mask)
    bonus = policy_loss("reinforce", logp, logp.detach(), adv, mask, entropy=entropy, entropy_coef=0.1)
    assert bonus.loss.item() == pytest.approx(base.loss.item() - 0.1 * (1 + 2 + 3 + 4 + 5) / 5)


@pytest.mark.parametrize(
    ("estimator", "value", "slope"),
    [
        # r = log pi - log ref = -0.5 at every token; slope = d estimate / d log pi. (k1 as a
        # loss is refused by the config: its gradient is zero in expectation.)
        ("k2", 0.5 * 0.25, -0.5),
        ("k3", math.exp(0.5) - 0.5 - 1, 1 - math.exp(0.5)),
    ],
)
def test_each_kl_estimator_as_a_loss(estimator: str, value: float, slope: float) -> None:
    logp, mask, adv = _inputs()
    ref = logp.detach() + 0.5
    base = policy_loss("reinforce", logp, logp.detach(), adv, mask)
    with_kl = policy_loss(
        "reinforce", logp, logp.detach(), adv, mask, ref_logp=ref, kl_coef=0.1, kl_estimator=estimator
    )
    assert with_kl.kl_ref == pytest.approx(value, rel=1e-5)
    assert with_kl.loss.item() == pytest.approx(base.loss.item() + 0.1 * value, rel=1e-5)
    (grad_base,) = torch.autograd.grad(base.loss, logp)
    (grad,) = torch.autograd.grad(with_kl.loss, logp)
    assert torch.allclose(grad - grad_base, 0.1 * slope / 5 * mask, atol=1e-6)


@pytest.mark.parametrize(
    ("estimator", "sums"),
    [
        # r = log mu - log ref: [0.2, -0.4 | pad] and [0.1, 0.1, 0.1].
        ("k1", [0.2 - 0.4, 0.3]),
        ("k2", [0.5 * (0.04 + 0.16), 0.5 * 3 * 0.01]),
        ("k3", [math.exp(-0.2) + 0.2 - 1 + math.exp(0.4) - 0.4 - 1, 3 * (math.exp(-0.1) + 0.1 - 1)]),
    ],
)
def test_each_kl_estimator_as_a_reward_penalty(estimator: str, sums: list[float]) -> None:
    ref = torch.log(torch.tensor([[0.5, 0.2, 0.7], [0.3, 0.3, 0.3]]))
    behaviour = ref + torch.tensor([[0.2, -0.4, 7.0], [0.1, 0.1, 0.1]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    kl = sequence_kl(behaviour, ref, mask, estimator)
    assert torch.allclose(kl, torch.tensor(sums), atol=1e-6)
    # One group of the two sequences, rewards 1 and 0, kl_coef 0.5; Dr. GRPO advantages.
    shaped = torch.tensor([[1.0, 0.0]]) - 0.5 * kl[None, :]
    adv = group_advantages(shaped, "grpo", scale_by_std=False)
    gap = (1 - 0.5 * sums[0]) - (0 - 0.5 * sums[1])
    assert torch.allclose(adv, torch.tensor([[gap / 2, -gap / 2]]), atol=1e-6)
