"""The CUDA paths, run only where CUDA is: a learner step on the GPU computes what it computes on
the CPU, sampling on the GPU hands back CPU tensors, a generator on the GPU takes a shared-memory
version into its device weights (cast to bfloat16), a two-rank trainer on two GPUs sends its
shards over NCCL to a generator on a third, an FSDP rank trains LoRA adapters with bfloat16
compute and activation checkpointing, and whole async runs with roles on the GPU learn and
balance their ledgers. README says which of these have run on a GPU, and where."""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from llamarl.config import AlgorithmConfig, LoraConfig, NcclSync, ShmSync
from llamarl.engine.adapters import with_adapters
from llamarl.engine.model import build_policy, place
from llamarl.engine.sampling import sample
from llamarl.net import free_port_block
from llamarl.training.learner import Learner
from llamarl.training.parallel import TrainerRanks
from llamarl.training.sharding import blocks
from llamarl.weightsync import make_publisher, make_receiver
from llamarl.weightsync.flat import flatten
from llamarl.weightsync.messages import join_shards
from tests.integration.test_trainer_ranks import (
    MODEL,
    TRAINER,
    flat_grads,
    publish_rank,
    step_groups,
)
from tests.integration.test_trainer_ranks_run import learning_run

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU; this machine has none")


def test_a_learner_step_on_the_gpu_equals_the_cpu_step() -> None:
    cpu = Learner(build_policy(MODEL, seed=1), AlgorithmConfig(), TRAINER, 1.0)
    gpu = Learner(place(build_policy(MODEL, seed=1), "cuda", "float32"), AlgorithmConfig(), TRAINER, 1.0)
    expected, got = cpu.step(step_groups()), gpu.step(step_groups())
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-4, abs=1e-6)
    difference = np.abs(_cpu_grads(gpu) - flat_grads(cpu))
    assert difference.max() <= 1e-4 * np.abs(flat_grads(cpu)).max()


def _cpu_grads(learner: Learner) -> np.ndarray:
    return torch.cat([p.grad.flatten().cpu() for p in learner.policy.model.parameters()]).numpy()


def test_sampling_on_the_gpu_returns_cpu_tensors() -> None:
    policy = place(build_policy(MODEL, seed=1), "cuda", "bfloat16")
    prompt = [policy.tokenizer("1+2=").input_ids]
    generator = torch.Generator(device="cuda").manual_seed(0)
    batch = sample(policy, prompt, num_samples=4, max_new_tokens=3, generator=generator)
    assert batch.completion_ids.device.type == "cpu" and batch.logprobs.dtype == torch.float32


def test_a_gpu_generator_takes_a_shared_memory_version_cast_to_its_dtype() -> None:
    trainer = build_policy(MODEL, seed=1)
    generator = place(build_policy(MODEL, seed=2), "cuda", "bfloat16")
    publisher = make_publisher(ShmSync(), "cuda-test")
    receiver = make_receiver(ShmSync(), "gen-cuda")
    try:
        meta = {k: str(v) for k, v in publisher.publish(publisher.stage(trainer.model, 1)).items()}
        version, fetched = receiver.fetch(meta | {"policy_version": "1"})
        receiver.swap_in(generator.model, fetched)
    finally:
        publisher.close()
    expected = flatten(trainer.model, 1).buffer.to(torch.bfloat16).float()
    assert version == 1 and torch.equal(flatten(generator.model, 1).buffer, expected)


@pytest.mark.skipif(GPUS < 3, reason="two trainer ranks and a generator, a GPU each")
def test_two_gpu_ranks_send_their_shards_over_nccl() -> None:
    config = NcclSync(timeout_s=60)
    ctx = mp.get_context("spawn")
    metas, done = ctx.Queue(), ctx.Event()
    ranks = [ctx.Process(target=publish_rank, args=(config, r, 2, 0, False, metas, done)) for r in range(2)]
    for proc in ranks:
        proc.start()
    try:
        shards = dict(metas.get(timeout=120) for _ in ranks)
        meta = {k: str(v) for k, v in join_shards([shards[0], shards[1]]).items()}
        torch.cuda.set_device(2)
        generator = build_policy(MODEL, seed=99)
        place(generator, "cuda:2", "float32")
        receiver = make_receiver(config, "gen-nccl")
        version, fetched = receiver.fetch(meta | {"policy_version": "3"})
        receiver.swap_in(generator.model, fetched)
        receiver.close()
    finally:
        done.set()
        for proc in ranks:
            proc.join(60)
    expected = flatten(build_policy(MODEL, seed=1).model, 3).buffer
    assert version == 3 and torch.equal(flatten(generator.model, 3).buffer, expected)


def test_fsdp_with_bf16_compute_checkpointing_and_lora_trains_on_the_gpu() -> None:
    """One FSDP rank on CUDA: blocks compute in bfloat16 (float32 master weights), activations
    are recomputed, only the adapters move; its peak memory and seconds a step are printed."""
    port = free_port_block(size=1)
    dist.init_process_group("cpu:gloo,cuda:nccl", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
    try:
        torch.cuda.set_device(0)
        ranks = TrainerRanks(0, 1, torch.device("cuda", 0), "gpu-check")
        policy = with_adapters(place(build_policy(MODEL, seed=1), "cuda", "float32"), LoraConfig(r=4), seed=1)
        trainer = TRAINER.model_copy(update={"sharding": "fsdp", "device": "cuda", "activation_checkpointing": True})
        learner = Learner(policy, AlgorithmConfig(), trainer, 1.0, ranks=ranks)
        seen: set[torch.dtype] = set()
        block = blocks(policy.model)[0]
        block.register_forward_hook(
            lambda m, args, out: seen.add(out[0].dtype if isinstance(out, tuple) else out.dtype)
        )
        base = {n: p.detach().clone() for n, p in policy.model.named_parameters() if "lora_" not in n}
        torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        stats = [learner.step(step_groups()) for _ in range(3)]
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - started) / 3
        assert seen == {torch.bfloat16}, "blocks compute in bfloat16"
        assert all(p.dtype == torch.float32 for p in policy.model.parameters()), "fp32 masters"
        assert all(np.isfinite(s["loss"]) and s["skipped_update"] == 0 for s in stats)
        for name, param in policy.model.named_parameters():
            if name in base:
                assert torch.equal(param.detach(), base[name]), name
        print(
            f"fsdp+bf16+AC+LoRA on CUDA: {seconds:.3f} s/step, peak {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB"
        )
    finally:
        dist.destroy_process_group()


LAYOUTS = {
    # trainer and two bfloat16 generators on one GPU: shared memory into device weights, cast
    "one-gpu": (
        {
            "TRAINER__RANKS": "1",
            "TRAINER__DEVICE": "cuda",
            "GENERATION__DEVICE": "cuda",
            "GENERATION__DTYPE": "bfloat16",
        },
        1,
    ),
    # two CPU trainer ranks (gloo) sending their shards to two generators on the GPU
    "cpu-ranks": ({"GENERATION__DEVICE": "cuda"}, 1),
    # two trainer ranks on two GPUs (DDP over NCCL), generators on the first
    "gpu-ranks": ({"TRAINER__DEVICE": "cuda", "GENERATION__DEVICE": "cuda"}, 2),
}
"""Overrides of the demo's two-rank, two-generator run, and the GPUs each needs."""


@pytest.mark.long
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_an_async_run_on_the_gpu_learns_and_balances_its_ledger(
    tmp_path: Path, layout: str, tiny_warm_start: Path
) -> None:
    overrides, gpus = LAYOUTS[layout]
    if GPUS < gpus:
        pytest.skip(f"needs {gpus} GPUs; this machine has {GPUS}")
    env = {f"LLAMARL__{k}": v for k, v in overrides.items()}
    learning_run(tmp_path / layout, tiny_warm_start, env)
