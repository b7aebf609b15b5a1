"""Continuous batching: prompts that join a running batch between decode steps, and rows that
leave it when they end, sample what they would alone (their behaviour log-probs are the trainer's
recomputed ones), tokens keep the version that sampled them across a weight swap, and a dropped
group leaves the others untouched."""

from __future__ import annotations

import pytest
import torch

from llamarl.config import ModelConfig
from llamarl.engine.continuous import RunningBatch, Sampler
from llamarl.engine.model import build_policy
from llamarl.engine.sampling import token_logprobs

PROMPTS = ["1+2=", "12+34=", "7+88=", "99+99=", "5+5=", "123+4="]


@pytest.fixture(scope="module")
def policy():
    return build_policy(ModelConfig(hidden_size=64, num_layers=2, num_heads=2), seed=1)


def _recomputed(policy, finished, temperature: float) -> torch.Tensor:
    batch = finished.batch
    with torch.no_grad():
        logp, _ = token_logprobs(
            policy, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask, temperature
        )
    return logp


def _drain(running: RunningBatch, version: int = 0) -> list:
    finished = []
    while len(running):
        finished += running.step(version)
    return finished


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_rows_joining_and_leaving_sample_what_the_trainer_recomputes(policy, temperature) -> None:
    sampler = Sampler(
        num_samples=3, max_new_tokens=12, temperature=temperature, generator=torch.Generator().manual_seed(0)
    )
    running = RunningBatch(policy, sampler)
    encoded = [policy.tokenizer(p).input_ids for p in PROMPTS]
    running.admit([(0, encoded[0]), (1, encoded[1])])
    finished, admitted, lengths_seen = [], 2, set()
    while len(running) or admitted < len(encoded):
        finished += running.step(0)
        lengths_seen.add(len(running))
        if admitted < len(encoded) and running.num_groups < 2:  # a prompt joins mid-batch
            running.admit([(admitted, encoded[admitted])])
            admitted += 1
    assert sorted(f.key for f in finished) == list(range(len(encoded)))
    assert len(lengths_seen) > 2, "rows must have left and joined the batch"
    lengths = torch.cat([f.batch.completion_mask.sum(1) for f in finished])
    assert lengths.min() < lengths.max(), "completions of different lengths"
    for group in finished:
        assert group.batch.prompt_ids[0].tolist() == encoded[group.key]
        logp = _recomputed(policy, group, temperature)
        assert torch.allclose(logp, group.batch.logprobs, atol=1e-4)


def test_greedy_rows_follow_the_argmax_of_the_recomputed_distribution(policy) -> None:
    running = RunningBatch(policy, Sampler(num_samples=1, max_new_tokens=10, greedy=True))
    encoded = [policy.tokenizer(p).input_ids for p in PROMPTS]
    running.admit([(i, p) for i, p in enumerate(encoded[:3])])
    running.step(0)
    running.admit([(i, p) for i, p in enumerate(encoded[3:], start=3)])  # longer and shorter
    for group in _drain(running):
        batch = group.batch
        ids = torch.cat([batch.prompt_ids, batch.completion_ids], 1)
        with torch.no_grad():
            logits = policy.model(input_ids=ids).logits[0, batch.prompt_ids.shape[1] - 1 : -1]
        best = torch.log_softmax(logits, -1).max(-1).values
        chosen = batch.logprobs[0]
        real = batch.completion_mask[0].bool()
        assert torch.allclose(chosen[real], best[real], atol=1e-4)


def test_min_new_tokens_bans_eos_per_row(policy) -> None:
    sampler = Sampler(num_samples=4, max_new_tokens=9, min_new_tokens=8, generator=torch.Generator().manual_seed(3))
    running = RunningBatch(policy, sampler)
    running.admit([(0, policy.tokenizer("1+2=").input_ids)])
    running.step(0)
    running.admit([(1, policy.tokenizer("12+34=").input_ids)])
    for group in _drain(running):
        assert group.batch.completion_mask.sum(1).min() >= 8


def test_tokens_keep_the_version_that_sampled_them_across_a_swap(policy) -> None:
    sampler = Sampler(num_samples=2, max_new_tokens=6, min_new_tokens=6, generator=torch.Generator().manual_seed(0))
    running = RunningBatch(policy, sampler)
    running.admit([("a", policy.tokenizer("1+2=").input_ids)])
    for _ in range(2):
        running.step(4)
    assert running.oldest_version("a") == 4
    (group,) = _drain(running, version=5)
    assert group.versions[0].tolist() == [4, 4, 5, 5, 5, 5]


def test_a_dropped_group_leaves_the_others_sampling_correctly(policy) -> None:
    sampler = Sampler(num_samples=2, max_new_tokens=8, generator=torch.Generator().manual_seed(1))
    running = RunningBatch(policy, sampler)
    encoded = [policy.tokenizer(p).input_ids for p in PROMPTS[:3]]
    running.admit(list(enumerate(encoded)))
    running.step(0)
    assert running.drop(1) == 2, "one token of each of its two samples was thrown away"
    running.admit([(1, encoded[1])])  # restarted from its prompt
    finished = _drain(running)
    assert sorted(f.key for f in finished) == [0, 1, 2]
    for group in finished:
        assert torch.allclose(_recomputed(policy, group, 1.0), group.batch.logprobs, atol=1e-4)
    with pytest.raises(ValueError, match="already running"):
        running.admit([(0, encoded[0])])
        running.admit([(0, encoded[0])])


def test_in_flight_restarts_groups_whose_oldest_token_is_too_old(policy) -> None:
    from llamarl.roles.in_flight import InFlight
    from llamarl.store import Ticket
    from llamarl.tasks import Example

    sampler = Sampler(num_samples=2, max_new_tokens=6, min_new_tokens=6, generator=torch.Generator().manual_seed(0))
    in_flight = InFlight(policy, RunningBatch(policy, sampler))
    in_flight.admit([Ticket(7, 0, False)], [Example(7, "1+2=", "3")])
    in_flight.step(3)
    in_flight.admit([Ticket(8, 1, False)], [Example(8, "12+34=", "46")])
    in_flight.step(4)
    # ticket 7 began at version 3: its 2 samples' 2 tokens each are thrown away
    assert in_flight.restart_older_than(4) == (1, 4)
    done = []
    while len(in_flight):
        done += in_flight.step(5)
    by_ticket = {f.ticket.ticket_id: f for f in done}
    assert set(by_ticket) == {7, 8}
    versions = {t: f.group.token_versions.to_numpy() for t, f in by_ticket.items()}
    assert versions[7].min() == 5, "the restarted group holds no token of version 3"
    assert versions[8].min() == 4 and versions[8].max() == 5
    assert by_ticket[8].group.rollout_id == "8.1"
    assert by_ticket[7].num_tokens == 12
