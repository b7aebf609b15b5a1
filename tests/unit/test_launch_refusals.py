"""What a launch refuses about devices and ranks before anything starts: CUDA where there is
none, several trainer ranks or generators unlike the trainer in the synchronous baseline, more
ranks than groups a step. (Which transport `auto` picks: tests/contract/test_transport_contract.)"""

from __future__ import annotations

import pytest
import torch

from llamarl.config import parse_config
from llamarl.errors import ConfigError
from llamarl.launch import check_devices


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
@pytest.mark.parametrize("field", ["trainer", "generation"])
def test_cuda_without_a_gpu_is_refused_naming_the_field(field: str) -> None:
    config = parse_config({field: {"device": "cuda"}})
    with pytest.raises(ConfigError, match=f"{field}.device: cuda, but this machine has no CUDA"):
        check_devices(config, "async")


def test_the_synchronous_baseline_refuses_several_trainer_ranks() -> None:
    config = parse_config({"trainer": {"ranks": 2}})
    check_devices(config, "async")
    with pytest.raises(ConfigError, match="trainer.ranks: the synchronous baseline"):
        check_devices(config, "sync")


def test_more_ranks_than_groups_a_step_are_refused() -> None:
    with pytest.raises(ConfigError, match="trainer.ranks, trainer.prompts_per_step"):
        parse_config({"trainer": {"ranks": 5, "prompts_per_step": 4}})


def test_the_synchronous_baseline_refuses_generators_unlike_its_trainer() -> None:
    config = parse_config({"generation": {"dtype": "bfloat16"}})
    check_devices(config, "async")
    with pytest.raises(ConfigError, match="generation.device, generation.dtype"):
        check_devices(config, "sync")
