"""Trainer checkpoints round-trip model, optimizer, RNG, counters and buffer; writes are atomic,
only the newest K stay, and another run's checkpoint is refused. Journals rewind to a step."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from llamarl.config import ModelConfig
from llamarl.engine.model import build_policy
from llamarl.errors import ConfigError
from llamarl.protocol import ScoredGroup, TypedArray
from llamarl.roles.journal import rewind
from llamarl.training.checkpoint import CheckpointStore, TrainerState, take_snapshot
from tests.factories import rollout_group

TINY = ModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)


def _trained_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    loss = sum(p.square().sum() for p in model.parameters())
    loss.backward()
    optimizer.step()
    return optimizer


def _scored(ticket_id: int) -> ScoredGroup:
    rewards = TypedArray.from_numpy(torch.tensor([1.0, 0.0]).numpy())
    return ScoredGroup(group=rollout_group(ticket_id), rewards=rewards, scorer="exact_int")


def test_round_trip_restores_everything(tmp_path: Path) -> None:
    policy = build_policy(TINY, seed=1)
    optimizer = _trained_optimizer(policy.model)
    store = CheckpointStore(tmp_path, "run-a", keep=2)
    buffer = [_scored(4), _scored(9)]
    state = TrainerState(7, 5, {"max_staleness_seen": 1, "initial_accuracy": 0.25}, buffer)
    torch.manual_seed(123)
    random.seed(456)
    store.save(take_snapshot(policy, None, optimizer, state))
    expected_torch, expected_python = torch.rand(3), random.random()

    restored = CheckpointStore(tmp_path, "run-a", keep=2).load(store.latest() or tmp_path)
    assert torch.equal(torch.rand(3), expected_torch) and random.random() == expected_python
    for name, tensor in policy.model.state_dict().items():
        assert torch.equal(restored.policy.model.state_dict()[name], tensor), name
    fresh = torch.optim.AdamW(restored.policy.model.parameters(), lr=0.01)
    fresh.load_state_dict(restored.optimizer_state)
    for before, after in zip(
        optimizer.state_dict()["state"].values(), fresh.state_dict()["state"].values(), strict=True
    ):
        assert torch.equal(before["exp_avg_sq"], after["exp_avg_sq"])
    assert (restored.state.step, restored.state.policy_version) == (7, 5)
    assert restored.state.counters == state.counters
    assert restored.state.buffer == buffer
    assert restored.reference is None


def test_keeps_newest_k_and_ignores_unfinished(tmp_path: Path) -> None:
    policy = build_policy(TINY, seed=1)
    optimizer = torch.optim.AdamW(policy.model.parameters())
    store = CheckpointStore(tmp_path, "run-a", keep=2)
    for step in (5, 10, 15):
        store.save(take_snapshot(policy, None, optimizer, TrainerState(step, step)))
    assert [p.name for p in store.complete()] == ["step-00000010", "step-00000015"]
    (tmp_path / "step-00000020.tmp").mkdir()  # a write a crash interrupted
    latest = store.latest()
    assert latest is not None and latest.name == "step-00000015"
    with pytest.raises(ConfigError, match="belongs to run 'run-a'"):
        CheckpointStore(tmp_path, "run-b", keep=2).load(latest)


def test_rewind_keeps_steps_up_to_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "trained.jsonl"
    lines = [json.dumps({"ticket_id": i, "step": 1 + i // 2}) for i in range(8)]
    path.write_text("\n".join(lines) + '\n{"ticket_id": 8, "st')  # torn by a kill
    removed = rewind(path, 2)
    assert [r["ticket_id"] for r in removed] == [4, 5, 6, 7]
    assert [json.loads(x)["ticket_id"] for x in path.read_text().splitlines()] == [0, 1, 2, 3]
    assert rewind(tmp_path / "missing.jsonl", 3) == []
