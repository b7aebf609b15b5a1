"""The `sampling` options against hand computations: the group-signal filter and its cap,
overlong shaping (the length penalty, truncation, a dropped completion's place in the loss),
and the config's refusals (one line, exit 2)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from llamarl.algorithms.advantages import group_advantages
from llamarl.algorithms.losses import policy_loss
from llamarl.algorithms.overlong import OverlongShaping, length_penalty, overlong_shaping, truncated
from llamarl.config import SamplingConfig, parse_config
from llamarl.engine.rollouts import train_group
from llamarl.engine.sampling import token_logprobs
from llamarl.errors import ConfigError
from llamarl.protocol import ScoredGroup, TypedArray
from llamarl.roles.group_signal import SignalFilter, has_signal
from llamarl.tasks import make_prompt_set
from llamarl.training.learner import Learner
from llamarl.training.sft import starting_policy
from tests.factories import rollout_group

EOS = 2
MODEL = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32, "max_position_embeddings": 32}


def _scored(tokens: list[list[int]], lengths: list[int], rewards: list[float]) -> ScoredGroup:
    """A group of completions `tokens` (right-padded with 0) of `lengths`, scored `rewards`."""
    group = dataclasses.replace(
        rollout_group(0, num_samples=len(tokens), length=len(tokens[0])),
        completion_tokens=TypedArray.from_numpy(np.array(tokens, dtype=np.int32)),
        completion_lengths=TypedArray.from_numpy(np.array(lengths, dtype=np.int32)),
    )
    return ScoredGroup(group, TypedArray.from_numpy(np.array(rewards, np.float32)), "test")


def test_a_group_has_signal_when_any_two_rewards_differ() -> None:
    assert not has_signal(np.array([1.0, 1.0, 1.0], np.float32))
    assert not has_signal(np.array([0.0, 0.0], np.float32))
    assert has_signal(np.array([0.0, 0.0, 0.25], np.float32))


def test_the_filter_skips_groups_without_signal_up_to_its_cap_per_step() -> None:
    signal = SignalFilter(enabled=True, max_skips=2)
    flat, mixed = np.array([1.0, 1.0]), np.array([1.0, 0.0])
    assert [signal.skips(r) for r in (flat, mixed, flat, flat, flat)] == [
        True,
        False,
        True,
        False,
        False,  # the third group without signal: the cap is reached
    ]
    assert signal.step_done() == 2 and signal.num_skipped == 0
    assert signal.skips(flat), "each step may skip its own share again"
    off = SignalFilter(enabled=False, max_skips=10)
    assert not off.skips(flat) and off.step_done() == 0


def test_the_cap_is_a_multiple_of_the_step() -> None:
    sampling = {"dynamic_sampling": True, "max_draws_factor": 3}
    config = parse_config({"trainer": {"prompts_per_step": 5}, "sampling": sampling}, environ={})
    signal = SignalFilter.of(config)
    assert (signal.enabled, signal.max_skips) == (True, 10)  # draws: 5 trained + 10 skipped


def test_the_length_penalty_is_linear_across_the_band() -> None:
    lengths = np.array([1, 8, 9, 10, 6], np.int32)
    # max 10, band 0.2: no penalty up to 8 tokens, half at 9, all (1.5) at 10.
    assert length_penalty(lengths, 10, 0.2, 1.5).tolist() == [0.0, 0.0, -0.75, -1.5, 0.0]
    # The whole length is the band: 6 of 10 tokens is 60% of the way.
    np.testing.assert_allclose(length_penalty(lengths, 10, 1.0, 1.0), [-0.1, -0.8, -0.9, -1, -0.6])


def test_truncated_means_the_limit_reached_without_eos() -> None:
    tokens = np.array([[5, 6, 7, 8], [5, 6, 7, EOS], [5, EOS, 0, 0], [5, 6, 7, 0]])
    lengths = np.array([4, 4, 2, 3])
    assert truncated(tokens, lengths, 4, EOS).tolist() == [True, False, False, False]


def test_shaping_changes_the_rewards_or_the_loss_mask_never_both() -> None:
    scored = _scored([[5, 6, 7, 8], [5, 6, 7, EOS], [5, EOS, 0, 0]], [4, 4, 2], [1.0, 1.0, 0.0])
    penalty = OverlongShaping("penalty", max_new_tokens=4, eos_id=EOS, band=0.5, penalty=1.0)
    shaped = train_group(scored, penalty)
    assert shaped.rewards.tolist() == [0.0, 0.0, 0.0], "4 of 4 tokens: the whole penalty"
    assert shaped.completion_mask.sum(-1).tolist() == [4, 4, 2]
    dropped = train_group(scored, OverlongShaping("drop", 4, EOS, 0.5, 1.0))
    assert dropped.rewards.tolist() == [1.0, 1.0, 0.0]
    assert dropped.completion_mask.sum(-1).tolist() == [0, 4, 2], "only the truncated one goes"
    plain = train_group(scored)
    assert plain.rewards.tolist() == [1.0, 1.0, 0.0] and plain.width == 4
    off = overlong_shaping(SamplingConfig(), max_new_tokens=4, eos_id=EOS)
    assert off is None


def test_a_dropped_completion_is_out_of_the_loss_and_out_of_the_row_count() -> None:
    """Sequence mean over the completions the loss takes in, each with the advantage its whole
    group gives it (the dropped reward still enters the baseline)."""
    config = parse_config({"model": MODEL, "trainer": {"sft_steps": 0}, "algorithm": {"aggregation": "sequence_mean"}})
    policy = starting_policy(config, make_prompt_set(config.task, config.seed))
    learner = Learner(policy, config.algorithm, config.trainer, temperature=1.0)
    scored = _scored([[5, 6, 7, 8], [5, 6, 7, EOS], [5, EOS, 0, 0]], [4, 4, 2], [1.0, 0.0, 0.5])
    group = train_group(scored, OverlongShaping("drop", 4, EOS, 0.5, 1.0))
    advantages = group_advantages(group.rewards[None, :], "grpo")[0]
    kept = slice(1, 3)
    prompts = group.prompt_ids[None].repeat(2, 1)
    with torch.no_grad():
        logp, _ = token_logprobs(
            policy, prompts, torch.ones_like(prompts), group.completion_ids[kept], group.completion_mask[kept]
        )
        expected = policy_loss(
            "aipo",
            logp,
            group.behaviour_logprobs[kept],
            advantages[kept],
            group.completion_mask[kept],
            rho=config.algorithm.rho,
            aggregation="sequence_mean",
        ).loss
    record = learner.step([group])
    assert record["loss"] == pytest.approx(float(expected), abs=1e-5)
    assert record["num_tokens"] == 6, "the dropped completion's 4 tokens are not trained"
    nothing = train_group(
        _scored([[5, 6, 7, 8]] * 3, [4, 4, 4], [1.0, 0.0, 0.0]), OverlongShaping("drop", 4, EOS, 0.5, 1.0)
    )
    assert nothing.width == 1, "a group with nothing in the loss still stacks"
    assert np.isfinite(learner.step([nothing, group])["loss"])


@pytest.mark.parametrize(
    ("sampling", "line"),
    [
        ({"overlong_band": 0}, "sampling.overlong_band: Input should be greater than 0"),
        ({"overlong_band": 1.5}, "sampling.overlong_band: Input should be less than or equal to 1"),
        ({"max_draws_factor": 1}, "sampling.max_draws_factor: Input should be greater than or equal to 2"),
        ({"overlong": "cut"}, "sampling.overlong: Input should be 'off', 'penalty' or 'drop'"),
    ],
)
def test_bad_sampling_values_are_refused_in_one_line(sampling: dict[str, object], line: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"sampling": sampling}, environ={})
    assert str(caught.value) == line


def test_overlong_shaping_with_every_completion_truncated_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(
            {"generation": {"max_new_tokens": 6, "min_new_tokens": 6}, "sampling": {"overlong": "drop"}}, environ={}
        )
    assert str(caught.value) == (
        "sampling.overlong, generation.min_new_tokens: with EOS banned for all 6 tokens every "
        "completion is truncated, so overlong shaping would treat them all alike"
    )
    assert parse_config(
        {"generation": {"max_new_tokens": 6, "min_new_tokens": 5}, "sampling": {"overlong": "drop"}}, environ={}
    ).sampling


def test_config_check_refuses_a_band_outside_0_1_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from workers.cli import main

    path = tmp_path / "bad.yaml"
    path.write_text("sampling:\n  overlong: penalty\n  overlong_band: 1.2\n")
    assert main(["config", "check", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip().splitlines() == [
        "config error: sampling.overlong_band: Input should be less than or equal to 1"
    ]
