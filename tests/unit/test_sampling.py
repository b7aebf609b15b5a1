"""Behaviour log-probs recorded at sampling equal the trainer's recomputed ones."""

from __future__ import annotations

import math

import pytest
import torch

from llamarl.config import ModelConfig
from llamarl.engine.model import build_policy
from llamarl.engine.sampling import sample, sampling_logprobs, token_logprobs
from llamarl.errors import EmptyContextError

PROMPTS = ["1+2=", "12+34=", "7+88=", "99+99="]  # different lengths: left padding in the batch


@pytest.fixture(scope="module")
def policy():
    return build_policy(ModelConfig(hidden_size=64, num_layers=2, num_heads=2), seed=1)


def _run(policy, temperature: float, top_p: float):
    prompts = [policy.tokenizer(p).input_ids for p in PROMPTS]
    generator = torch.Generator().manual_seed(0)
    batch = sample(
        policy,
        prompts,
        num_samples=3,
        max_new_tokens=8,
        temperature=temperature,
        top_p=top_p,
        generator=generator,
    )
    with torch.no_grad():
        logp, _ = token_logprobs(
            policy,
            batch.prompt_ids,
            batch.prompt_mask,
            batch.completion_ids,
            batch.completion_mask,
            temperature,
        )
    return batch, logp


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_recomputed_logprobs_match_behaviour_logprobs(policy, temperature: float) -> None:
    batch, logp = _run(policy, temperature, 1.0)
    assert batch.prompt_mask.sum(1).unique().numel() > 1, "the batch must contain left padding"
    assert batch.completion_mask.sum() > 20
    assert torch.allclose(logp, batch.logprobs, atol=1e-4)


def test_top_p_mu_is_the_renormalised_nucleus(policy) -> None:
    """Documented: log mu = log pi - log(kept nucleus mass) >= log pi; equal when top_p = 1."""
    batch, logp = _run(policy, 1.0, 0.6)
    real = batch.completion_mask.bool()
    gap = (batch.logprobs - logp)[real]
    assert (gap >= -1e-5).all()
    assert gap.max() > 1e-3, "truncation must show in mu"
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    truncated = sampling_logprobs(logits, 1.0, 0.6)
    full = torch.log_softmax(logits, -1)
    kept = full.exp()[0, :1].sum()  # 0.61 of the mass sits in the top token alone
    assert truncated[0, 0].item() == pytest.approx(0.0, abs=1e-6)
    assert math.isinf(truncated[0, 1].item())
    assert (truncated[0, 0] - full[0, 0]).item() == pytest.approx(-math.log(kept), abs=1e-5)


def test_eos_ends_a_completion_and_padding_has_zero_logprob(policy) -> None:
    batch, _ = _run(policy, 1.0, 1.0)
    for ids, mask, lp in zip(batch.completion_ids, batch.completion_mask, batch.logprobs, strict=True):
        length = int(mask.sum())
        assert (mask[:length] == 1).all() and (mask[length:] == 0).all()
        assert (lp[length:] == 0).all()
        if length < ids.shape[0]:
            assert ids[length - 1] == policy.eos_id


def test_min_new_tokens_holds_eos_back_and_pi_masks_it_the_same_way(policy) -> None:
    prompts = [policy.tokenizer(p).input_ids for p in PROMPTS]
    # A model that loves EOS: without the ban almost every completion would end at once.
    with torch.no_grad():
        policy.model.lm_head.weight[policy.eos_id] += 5.0
    try:
        batch = sample(
            policy,
            prompts,
            num_samples=3,
            max_new_tokens=6,
            min_new_tokens=4,
            generator=torch.Generator().manual_seed(0),
        )
        logp, _ = token_logprobs(
            policy,
            batch.prompt_ids,
            batch.prompt_mask,
            batch.completion_ids,
            batch.completion_mask,
            min_new_tokens=4,
        )
    finally:
        with torch.no_grad():
            policy.model.lm_head.weight[policy.eos_id] -= 5.0
    assert (batch.completion_ids[:, :4] != policy.eos_id).all()
    assert (batch.completion_mask.sum(1) >= 5).all()
    assert (batch.completion_ids[:, 4] == policy.eos_id).any(), "EOS allowed from token 5"
    assert torch.allclose(logp, batch.logprobs, atol=1e-4)


def test_a_context_of_no_tokens_is_refused_with_a_clear_error(policy) -> None:
    # Alone it cannot be reshaped; beside others it would sample from an empty attention row.
    for prompts in ([[]], [policy.tokenizer("1+2=").input_ids, []]):
        with pytest.raises(EmptyContextError, match="no tokens"):
            sample(policy, prompts, num_samples=1, max_new_tokens=2)
