"""LoRA adapters: only they train and only they travel; a generator that takes a version computes
what the trainer computes; a checkpoint resumes them with their optimizer state; the final model
is an adapter directory plus the base with the adapters merged in."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from llamarl.config import (
    AlgorithmConfig,
    LoraConfig,
    ModelConfig,
    ShmSync,
    TrainerConfig,
    parse_config,
)
from llamarl.engine.adapters import has_adapters, with_adapters
from llamarl.engine.model import build_policy
from llamarl.errors import ConfigError
from llamarl.training.checkpoint import CheckpointStore, TrainerState, take_snapshot
from llamarl.training.export import FINAL_ADAPTER, FINAL_MODEL, export, save_final
from llamarl.training.learner import Learner
from llamarl.weightsync.flat import flatten, num_values, weight_objects
from llamarl.weightsync.shm import ShmPublisher, ShmReceiver
from tests.integration.test_trainer_ranks import step_groups

MODEL = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
LORA = LoraConfig(r=4)
TRAINER = TrainerConfig(lr=1e-2, micro_batch_tokens=40, max_grad_norm=1e6)
IDS = torch.tensor([[3, 4, 5, 6, 7, 8]])


def lora_learner(seed: int = 5) -> Learner:
    policy = with_adapters(build_policy(MODEL, seed=1), LORA, seed=seed)
    return Learner(policy, AlgorithmConfig(), TRAINER, 1.0)


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def test_only_the_adapters_train_and_get_optimizer_state() -> None:
    learner = lora_learner()
    model = learner.policy.model
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    assert adapters and all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    learner.step(step_groups())
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters() if n in base)
    moved = [n for n, p in model.named_parameters() if n in adapters and not torch.equal(p, adapters[n])]
    assert moved, "the adapters took a step"
    optimized = {id(p) for group in learner.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for n, p in model.named_parameters() if "lora_" in n}


def test_a_version_is_the_adapters_and_makes_the_generator_compute_the_trainers_logits() -> None:
    learner = lora_learner(seed=5)
    learner.step(step_groups())
    trainer_model = learner.policy.model
    whole = num_values(build_policy(MODEL, seed=1).model)
    assert 0 < num_values(trainer_model) < 0.2 * whole, "a version holds the adapters only"
    generator = with_adapters(build_policy(MODEL, seed=1), LORA, seed=99).model  # other init
    assert not torch.allclose(logits(generator), logits(trainer_model))
    publisher = ShmPublisher("lora-test")
    receiver = ShmReceiver(ShmSync())
    try:
        meta = publisher.publish(publisher.stage(trainer_model, 1))
        version, fetched = receiver.fetch({k: str(v) for k, v in meta.items()} | {"policy_version": "1"})
        receiver.swap_in(generator, fetched)
    finally:
        publisher.close()
    assert version == 1 and int(meta["num_bytes"]) == num_values(trainer_model) * 4
    assert torch.equal(logits(generator), logits(trainer_model))


def test_a_lora_checkpoint_resumes_the_adapters_and_their_optimizer_state(tmp_path: Path) -> None:
    learner = lora_learner()
    store = CheckpointStore(tmp_path / "checkpoints", "lora", keep=2)
    base = build_policy(MODEL, seed=1)
    store.save_base(base)
    learner.step(step_groups())
    store.save(take_snapshot(learner.policy, None, learner.optimizer, TrainerState(1, 1)))
    saved = sorted(p.name for p in (tmp_path / "checkpoints" / "step-00000001").iterdir())
    assert "adapter" in saved and "model" not in saved, "the base is written once, apart"
    restored = store.load(store.latest())  # type: ignore[arg-type]
    assert has_adapters(restored.policy.model)
    assert flatten(restored.policy.model, 1).checksum == flatten(learner.policy.model, 1).checksum
    assert torch.equal(logits(restored.policy.model), logits(learner.policy.model))
    again = Learner(restored.policy, AlgorithmConfig(), TRAINER, 1.0)
    assert restored.optimizer_state is not None
    again.optimizer.load_state_dict(restored.optimizer_state)
    learner.step(step_groups())
    again.step(step_groups())
    assert torch.equal(logits(again.policy.model), logits(learner.policy.model))


def test_the_final_model_is_an_adapter_directory_and_the_merged_base(tmp_path: Path) -> None:
    learner = lora_learner()
    learner.step(step_groups())
    expected = logits(learner.policy.model)
    save_final(learner.policy, tmp_path)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / FINAL_MODEL)
    assert not any("lora_" in n for n, _ in merged.named_parameters())
    assert torch.allclose(logits(merged), expected, atol=1e-5)
    adapted = PeftModel.from_pretrained(build_policy(MODEL, seed=1).model, tmp_path / FINAL_ADAPTER)
    assert torch.allclose(logits(adapted), expected, atol=1e-6)
    copy = export(tmp_path, tmp_path / "out")
    assert copy == tmp_path / FINAL_MODEL and (tmp_path / "out" / "config.json").exists()
    assert weight_objects(adapted) and len(weight_objects(merged)) > len(weight_objects(adapted))


def test_lora_with_a_warm_start_is_refused_naming_both_fields() -> None:
    with pytest.raises(ConfigError, match=r"model.lora, trainer.sft_steps: .*llamarl sft"):
        parse_config({"model": {"lora": {"r": 8}}, "trainer": {"sft_steps": 10}})
