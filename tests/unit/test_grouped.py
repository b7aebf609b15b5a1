"""The trainer's shared-prompt, bucketed forward gives the loss and gradients of the plain
one-pass computation over the padded batch (within 1e-5), however the groups are cut, with
every loss option."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from llamarl.algorithms.advantages import group_advantages
from llamarl.algorithms.kl import sequence_kl
from llamarl.algorithms.losses import policy_loss
from llamarl.config import AlgorithmConfig, ModelConfig, TrainerConfig
from llamarl.engine.grouped import TrainGroup, grouped_logprobs, micro_batches, stack
from llamarl.engine.model import build_policy
from llamarl.engine.sampling import left_pad, sample, token_logprobs
from llamarl.training.learner import Learner

PROMPTS = ["1+2=", "12+34=", "7+88=", "99+99=", "5+5="]  # three prompt lengths
NUM_SAMPLES = 3
MIN_NEW = 2


def _groups(policy) -> list[TrainGroup]:
    prompts = [policy.tokenizer(p).input_ids for p in PROMPTS]
    batch = sample(
        policy,
        prompts,
        num_samples=NUM_SAMPLES,
        max_new_tokens=7,
        min_new_tokens=MIN_NEW,
        generator=torch.Generator().manual_seed(3),
    )
    rng = torch.Generator().manual_seed(4)
    groups = []
    for g, prompt in enumerate(prompts):
        rows = slice(g * NUM_SAMPLES, (g + 1) * NUM_SAMPLES)
        # Cut completions to lengths that differ within and across groups (as EOS would).
        lengths = torch.tensor([max(MIN_NEW + 1, 7 - g - r) for r in range(NUM_SAMPLES)])
        mask = (torch.arange(7)[None, :] < lengths[:, None]).long() * batch.completion_mask[rows]
        noise = torch.randn(mask.shape, generator=rng)
        # Groups arrive padded to their own widths (a generator pads a batch to its longest).
        width = int(lengths.max())
        groups.append(
            TrainGroup(
                prompt_ids=torch.tensor(prompt),
                completion_ids=torch.where(mask.bool(), batch.completion_ids[rows], 0)[:, :width],
                completion_mask=mask[:, :width],
                # Off-policy behaviour log-probs, so importance ratios are not all 1.
                behaviour_logprobs=((batch.logprobs[rows] + 0.4 * noise) * mask)[:, :width],
                rewards=torch.randint(0, 2, (NUM_SAMPLES,), generator=rng).float(),
            )
        )
    return groups


def _plain_loss(policy, reference, groups, algorithm: AlgorithmConfig) -> torch.Tensor:
    """The reference computation: every row's prompt + completion in one padded pass."""
    rows = [g.prompt_ids.tolist() for g in groups for _ in range(NUM_SAMPLES)]
    prompt_ids, prompt_mask = left_pad(rows, policy.pad_id)
    width = max(g.completion_ids.shape[1] for g in groups)

    def padded(name: str) -> torch.Tensor:
        parts = [getattr(g, name) for g in groups]
        return torch.cat([F.pad(t, (0, width - t.shape[1])) for t in parts])

    args = (prompt_ids, prompt_mask, padded("completion_ids"), padded("completion_mask"))
    logp, entropy = token_logprobs(policy, *args, temperature=0.9, min_new_tokens=MIN_NEW)
    ref_logp = None
    if reference is not None:
        with torch.no_grad():
            ref_logp, _ = token_logprobs(reference, *args, temperature=0.9, min_new_tokens=MIN_NEW)
    rewards = torch.stack([g.rewards for g in groups])
    if ref_logp is not None and algorithm.kl_in == "reward":
        kl = sequence_kl(padded("behaviour_logprobs"), ref_logp, args[3], algorithm.kl_estimator)
        rewards = rewards - algorithm.kl_coef * kl.view_as(rewards)
    advantages = group_advantages(rewards, algorithm.advantage, algorithm.grpo_scale_by_std)
    out = policy_loss(
        algorithm.loss,
        logp,
        padded("behaviour_logprobs"),
        advantages.flatten(),
        args[3],
        ref_logp=ref_logp,
        entropy=entropy,
        **algorithm.model_dump(exclude={"loss"}),
    )
    return out.loss


@pytest.mark.parametrize(
    ("loss", "aggregation", "kl_coef", "micro_tokens", "checkpointing"),
    [
        ("aipo", "token_mean", 0.0, 4096, False),
        ("aipo", "sequence_mean", 0.0, 30, False),
        ("ppo_clip", "token_mean", 0.1, 30, False),
        # Recomputed blocks must see the prompt's cache as their first pass did.
        ("aipo", "token_mean", 0.1, 30, True),
    ],
)
def test_grouped_step_equals_plain_loss_and_gradients(
    loss: str, aggregation: str, kl_coef: float, micro_tokens: int, checkpointing: bool
) -> None:
    algorithm = AlgorithmConfig(loss=loss, aggregation=aggregation, kl_coef=kl_coef, rho=1.2)
    stats = _grouped_step_against_plain(algorithm, micro_tokens, checkpointing)
    assert stats["ratio_max"] > 1.0 and 0 < stats["clipped_fraction"] < 1


@pytest.mark.parametrize(
    "options",
    [
        # GSPO with a decoupled (DAPO) clip range.
        {
            "loss": "ppo_clip",
            "ratio_level": "sequence",
            "aggregation": "sequence_mean",
            "clip_low": 0.9,
            "clip_high": 1.1,
        },
        # Dr. GRPO: constant_sum, no std; with an entropy bonus.
        {
            "rho": 1.2,
            "aggregation": "constant_sum",
            "loss_constant": 7,
            "grpo_scale_by_std": False,
            "entropy_coef": 0.05,
        },
        # Token-level MIS with a k2 KL in the loss.
        {"rho": 1.2, "mis_low": 0.8, "mis_high": 1.25, "kl_coef": 0.1, "kl_estimator": "k2"},
        # Sequence-level MIS with a k1 KL in the reward.
        {
            "loss": "reinforce",
            "mis_low": 0.95,
            "mis_high": 1.05,
            "mis_level": "sequence",
            "kl_coef": 0.5,
            "kl_estimator": "k1",
            "kl_in": "reward",
        },
        # The user's own loss and advantage (examples/own_algorithm.py), by module:function.
        {
            "loss": "examples.own_algorithm:cispo",
            "clip_high": 1.1,
            "advantage": "examples.own_algorithm:group_mean_batch_std",
        },
    ],
)
def test_grouped_step_with_loss_options_equals_plain_loss(options: dict[str, object]) -> None:
    algorithm = AlgorithmConfig.model_validate(options)
    stats = _grouped_step_against_plain(algorithm, 30, False)
    if algorithm.loss != "reinforce":
        assert 0 < stats["clipped_fraction"] < 1
    if algorithm.mis_low is not None:
        assert 0 < stats["mis_dropped_fraction"] < 1
    if algorithm.kl_coef:
        assert stats["kl_ref"] != 0


def _grouped_step_against_plain(algorithm: AlgorithmConfig, micro_tokens: int, checkpointing: bool) -> dict[str, float]:
    """The learner's step on `_groups` in micro-batches of `micro_tokens`: its loss and
    gradients against `_plain_loss`'s (within 1e-5); its stats."""
    trainer = TrainerConfig(
        lr=1e-3, micro_batch_tokens=micro_tokens, max_grad_norm=1e6, activation_checkpointing=checkpointing
    )
    policy = build_policy(ModelConfig(hidden_size=32, num_layers=2, num_heads=2), seed=1)
    groups = _groups(policy)
    assert len({int(g.prompt_ids.shape[0]) for g in groups}) == 3
    assert len({g.width for g in groups}) > 1, "completion lengths must differ"
    assert len({g.completion_ids.shape[1] for g in groups}) > 1, "and so must padded widths"
    cuts = micro_batches(groups, micro_tokens)
    assert sorted(i for cut in cuts for i in cut) == list(range(len(groups)))
    if micro_tokens < 100:
        assert len(cuts) >= 4, "small budgets must split the batch"

    kl_coef = algorithm.kl_coef
    reference = build_policy(ModelConfig(hidden_size=32, num_layers=2, num_heads=2), seed=2)
    if kl_coef:
        # Perturb the reference so the KL term is not zero.
        reference.model.load_state_dict(policy.model.state_dict())
        with torch.no_grad():
            for param in reference.model.parameters():
                param.add_(0.01 * torch.randn_like(param))
    plain = _plain_loss(policy, reference if kl_coef else None, groups, algorithm)
    plain.backward()
    expected = {n: p.grad.clone() for n, p in policy.model.named_parameters()}
    policy.model.zero_grad(set_to_none=True)

    learner = Learner(
        policy, algorithm, trainer, temperature=0.9, reference=reference if kl_coef else None, min_new_tokens=MIN_NEW
    )
    learner.optimizer.step = lambda *a, **k: None  # keep the weights to read the gradients
    stats = learner.step(groups)
    assert stats["loss"] == pytest.approx(float(plain.detach()), abs=1e-5)
    assert abs(float(plain.detach())) > 1e-4, "a vanishing loss would prove nothing"
    wrapped = sum(n.endswith("_checkpoint_wrapped_module") for n, _ in policy.model.named_modules())
    assert wrapped == (2 if checkpointing else 0), "every block is checkpointed, or none"
    for name, param in policy.model.named_parameters():
        name = name.replace("_checkpoint_wrapped_module.", "")
        assert param.grad is not None, name
        assert torch.allclose(param.grad, expected[name], atol=1e-5, rtol=1e-4), name
    return stats


def test_micro_batches_keep_one_prompt_length_and_respect_the_budget() -> None:
    policy = build_policy(ModelConfig(hidden_size=32, num_layers=1, num_heads=2), seed=1)
    groups = _groups(policy)
    for cut in micro_batches(groups, 40):
        assert len({int(groups[i].prompt_ids.shape[0]) for i in cut}) == 1
        cost = sum(NUM_SAMPLES * (groups[i].prompt_ids.shape[0] + groups[i].width) for i in cut)
        assert len(cut) == 1 or cost <= 40


def test_a_prompt_repeated_before_each_completion_gives_the_shared_prompts_logprobs() -> None:
    """Sharded ranks take each block once (the prompt repeated): the same log-probs and
    gradients as the shared prompt's two passes."""
    policy = build_policy(ModelConfig(hidden_size=32, num_layers=2, num_heads=2), seed=1)
    groups = _groups(policy)
    results = []
    for share_prompt in (True, False):
        policy.model.zero_grad(set_to_none=True)
        for cut in micro_batches(groups, 30):
            batch = stack([groups[i] for i in cut])
            logp, entropy = grouped_logprobs(policy, batch, 0.9, MIN_NEW, share_prompt)
            (logp.sum() + entropy.sum()).backward()
            results.append((logp.detach(), entropy.detach()))
        results.append({n: p.grad.clone() for n, p in policy.model.named_parameters()})
    half = len(results) // 2
    for shared, repeated in zip(results[: half - 1], results[half:-1], strict=True):
        assert shared[0].shape == repeated[0].shape
        assert torch.allclose(shared[0], repeated[0], atol=1e-5)
        assert torch.allclose(shared[1], repeated[1], atol=1e-4)
    for name, grad in results[half - 1].items():
        assert torch.allclose(grad, results[-1][name], atol=1e-5, rtol=1e-4), name
