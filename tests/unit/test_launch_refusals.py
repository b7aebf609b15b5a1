"""What a launch refuses about devices and ranks before anything starts: CUDA where there is
none, more CUDA ranks than GPUs (a local launch only: Ray places roles on its nodes), several
trainer ranks or generators unlike the trainer in the synchronous baseline, more ranks than groups
a step. (Which transport `auto` picks: tests/contract/test_transport_contract.)"""

from __future__ import annotations

import pytest
import torch

from llamarl.config import parse_config
from llamarl.errors import ConfigError
from llamarl.launch.local import check_devices


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
@pytest.mark.parametrize("field", ["trainer", "generation"])
def test_cuda_without_a_gpu_is_refused_naming_the_field(field: str) -> None:
    config = parse_config({field: {"device": "cuda"}})
    with pytest.raises(ConfigError, match=f"{field}.device: cuda, but this machine has no CUDA"):
        check_devices(config, "async")


def test_more_cuda_ranks_than_gpus_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    check_devices(parse_config({"trainer": {"device": "cuda"}}), "async")
    two = parse_config({"trainer": {"device": "cuda", "ranks": 2}})
    with pytest.raises(ConfigError, match="trainer.ranks: 2 ranks on cuda need a GPU each and this machine has 1"):
        check_devices(two, "async")
    check_devices(parse_config({"trainer": {"ranks": 2}, "generation": {"device": "cuda"}}), "async")


def test_ray_places_cuda_roles_on_its_own_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A launcher host without GPUs may drive a cluster whose nodes have them."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    config = parse_config({"trainer": {"device": "cuda", "ranks": 2}, "generation": {"device": "cuda"}})
    check_devices(config, "async", "ray")
    with pytest.raises(ConfigError, match="trainer.device: cuda"):
        check_devices(config, "async", "local")


def test_one_process_refuses_several_trainer_ranks() -> None:
    config = parse_config({"trainer": {"ranks": 2}})
    check_devices(config, "async")
    with pytest.raises(ConfigError, match=r"trainer.ranks: one_process \(--mode sync\) runs one trainer process"):
        check_devices(config, "sync")


def test_more_ranks_than_groups_a_step_are_refused() -> None:
    with pytest.raises(ConfigError, match="trainer.ranks, trainer.prompts_per_step"):
        parse_config({"trainer": {"ranks": 5, "prompts_per_step": 4}})


def test_one_process_refuses_generators_unlike_its_trainer() -> None:
    config = parse_config({"generation": {"dtype": "bfloat16"}})
    check_devices(config, "async")
    with pytest.raises(ConfigError, match="generation.device, generation.dtype"):
        check_devices(config, "sync")
