"""The memory estimate and check (`llamarl.training.memory`, `memory_check`): parameters are
counted exactly from the config without building weights (the built Llama, a model directory's
config.json, LoRA's adapters); fsdp, LoRA and activation checkpointing each lower a rank's
estimate; the check refuses what does not fit in one line naming the estimate per rank, the
ranks, the limit and the first setting that fits; a cgroup limit lowers the host's; and both
`llamarl run` and a trainer worker refuse a model far too big with exit code 2, one stderr line
and no traceback, before anything starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from transformers import LlamaConfig, LlamaForCausalLM

from llamarl.config import LoraConfig, ModelConfig, RunConfig, TrainerConfig, parse_config
from llamarl.engine.adapters import with_adapters
from llamarl.engine.model import build_policy
from llamarl.errors import ConfigError
from llamarl.launch import supervise
from llamarl.training import memory_check
from llamarl.training.memory import GiB, Workload, estimate_rank, model_shape

REPO = Path(__file__).resolve().parents[2]
SMALL = ModelConfig(hidden_size=64, num_layers=3, num_heads=4, intermediate_size=96)
BILLION = {
    "hidden_size": 2048,
    "num_layers": 16,
    "num_heads": 32,
    "intermediate_size": 8192,
    "max_position_embeddings": 256,
}
WORK = Workload(prompt_tokens=256, completion_tokens=768, num_samples=4, micro_batches=2)


def _numel(model: object) -> int:
    return sum(p.numel() for p in model.parameters())  # type: ignore[attr-defined]


def test_the_built_model_is_counted_exactly_without_its_weights() -> None:
    shape = model_shape(SMALL)
    assert shape.num_params == _numel(build_policy(SMALL, seed=0).model)
    assert shape.num_trained == shape.num_params
    assert shape.num_layers == 3


def test_a_model_directory_is_counted_from_its_config_json(tmp_path: Path) -> None:
    """Untied embeddings and grouped-query attention, as a real checkpoint may have them."""
    config = LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        tie_word_embeddings=False,
    )
    config.save_pretrained(tmp_path)
    assert (tmp_path / "config.json").exists() and not list(tmp_path.glob("*.safetensors"))
    shape = model_shape(ModelConfig(path=str(tmp_path)))
    assert shape.num_params == _numel(LlamaForCausalLM(config))
    assert shape.num_root_params == 2 * 300 * 64 + 64  # embeddings, output layer, final norm


def test_lora_adapters_are_counted_as_peft_makes_them() -> None:
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"])
    shape = model_shape(SMALL.model_copy(update={"lora": lora}))
    model = with_adapters(build_policy(SMALL, seed=0), lora).model
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert shape.num_trained == trained > 0
    assert shape.num_params == _numel(build_policy(SMALL, seed=0).model)


def _estimate(model: ModelConfig, **trainer: object) -> float:
    shape = model_shape(model)
    return estimate_rank(shape, TrainerConfig(sft_steps=0, **trainer), WORK).total  # type: ignore[arg-type]


def test_fsdp_lora_and_checkpointing_each_lower_a_ranks_estimate() -> None:
    big = ModelConfig(**BILLION)
    ddp = _estimate(big, ranks=2, sharding="ddp")
    fsdp = _estimate(big, ranks=2, sharding="fsdp")
    assert fsdp < ddp
    assert _estimate(big, ranks=4, sharding="fsdp") < fsdp
    assert _estimate(big.model_copy(update={"lora": LoraConfig()})) < 0.5 * _estimate(big)
    wide = big.model_copy(update={"hidden_size": 4096, "num_heads": 32})
    assert _estimate(wide, activation_checkpointing=True) < _estimate(wide)


def test_fsdp_ranks_hold_unsharded_gradients_beside_their_shards() -> None:
    shape = model_shape(ModelConfig(**BILLION))
    terms = estimate_rank(shape, TrainerConfig(ranks=2, sharding="fsdp", sft_steps=0), WORK).terms
    assert terms["unsharded gradients"] == shape.num_params * 4 == 2 * terms["gradients"]
    assert terms["optimizer"] == shape.num_params * 4 and "gradient buckets" not in terms


def _host(monkeypatch: pytest.MonkeyPatch, num_bytes: int) -> None:
    monkeypatch.setattr(memory_check, "host_memory", lambda: (num_bytes, "this host has"))


def _sharded(config: RunConfig) -> RunConfig:
    return config.model_copy(update={"trainer": config.trainer.model_copy(update={"sharding": "fsdp"})})


def _need(config: RunConfig, generators: bool = False) -> int:
    return memory_check.host_need(config, model_shape(config.model), generators)[0]


def test_the_check_names_the_estimate_the_limit_and_the_first_setting_that_fits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = parse_config({"model": BILLION, "trainer": {"ranks": 2, "sft_steps": 0}})
    fsdp = _sharded(config)
    limit = (_need(config) + _need(fsdp)) // 2  # fsdp fits, ddp does not
    _host(monkeypatch, limit)
    with pytest.raises(ConfigError) as refused:
        memory_check.check_memory(config, generators=False)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("trainer memory: 2 trainer ranks need about ")
    assert "GiB each, " in message and f"in all, and this host has {limit / GiB:.1f} GiB" in message
    assert message.endswith("; set trainer.sharding: fsdp")
    memory_check.check_memory(fsdp, generators=False)
    _host(monkeypatch, _need(fsdp, generators=True) - 1)
    with pytest.raises(ConfigError, match=r"in all with the generators' weights, and this host"):
        memory_check.check_memory(fsdp)  # a generator's float32 copy and a staged version too


def test_fsdp_ranks_that_fit_only_without_whole_gradients_are_told_to_reduce_each_micro_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step of several micro-batches: accumulating keeps the whole gradients on every fsdp
    rank, reducing in each micro-batch keeps only the rank's shard."""
    fsdp = _sharded(
        parse_config(
            {
                "model": BILLION,
                "trainer": {"ranks": 2, "sft_steps": 0, "prompts_per_step": 64, "micro_batch_tokens": 1024},
            }
        )
    )
    assert memory_check.run_workload(fsdp).micro_batches > 1
    each = fsdp.model_copy(update={"trainer": fsdp.trainer.model_copy(update={"reduce_gradients": "micro_batch"})})
    whole = model_shape(fsdp.model).num_params * 4
    assert _need(fsdp) - _need(each) == 2 * whole  # two ranks' whole gradients
    _host(monkeypatch, (_need(fsdp) + _need(each)) // 2)
    with pytest.raises(ConfigError, match=r"; set trainer.reduce_gradients: micro_batch$"):
        memory_check.check_memory(fsdp, generators=False)
    memory_check.check_memory(each, generators=False)


def test_settings_are_combined_when_none_fits_alone_and_nothing_is_offered_when_none_can(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = parse_config({"model": BILLION, "trainer": {"ranks": 2}})  # warm-starts on rank 0

    def shortfall(changed: RunConfig, shapes: object, generators: bool) -> str | None:
        """A host where fsdp without a warm start fits, and nothing else."""
        trainer = changed.trainer
        return None if (trainer.sharding, trainer.sft_steps) == ("fsdp", 0) else "too big"

    with monkeypatch.context() as patched:
        patched.setattr(memory_check, "shortfall", shortfall)
        found = memory_check.fix(config, memory_check.Shapes(), generators=True)
    assert found == "set trainer.sharding: fsdp, trainer.sft_steps: 0"  # not checkpointing too
    _host(monkeypatch, 1 << 30)
    with pytest.raises(ConfigError, match="no trainer setting makes it fit"):
        memory_check.check_memory(config)


def test_cuda_ranks_are_checked_against_their_gpus_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU here: torch is told of two 16 GiB ones."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(total_memory=16 << 30))
    _host(monkeypatch, 1 << 40)
    config = parse_config({"model": BILLION, "trainer": {"device": "cuda", "ranks": 2, "sft_steps": 0}})
    with pytest.raises(
        ConfigError,
        match=r"each of 2 cuda trainer ranks needs about [\d.]+ GiB "
        r"of GPU memory and its GPU has 16.0 GiB; set "
        r"trainer.sharding: fsdp$",
    ):
        memory_check.check_memory(config)
    memory_check.check_memory(_sharded(config))


def test_a_cgroup_limit_below_the_hosts_memory_is_the_limit(tmp_path: Path) -> None:
    (tmp_path / "cgroup").write_text("4:memory:/jobs/one\n0::/jobs/one\n")
    v1 = tmp_path / "fs" / "memory" / "jobs"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(str(3 << 30))
    limit, where = memory_check.host_memory(tmp_path / "fs", tmp_path / "cgroup")
    assert (limit, where) == (3 << 30, "its cgroup allows")
    v2 = tmp_path / "fs" / "jobs" / "one"
    v2.mkdir(parents=True)
    (v2 / "memory.max").write_text(str(2 << 30))
    assert memory_check.host_memory(tmp_path / "fs", tmp_path / "cgroup")[0] == 2 << 30
    (v2 / "memory.max").write_text("max")
    (tmp_path / "cgroup").write_text("0::/jobs/one\n")
    unlimited, where = memory_check.host_memory(tmp_path / "fs", tmp_path / "cgroup")
    assert unlimited > 2 << 30 and where == "this host has"


HUGE = {
    "hidden_size": 16384,
    "num_layers": 128,
    "num_heads": 128,
    "intermediate_size": 65536,
    "max_position_embeddings": 256,
}
"""About 550B parameters: no host holds its trainer."""


@pytest.mark.parametrize("command", [["run"], ["worker", "trainer", "--config"]], ids=["llamarl run", "trainer worker"])
def test_a_model_far_too_big_is_refused_before_anything_starts(command: list[str], tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    run_dir = tmp_path / "run"
    path.write_text(yaml.safe_dump({"run_id": "huge", "run_dir": str(run_dir), "model": HUGE}))
    proc = supervise.start(
        [sys.executable, "-m", "workers.cli", "--log-format", "json", *command, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        _, err = proc.communicate(timeout=120)  # a hang guard, not a speed bound
    finally:
        supervise.stop(proc)
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("{")]
    assert proc.returncode == 2, err[-2000:]
    assert "Traceback" not in err
    assert len(lines) == 1, lines
    assert lines[0].startswith("config error: trainer memory: 1 trainer rank needs about ")
    assert "no trainer setting makes it fit" in lines[0]
    assert not (run_dir / "logs").exists(), "the launch went on past its preflight"
