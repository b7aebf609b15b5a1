"""Poisoned or malformed rollouts stop at the trainer's door, counted by reason, and a non-finite
loss never reaches the weights."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from llamarl.bus import MemoryHub
from llamarl.config import parse_config
from llamarl.engine.rollouts import train_group
from llamarl.errors import NonFiniteError, ProtocolError
from llamarl.protocol import ScoredGroup, TypedArray
from llamarl.roles import build
from llamarl.roles.admission import check_scored
from llamarl.store import MemoryStore
from llamarl.tasks import make_prompt_set
from llamarl.training.learner import Learner
from llamarl.training.sft import starting_policy
from llamarl.weightsync import make_publisher
from tests.factories import rollout_group
from tests.memory_runtime import memory_runtime

MODEL = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32, "max_position_embeddings": 32}


def _array(values: np.ndarray) -> TypedArray:
    return TypedArray.from_numpy(np.ascontiguousarray(values))


def _scored(ticket_id: int, **group_changes: Any) -> ScoredGroup:
    group = dataclasses.replace(rollout_group(ticket_id), **group_changes)
    rewards = _array(np.array([1.0, 0.0], dtype=np.float32))
    return ScoredGroup(group=group, rewards=rewards, scorer="test")


def _poisoned() -> dict[str, ScoredGroup]:
    good = rollout_group(0)
    logprobs = good.behaviour_logprobs.to_numpy().copy()
    logprobs[0, 1] = np.nan
    tokens = good.completion_tokens.to_numpy().copy()
    tokens[1, 0] = 10**6
    versions = good.token_versions.to_numpy() + 999_999
    return {
        "bad_logprob": _scored(1, behaviour_logprobs=_array(logprobs)),
        "token_out_of_vocab": _scored(2, completion_tokens=_array(tokens)),
        "bad_version": _scored(3, token_versions=_array(versions)),
        "bad_length": _scored(4, completion_lengths=_array(np.array([9, 2], dtype=np.int32))),
        "bad_shape": _scored(5, token_versions=_array(np.zeros((2, 3), dtype=np.int32))),
        "bad_reward": ScoredGroup(rollout_group(6), _array(np.array([np.inf, 0.0], dtype=np.float32)), "test"),
    }


def test_the_trainer_refuses_poisoned_groups_counts_them_and_keeps_a_good_one(
    tmp_path: Path,
) -> None:
    config = parse_config(
        {
            "run_id": "door",
            "run_dir": str(tmp_path),
            "model": MODEL,
            "sync": {"transport": "local"},
            "trainer": {"checkpoint_every": 0, "sft_steps": 0},
        }
    )
    store = MemoryStore()
    hub = MemoryHub("door")
    runtime = memory_runtime("trainer", config, "trainer", store, hub)
    trainer = build.trainer(runtime, make_publisher(config.sync, "door"))
    try:
        for scored in _poisoned().values():
            trainer.admit(scored)
        trainer.admit(_scored(7))
        runtime.rejections.flush(force=True)
        assert [g.group.ticket_id for g in trainer.buffer] == [7]
        assert runtime.counters["refused_groups"] == len(_poisoned())
        assert store.rejected() == {f"trainer.{reason}": 1 for reason in _poisoned()}
    finally:
        trainer.close()
        runtime.close()


def test_a_non_finite_loss_skips_the_update_and_leaves_the_weights_untouched(
    tmp_path: Path,
) -> None:
    config = parse_config({"model": MODEL, "trainer": {"sft_steps": 0}})
    policy = starting_policy(config, make_prompt_set(config.task, config.seed))
    learner = Learner(policy, config.algorithm, config.trainer, temperature=1.0)
    before = [p.detach().clone() for p in policy.model.parameters()]
    group = train_group(_scored(0))
    poisoned = dataclasses.replace(group, behaviour_logprobs=torch.full_like(group.behaviour_logprobs, float("nan")))
    record = learner.step([poisoned])
    assert record["skipped_update"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, policy.model.parameters(), strict=True))
    assert learner.step([group])["skipped_update"] == 0.0


@pytest.mark.parametrize("reason", sorted(_poisoned()))
def test_each_poison_is_refused_for_its_own_reason(reason: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        check_scored(_poisoned()[reason], vocab_size=1000, policy_version=5)
    assert caught.value.reason == reason
    check_scored(_scored(0), vocab_size=1000, policy_version=5)


def test_an_update_that_makes_the_weights_non_finite_stops_the_trainer() -> None:
    config = parse_config({"model": MODEL, "trainer": {"sft_steps": 0}})
    policy = starting_policy(config, make_prompt_set(config.task, config.seed))
    learner = Learner(policy, config.algorithm, config.trainer, temperature=1.0)
    group = train_group(_scored(0))
    assert learner.step([group])["skipped_update"] == 0.0
    first = next(iter(learner.optimizer.state.values()))
    first["exp_avg"].fill_(float("inf"))  # a poisoned optimizer state: the next step overflows
    with pytest.raises(NonFiniteError, match="neither published nor checkpointed"):
        learner.step([group])
