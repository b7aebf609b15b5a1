"""The RL learning-rate schedule against hand-computed values, in the learner's steps, and after a
resume from a checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamarl.config import AlgorithmConfig, ModelConfig, TrainerConfig, parse_config
from llamarl.engine.model import build_policy
from llamarl.roles import build
from llamarl.training.checkpoint import CheckpointStore, TrainerState, take_snapshot
from llamarl.training.learner import Learner
from llamarl.training.lr_schedule import lr_factor
from tests.integration.test_trainer_ranks import step_groups

MODEL = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def _trainer(**fields: object) -> TrainerConfig:
    return TrainerConfig.model_validate({"micro_batch_tokens": 4096, **fields})


def test_warm_up_rises_linearly_to_the_peak_then_stays_constant() -> None:
    trainer = _trainer(lr_warmup_steps=4, num_steps=16)
    assert [lr_factor(trainer, s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert lr_factor(trainer, 15) == 1.0


def test_linear_decay_to_the_floor() -> None:
    # 12 steps of decay after 4 of warm-up; floor 0.1: factor 0.1 + 0.9 * (1 - progress).
    trainer = _trainer(lr_warmup_steps=4, num_steps=16, lr_schedule="linear", lr_min_ratio=0.1)
    assert lr_factor(trainer, 3) == 1.0
    assert lr_factor(trainer, 4) == pytest.approx(1.0)
    assert lr_factor(trainer, 7) == pytest.approx(0.1 + 0.9 * 0.75)  # progress 3/12
    assert lr_factor(trainer, 10) == pytest.approx(0.1 + 0.9 * 0.5)  # progress 6/12
    assert lr_factor(trainer, 15) == pytest.approx(0.1 + 0.9 / 12)  # the last step
    assert lr_factor(trainer, 16) == pytest.approx(0.1)
    assert lr_factor(trainer, 40) == pytest.approx(0.1), "past num_steps it stays at the floor"


def test_cosine_decay_to_the_floor() -> None:
    # factor 0.1 + 0.9 * (1 + cos(pi * progress)) / 2.
    trainer = _trainer(lr_warmup_steps=4, num_steps=16, lr_schedule="cosine", lr_min_ratio=0.1)
    assert lr_factor(trainer, 4) == pytest.approx(1.0)
    assert lr_factor(trainer, 8) == pytest.approx(0.1 + 0.9 * 0.75)  # cos(pi/3) = 0.5
    assert lr_factor(trainer, 10) == pytest.approx(0.1 + 0.9 * 0.5)  # cos(pi/2) = 0
    assert lr_factor(trainer, 12) == pytest.approx(0.1 + 0.9 * 0.25)  # cos(2pi/3) = -0.5
    assert lr_factor(trainer, 16) == pytest.approx(0.1)


def test_decay_without_warm_up_starts_at_the_peak() -> None:
    trainer = _trainer(num_steps=4, lr_schedule="linear")
    assert [lr_factor(trainer, s) for s in range(4)] == [1.0, 0.75, 0.5, 0.25]


def test_each_learner_step_uses_the_scheduled_lr() -> None:
    trainer = _trainer(lr=1e-3, lr_warmup_steps=2, num_steps=4, lr_schedule="linear")
    learner = Learner(build_policy(MODEL, seed=1), AlgorithmConfig(), trainer, 1.0)
    used = [learner.step(step_groups())["lr"] for _ in range(4)]
    # warm-up 1/2, 2/2; then progress 0/2, 1/2 of the decay to 0.
    assert used == pytest.approx([5e-4, 1e-3, 1e-3, 5e-4])


def test_a_resumed_learner_continues_the_schedule(tmp_path: Path) -> None:
    fields = {
        "lr": 1e-3,
        "lr_warmup_steps": 2,
        "num_steps": 6,
        "lr_schedule": "cosine",
        "sft_steps": 0,
        "micro_batch_tokens": 4096,
    }
    config = parse_config({"run_id": "lr", "model": MODEL.model_dump(), "trainer": fields}, {})
    ran = build.learner(config, build_policy(MODEL, seed=1), None, None)
    for _ in range(3):
        ran.step(step_groups())
    store = CheckpointStore(tmp_path / "checkpoints", "lr", keep=1)
    store.save(take_snapshot(ran.policy, None, ran.optimizer, TrainerState(3, 3)))
    restored = store.load(store.latest())  # type: ignore[arg-type]
    resumed = build.learner(config, restored.policy, restored, None)
    assert resumed.optimizer.param_groups[0]["lr"] == ran.optimizer.param_groups[0]["lr"]
    for _ in range(3):
        assert resumed.step(step_groups())["lr"] == ran.step(step_groups())["lr"]


def test_a_resume_follows_the_configured_peak_not_the_saved_lr(tmp_path: Path) -> None:
    trainer = _trainer(lr=1e-3, num_steps=4, lr_schedule="linear")
    learner = Learner(build_policy(MODEL, seed=1), AlgorithmConfig(), trainer, 1.0)
    saved = {**learner.optimizer.state_dict()}
    saved["param_groups"] = [g | {"lr": 0.5, "initial_lr": 0.5} for g in saved["param_groups"]]
    learner.optimizer.load_state_dict(saved)
    learner.resume_schedule(2)
    assert learner.step(step_groups())["lr"] == pytest.approx(1e-3 * 0.5)
