"""The processes of `llamarl bench weight-sync`: a trainer of one or more data-parallel ranks, each
rank a publisher process of its own, and the generator processes that pull from it.

Every rank builds the same stand-in model (same seed: data-parallel replicas hold identical
weights) and, when told a version, stages and publishes its shard of it (`flat.Shard`), reporting
its metadata and its stage and publish seconds; between versions it keeps serving (a gloo rank's
weight server is a thread of its process, so the ranks' servers send in parallel). The bench
process joins the ranks' metadata (`messages.join_shards`) and hands it to the generators, which
pull it and, when asked, report a checksum of the weights their model then holds, so the bench
can check every delivery bit for bit against the trainer's weights.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from multiprocessing.context import SpawnContext
from typing import Any

import torch

from llamarl.bench.hosts import Placement
from llamarl.config import SyncConfig
from llamarl.errors import SyncError
from llamarl.weightsync import make_publisher, make_receiver
from llamarl.weightsync.flat import Checksum, Shard, weight_objects
from llamarl.weightsync.messages import join_shards

NUM_TENSORS = 32
TIMEOUT_S = 120.0
VERIFY = "verify"
"""Told to a generator: report the checksum of the weights its model holds."""


class FlatModel(torch.nn.Module):
    """A stand-in model of `num_bytes` of float32 weights in NUM_TENSORS tensors."""

    def __init__(self, num_bytes: int, seed: int) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        per = num_bytes // 4 // NUM_TENSORS
        self.weights = torch.nn.ParameterList(
            torch.nn.Parameter(torch.randn(per, generator=generator)) for _ in range(NUM_TENSORS)
        )


TRAINER_SEED = 0
GENERATOR_SEED = 1
"""A generator starts from other weights, so only a delivered version can match the trainer's."""


def model_checksum(model: torch.nn.Module) -> str:
    """The checksum of the model's weights laid end to end (that of its flat buffer)."""
    digest = Checksum()
    for tensor in weight_objects(model):
        digest.update(tensor.detach().reshape(-1).cpu())
    return digest.hexdigest()


def trainer_checksum(num_bytes: int) -> str:
    """What every generator must hold after each pull."""
    return model_checksum(FlatModel(num_bytes, TRAINER_SEED))


def _rank(
    config: SyncConfig,
    run_id: str,
    num_bytes: int,
    shard: Shard,
    todo: Any,
    out: Any,
    placement: Placement | None,
) -> None:
    """One trainer rank: stage and publish its shard of each version it is told, report (rank,
    version, metadata, stage seconds, publish seconds); serve until told None."""
    if placement is not None:
        placement.enter("trainer")
    torch.set_num_threads(1)
    model = FlatModel(num_bytes, TRAINER_SEED)
    publisher = make_publisher(config, run_id, curve=None, on_reject=None, shard=shard)
    try:
        while (version := todo.get(timeout=TIMEOUT_S * 4)) is not None:
            started = time.perf_counter()
            staged = publisher.stage(model, version)
            staged_at = time.perf_counter()
            meta = publisher.publish(staged)
            published_at = time.perf_counter()
            out.put((shard.index, version, meta, staged_at - started, published_at - staged_at))
    finally:
        publisher.close()


def _generator(
    worker_id: str,
    config: SyncConfig,
    num_bytes: int,
    device: str,
    todo: Any,
    out: Any,
    placement: Placement | None,
) -> None:
    """Pull each announced version and swap it into a model on `device`, as a generator does,
    reporting the seconds each pull took (until the weights are on the device); on VERIFY report
    the checksum of the model's weights."""
    if placement is not None:
        placement.enter("generator")
    torch.set_num_threads(1)
    model = FlatModel(num_bytes, GENERATOR_SEED).to(device)
    receiver = make_receiver(config, worker_id)
    while (task := todo.get(timeout=TIMEOUT_S * 4)) is not None:
        if task == VERIFY:
            out.put((worker_id, model_checksum(model)))
            continue
        started = time.perf_counter()
        version, fetched = receiver.fetch(task)
        receiver.swap_in(model, fetched)
        if device == "cuda":
            torch.cuda.synchronize()
        del fetched
        out.put((worker_id, version, time.perf_counter() - started))
    receiver.close()


def shards(num_ranks: int) -> list[Shard]:
    return [Shard(rank, num_ranks) for rank in range(num_ranks)]


def _join(procs: list[Any], queues: list[Any]) -> None:
    for queue in queues:
        queue.put(None)
    for proc in procs:
        proc.join(TIMEOUT_S)


@dataclass(frozen=True)
class Published:
    """One version as the ranks published it."""

    meta: dict[str, str]
    """The joined metadata a generator is handed (all strings, with policy_version)."""
    stage_s: list[float]
    """Per rank."""
    publish_s: list[float]
    """Per rank."""


class Trainer:
    """A trainer of `num_ranks` data-parallel ranks, one publisher process each."""

    def __init__(
        self,
        ctx: SpawnContext,
        config: SyncConfig,
        run_id: str,
        num_bytes: int,
        num_ranks: int,
        placement: Placement | None = None,
    ) -> None:
        self.out = ctx.Queue()
        self.todo = [ctx.Queue() for _ in range(num_ranks)]
        self.procs = [
            ctx.Process(target=_rank, args=(config, run_id, num_bytes, shard, todo, self.out, placement))
            for shard, todo in zip(shards(num_ranks), self.todo, strict=True)
        ]
        for proc in self.procs:
            proc.start()

    def publish(self, version: int) -> Published:
        """Every rank stages and publishes its shard of `version` at once."""
        for todo in self.todo:
            todo.put(version)
        reports = sorted(self.out.get(timeout=TIMEOUT_S * 2) for _ in self.todo)
        if [r[:2] for r in reports] != [(rank, version) for rank in range(len(self.todo))]:
            raise SyncError(f"version {version}: ranks reported {[r[:2] for r in reports]}")
        joined = join_shards([r[2] for r in reports]) | {"policy_version": version}
        meta = {key: str(value) for key, value in joined.items()}
        return Published(meta, [r[3] for r in reports], [r[4] for r in reports])

    def close(self) -> None:
        _join(self.procs, self.todo)


class Generators:
    """Generator processes pulling the same versions at once into models on `device`; a round of
    `count` uses the first `count` of them (the others wait idle, taking no CPU)."""

    def __init__(
        self,
        ctx: SpawnContext,
        config: SyncConfig,
        num_bytes: int,
        num_generators: int,
        device: str,
        placement: Placement | None = None,
    ) -> None:
        self.out = ctx.Queue()
        self.todo = [ctx.Queue() for _ in range(num_generators)]
        self.procs = [
            ctx.Process(
                target=_generator,
                args=(f"gen-{i}", config, num_bytes, device, todo, self.out, placement),
            )
            for i, todo in enumerate(self.todo)
        ]
        for proc in self.procs:
            proc.start()

    def pull(self, meta: dict[str, str], count: int) -> float:
        """Seconds from handing `count` generators `meta` until each has pulled and loaded it."""
        started = time.perf_counter()
        for todo in self.todo[:count]:
            todo.put(meta)
        for _ in range(count):
            worker_id, version, _ = self.out.get(timeout=TIMEOUT_S * 2)
            if str(version) != meta["policy_version"]:
                raise SyncError(f"{worker_id} pulled version {version}, not {meta['policy_version']}")
        return time.perf_counter() - started

    def check(self, expected: str, count: int) -> None:
        """SyncError unless each of the first `count` generators' models holds exactly the
        weights whose checksum is `expected` (run after `pull`, outside its time)."""
        for todo in self.todo[:count]:
            todo.put(VERIFY)
        for _ in range(count):
            worker_id, got = self.out.get(timeout=TIMEOUT_S * 2)
            if got != expected:
                raise SyncError(f"{worker_id} holds weights other than the trainer's")

    def close(self) -> None:
        _join(self.procs, self.todo)
