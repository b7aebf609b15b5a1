"""A trainer of several ranks: its gradients equal one process's (real gloo group of two spawned
processes), with FSDP2 shards (with and without activation checkpointing) its weights after
three steps too, and its sharded weight sync reproduces the trainer's weights in every
generator, bit for bit in float32 and within the cast's rounding in bfloat16 (two rank
processes, each publishing its own shard: a run of whole tensors from replicas, or its FSDP
chunks of every tensor; two generator processes; over shm and over gloo). A checkpoint of two
FSDP ranks resumes in one process. An idle rank 0 notices a rank that died."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from llamarl.config import (
    AlgorithmConfig,
    GlooSync,
    ModelConfig,
    RunConfig,
    ShmSync,
    SyncConfig,
    TrainerConfig,
)
from llamarl.engine.grouped import TrainGroup, micro_batches
from llamarl.engine.model import build_policy, place
from llamarl.roles.build import learner
from llamarl.roles.trainer_durability import Checkpointer
from llamarl.store import MemoryStore
from llamarl.training.checkpoint import CheckpointStore, TrainerState
from llamarl.training.export import checkpoint_model
from llamarl.training.learner import Learner
from llamarl.training.parallel import Order, TrainerRanks
from llamarl.training.sharded_checkpoint import save_shards
from llamarl.training.sharding import Shards
from llamarl.weightsync import make_publisher, make_receiver
from llamarl.weightsync.flat import Shard, flatten, weight_objects
from llamarl.weightsync.messages import join_shards

MODEL = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
TRAINER = TrainerConfig(lr=1e-3, micro_batch_tokens=40, max_grad_norm=1e6)
TOLERANCE = 1e-5
"""Largest gradient difference allowed, relative to the largest gradient: the two runs add the
same terms in another order (float32 sums over ranks and micro-batches)."""


def step_groups() -> list[TrainGroup]:
    """Six groups of three prompt lengths and ragged completions (several micro-batches)."""
    generator = torch.Generator().manual_seed(7)
    groups = []
    for index in range(6):
        n, width = 4, 3 + index % 3
        lengths = torch.randint(1, width + 1, (n,), generator=generator)
        mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
        groups.append(
            TrainGroup(
                prompt_ids=torch.randint(3, 14, (4 + index % 3,), generator=generator),
                completion_ids=torch.randint(3, 14, (n, width), generator=generator) * mask,
                completion_mask=mask,
                behaviour_logprobs=-torch.rand(n, width, generator=generator) * mask,
                rewards=torch.rand(n, generator=generator),
            )
        )
    return groups


def uneven_groups() -> list[TrainGroup]:
    """Step groups that FSDP ranks cut into different numbers of micro-batches (rank 0 gets the
    long ones), one of them with one-token completions."""
    groups = step_groups()
    for index in (1, 3):
        groups[index] = dataclasses.replace(
            groups[index],
            prompt_ids=groups[index].prompt_ids[:2],
            completion_ids=groups[index].completion_ids[:, :1],
            completion_mask=torch.ones_like(groups[index].completion_mask[:, :1]),
            behaviour_logprobs=groups[index].behaviour_logprobs[:, :1],
        )
    return groups


def flat_grads(learner: Learner) -> np.ndarray:
    grads = [p.grad.flatten() for p in learner.policy.model.parameters() if p.grad is not None]
    return torch.cat(grads).numpy().copy()


def train_rank(rank: int, world: int, port: int, out: Any) -> None:
    """One trainer rank: rank 1 starts from other weights, so equal results prove that the
    group gave it rank 0's."""
    ranks = join_group(rank, world, port)
    learner = Learner(build_policy(MODEL, seed=1 + rank), AlgorithmConfig(), TRAINER, 1.0, ranks=ranks)
    stats = learner.step(step_groups())
    weights = flatten(learner.policy.model, 1).buffer.numpy().copy()
    out.put((rank, stats, flat_grads(learner), weights))
    ranks.close()


def run_two_ranks(target: Any, *args: Any) -> list[Any]:
    """Spawn `target(rank, 2, port, *args, out)` as two ranks of a gloo group; what each put on
    `out` (a tuple starting with its rank), in rank order."""
    return run_ranks(2, target, *args)


def run_ranks(world: int, target: Any, *args: Any) -> list[Any]:
    """`run_two_ranks` with `world` ranks."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    store = group_store()
    port = store.port
    procs = [ctx.Process(target=target, args=(r, world, port, *args, out)) for r in range(world)]
    for proc in procs:
        proc.start()
    results = sorted((out.get(timeout=120) for _ in procs), key=lambda item: item[0])
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    return results


def test_a_two_rank_trainer_computes_the_one_process_gradients() -> None:
    groups = step_groups()
    mine = [list(range(r, len(groups), 2)) for r in range(2)]
    cuts = [micro_batches([groups[i] for i in m], TRAINER.micro_batch_tokens) for m in mine]
    assert all(len(c) > 1 for c in cuts), "each rank must accumulate over several micro-batches"
    alone = Learner(build_policy(MODEL, seed=1), AlgorithmConfig(), TRAINER, 1.0)
    expected = alone.step(groups)
    expected_grads = flat_grads(alone)
    expected_weights = flatten(alone.policy.model, 1).buffer.numpy()

    results = run_two_ranks(train_rank)

    scale = float(np.abs(expected_grads).max())
    for rank, stats, grads, weights in results:
        assert np.abs(grads - expected_grads).max() <= TOLERANCE * scale, f"rank {rank}"
        # AdamW divides by the gradients' running scale: a 1e-5 difference in a small gradient
        # moves a weight by a small fraction of one lr-sized step.
        step = np.abs(weights - expected_weights).max()
        assert step <= 0.01 * TRAINER.lr, f"rank {rank} took another step"
        for key in ("loss", "entropy", "ratio_mean", "mismatch_kl", "num_tokens"):
            assert stats[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key
        assert stats["ratio_max"] == pytest.approx(expected["ratio_max"], rel=1e-6)
    assert np.array_equal(results[0][3], results[1][3]), "the replicas must stay bit-identical"


def full_weights(model: torch.nn.Module) -> np.ndarray:
    """The flat weights of a model whose parameters may be FSDP shards (gathered: tests only)."""
    tensors = [t.full_tensor() if isinstance(t, DTensor) else t for t in weight_objects(model)]
    return torch.cat([t.detach().flatten() for t in tensors]).numpy().copy()


def group_store() -> dist.TCPStore:
    """The ranks' rendezvous store, bound here on a port the kernel picks (as torchrun's agent
    does), so no other process can take the port between its choice and the bind. Keep it
    referenced until the ranks have joined."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def join_group(rank: int, world: int, port: int) -> TrainerRanks:
    """Join as `rank` through the store `group_store` holds at `port` (rank 0 a client too)."""
    os.environ |= {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }
    torch.set_num_threads(1)
    ranks = TrainerRanks.from_env("cpu", 60, "test")
    assert ranks is not None
    return ranks


def train_sharded_rank(rank: int, world: int, port: int, trainer: TrainerConfig, out: Any) -> None:
    """One FSDP rank: three steps from the seed's weights; rank 0 reports the whole weights."""
    ranks = join_group(rank, world, port)
    learner = Learner(build_policy(MODEL, seed=1), AlgorithmConfig(), trainer, 1.0, ranks=ranks)
    kinds = {type(p).__name__ for p in learner.policy.model.parameters()}
    for _ in range(3):
        learner.step(uneven_groups())
    weights = full_weights(learner.policy.model)
    out.put((rank, kinds, weights))
    ranks.close()


@pytest.mark.parametrize(
    ("checkpointing", "reduce"),
    [(False, "step"), (True, "micro_batch")],
    ids=["fsdp", "fsdp-ac-reduced-each-micro-batch"],
)
def test_fsdp_ranks_take_the_one_process_steps(checkpointing: bool, reduce: str) -> None:
    """Sharded ranks repeat each prompt (one pass) where one process shares it: same steps."""
    trainer = TRAINER.model_copy(
        update={
            "sharding": "fsdp",
            "activation_checkpointing": checkpointing,
            "reduce_gradients": reduce,
        }
    )
    groups = uneven_groups()
    cuts = [micro_batches(groups[r::2], TRAINER.micro_batch_tokens) for r in range(2)]
    assert len(cuts[0]) > len(cuts[1]), "rank 1 must run out of micro-batches first"
    assert min(g.width for g in groups) == 1, "a micro-batch of one-token completions"
    alone = Learner(build_policy(MODEL, seed=1), AlgorithmConfig(), TRAINER, 1.0)
    for _ in range(3):
        alone.step(uneven_groups())
    expected = flatten(alone.policy.model, 1).buffer.numpy()
    results = run_two_ranks(train_sharded_rank, trainer)
    for rank, kinds, weights in results:
        assert kinds == {"DTensor"}, f"rank {rank} holds whole parameters"
        difference = np.abs(weights - expected).max()
        assert difference <= TOLERANCE * np.abs(expected).max(), f"rank {rank}: {difference}"
    assert not np.array_equal(expected, flatten(build_policy(MODEL, seed=1).model, 0).buffer)


def publish_rank(config: SyncConfig, rank: int, world: int, port: int, rows: bool, metas: Any, done: Any) -> None:
    """One trainer rank: publish its shard of version 3 and serve it until the test is done;
    with `rows`, its FSDP2 chunks (every rank starts from the same weights)."""
    model = build_policy(MODEL, seed=1).model
    if rows:
        join_group(rank, world, port)
        Shards(torch.device("cpu"), TRAINER).wrap(model)
    publisher = make_publisher(config, "ranks-test", shard=Shard(rank, world, rows))
    try:
        metas.put((rank, publisher.publish(publisher.stage(model, 3))))
        done.wait(120)
    finally:
        publisher.close()


def receive(config: SyncConfig, meta: dict[str, str], dtype: str, worker_id: str, out: Any) -> None:
    """A generator holding its weights in `dtype`: fetch, swap in, report its weights."""
    policy = place(build_policy(MODEL, seed=99), "cpu", dtype)
    receiver = make_receiver(config, worker_id)
    version, fetched = receiver.fetch(meta)
    receiver.swap_in(policy.model, fetched)
    held = [t.detach() for t in weight_objects(policy.model)]
    assert {t.dtype for t in held} == {getattr(torch, dtype)}
    out.put((dtype, version, torch.cat([t.float().flatten() for t in held]).numpy()))
    receiver.close()


@pytest.mark.parametrize("rows", [False, True], ids=["replicas", "fsdp"])
@pytest.mark.parametrize("config", [ShmSync(timeout_s=30), GlooSync(bucket_mb=0.01, timeout_s=30)], ids=["shm", "gloo"])
def test_sharded_sync_from_two_ranks_reproduces_the_weights_in_two_generators(config: SyncConfig, rows: bool) -> None:
    ctx = mp.get_context("spawn")
    metas, out, done = ctx.Queue(), ctx.Queue(), ctx.Event()
    store = group_store()
    port = store.port
    ranks = [ctx.Process(target=publish_rank, args=(config, r, 2, port, rows, metas, done)) for r in range(2)]
    for proc in ranks:
        proc.start()
    generators = []
    try:
        shards = dict(metas.get(timeout=120) for _ in ranks)
        meta = {k: str(v) for k, v in join_shards([shards[0], shards[1]]).items()}
        meta["policy_version"] = "3"
        trainer = flatten(build_policy(MODEL, seed=1).model, 3).buffer.numpy()
        assert int(meta["num_bytes"]) == trainer.nbytes
        assert 0 < int(shards[0]["num_bytes"]) < trainer.nbytes, "each rank sends a part only"
        assert shards[0]["endpoint"] != shards[1]["endpoint"]
        assert meta["layout"] == ("rows" if rows else "runs")
        generators = [
            ctx.Process(target=receive, args=(config, meta, dtype, f"gen-{dtype}", out))
            for dtype in ("float32", "bfloat16")
        ]
        for proc in generators:
            proc.start()
        got = {dtype: (version, weights) for dtype, version, weights in (out.get(timeout=120) for _ in generators)}
    finally:
        done.set()
        for proc in [*ranks, *generators]:
            proc.join(60)
    assert all(proc.exitcode == 0 for proc in [*ranks, *generators])
    assert got["float32"][0] == got["bfloat16"][0] == 3
    assert got["float32"][1].tobytes() == trainer.tobytes(), "float32: bit for bit"
    cast = torch.from_numpy(trainer).to(torch.bfloat16).float().numpy()
    assert np.array_equal(got["bfloat16"][1], cast), "bfloat16: the trainer's weights, cast"
    assert np.all(np.abs(got["bfloat16"][1] - trainer) <= np.abs(trainer) * 2.0**-8)


def checkpoint_rank(rank: int, world: int, port: int, root: str, out: Any) -> None:
    """One FSDP rank: two steps, a checkpoint of every rank's shards (rank 0 writes the rest),
    a third step; rank 0 reports the whole weights after the third."""
    ranks = join_group(rank, world, port)
    trainer = TRAINER.model_copy(update={"sharding": "fsdp"})
    learner = Learner(build_policy(MODEL, seed=1), AlgorithmConfig(), trainer, 1.0, ranks=ranks)
    for _ in range(2):
        learner.step(step_groups())
    checkpoints = CheckpointStore(root, "test", keep=2)
    if rank == 0:
        checkpointer = Checkpointer(checkpoints, MemoryStore(), 1, sharded=True, ranks=ranks)
        checkpointer.save(learner, TrainerState(2, 2), ended_below=0)
        checkpointer.flush(120)  # written by a background thread: on disk before this ends
        ranks.send(Order("stop"))
    else:
        order = ranks.receive()
        assert order.op == "checkpoint" and order.step == 2
        save_shards(learner.policy.model, learner.optimizer, checkpoints.temp(order.step))
        assert ranks.receive().op == "stop"
    learner.step(step_groups())
    out.put((rank, full_weights(learner.policy.model)))
    ranks.close()


def test_a_two_rank_sharded_checkpoint_resumes_in_one_process(tmp_path: Path) -> None:
    """Resharded on load: one process (no group) reads the two ranks' shards of weights and
    AdamW moments and takes the third step the two ranks took; the export puts the same
    weights together."""
    results = dict(run_two_ranks(checkpoint_rank, str(tmp_path)))
    checkpoints = CheckpointStore(tmp_path, "test", keep=2)
    latest = checkpoints.latest()
    assert latest is not None and (latest / "shards").is_dir()
    assert not (latest / "optimizer.pt").exists(), "no rank gathered the optimizer state"
    restored = checkpoints.load(latest)
    assert restored.sharded and restored.state.step == 2
    config = RunConfig(trainer=TRAINER.model_copy(update={"sharding": "fsdp"}))
    alone = learner(config, restored.policy, restored, None)
    assert alone.optimizer.state, "the AdamW moments were restored"
    exported = checkpoint_model(latest).model  # what `llamarl export` writes: whole tensors
    assert flatten(exported, 2).checksum == flatten(alone.policy.model, 2).checksum
    alone.step(step_groups())
    weights = flatten(alone.policy.model, 3).buffer.numpy()
    assert np.abs(weights - results[0]).max() <= TOLERANCE * np.abs(weights).max()
    assert np.array_equal(results[0], results[1])


def idle_rank(rank: int, world: int, port: int, out: Any) -> None:
    """Rank 1 follows orders until it is killed; rank 0 waits for rollouts that never come,
    checking its ranks every 0.1 s, and reports whether (and how) a check failed."""
    ranks = join_group(rank, world, port)
    if rank == 1:
        out.put((1, "following"))
        while True:
            ranks.receive()
    deadline = time.monotonic() + 60
    checks = 0
    while time.monotonic() < deadline:
        try:
            ranks.check_ranks(0.1)
        except (RuntimeError, dist.DistError) as err:
            out.put((0, f"failed after {checks} checks: {err}"[:200]))
            return
        checks += 1
        if checks == 1:
            out.put((0, "checked"))
        time.sleep(0.05)
    out.put((0, "never failed"))


def test_a_rank_that_dies_while_rank_0_waits_for_rollouts_is_noticed() -> None:
    """torchrun sees only its own host's ranks: with rank 0 idle, a rank killed on another host
    went unnoticed and every rank waited for the next order. Rank 0's `check` orders fail once
    a rank has died, so its process ends and its torchrun with it."""
    ctx = mp.get_context("spawn")
    # A queue each: a rank killed while its queue's feeder thread held the queue's write lock
    # (a semaphore) leaves it held, and a report rank 0 put on a shared queue never came (3 runs
    # in 12 under load).
    outs = [ctx.Queue(), ctx.Queue()]
    store = group_store()
    procs = [ctx.Process(target=idle_rank, args=(r, 2, store.port, outs[r])) for r in range(2)]
    for proc in procs:
        proc.start()
    try:
        assert [out.get(timeout=120) for out in outs] == [(0, "checked"), (1, "following")]
        os.kill(procs[1].pid, signal.SIGKILL)
        rank, outcome = outs[0].get(timeout=90)
        assert rank == 0 and outcome.startswith("failed after"), outcome
    finally:
        for proc in procs:
            proc.kill()
            proc.join(30)
