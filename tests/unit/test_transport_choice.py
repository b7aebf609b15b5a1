"""Which transport `sync.transport: auto` stands for, and which devices a launch refuses: one
host takes shm whatever the devices (NCCL between two processes on one GPU does not work), other
hosts nccl with CUDA and gloo without; CUDA asked for where there is none is refused before
anything starts."""

from __future__ import annotations

import pytest
import torch

from llamarl.config import AutoSync, parse_config
from llamarl.errors import ConfigError
from llamarl.launch import check_devices
from llamarl.weightsync import resolve_transport


@pytest.mark.parametrize("cuda", [False, True])
@pytest.mark.parametrize(
    ("host", "advertise", "network"),
    [("127.0.0.1", None, None), ("0.0.0.0", None, None), ("0.0.0.0", "trainer-host", "remote")],
)
def test_auto_takes_shm_on_one_host_and_nccl_or_gloo_across_hosts(
    monkeypatch: pytest.MonkeyPatch, cuda: bool, host: str, advertise: str | None, network: str
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    chosen = resolve_transport(AutoSync(host=host, advertise_host=advertise)).transport
    if network is None:
        assert chosen == "shm"
    else:
        assert chosen == ("nccl" if cuda else "gloo")


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
