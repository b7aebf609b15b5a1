"""`llamarl bench weight-sync`: each weight transport against the raw limit of what it moves over,
with a trainer of 1 and of 2 data-parallel ranks, measured on this machine in the same run.

For each model size: raw memcpy (one `copy_` of the bytes), raw torch.distributed gloo send/recv
between two processes (the same bucket size as ours, over a group formed beforehand), then ours.
The trainer is one publisher process per rank (`--trainer-ranks`; a 1-rank trainer is one such
process too, so both are measured the same way), each holding the whole model and publishing its
shard of every version (`weight_sync_ranks`): stage = the copy on the rank's critical path (with
2 ranks each copies half), publish = checksum and rename or hand-over to its weight server (a
background thread in a real trainer). The bench process joins the ranks' metadata and hands it
to 1, 2 and 4 generator processes (`--generators`) that pull the same version at once (map or
receive every shard, verify, bind into the model); pull time runs from that hand-over until every
generator holds the version. After each pull every generator's weights are checked bit for bit
against the trainer's (a checksum, outside the timed pull). An arm's processes start once: a
trainer per rank count and the most generators asked for (a round of G uses G of them, the rest
wait idle). For each generator count the rank counts take turns round by round (the order
alternating), pulling the same versions of the same bytes through the same generators. Every
figure is the median of `repeats` rounds (min and max beside it); a trainer's stage and publish
times are its slowest rank's each round, stage also per rank. Ratios, per rank count: shm pull
bandwidth / memcpy, gloo pull bandwidth / raw send/recv, the time for G generators / the time
for one; per generator count: the pull time and the stage time of the most ranks / of one.

`--generator-device cuda`: the generators hold their weights on the GPU (a pull ends when they
are there), and shared memory is compared with a raw host-to-GPU copy from pageable memory
(`h2d`) instead of memcpy.
"""

from __future__ import annotations

import datetime
import itertools
import multiprocessing as mp
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from pydantic import TypeAdapter

from llamarl.bench.hosts import Placement, two_hosts
from llamarl.bench.stats import spread
from llamarl.bench.weight_sync_ranks import (
    NUM_TENSORS,
    TIMEOUT_S,
    Generators,
    Published,
    Trainer,
    trainer_checksum,
)
from llamarl.config import SyncConfig
from llamarl.errors import ConfigError
from llamarl.net import address_towards, free_port_block
from llamarl.weightsync.gloo import gloo_pair_group
from llamarl.weightsync.p2p import buckets

WARMUP_ROUNDS = 3
"""Rounds not measured: pair groups form, pages are first touched, spare buffers appear (a gloo
rank's staging pool grows to 3 buffers: 2 versions served while the next is staged)."""
DIGITS = 6
ARMS = {
    "shm": ("shm", "auto"),
    "shm_verified": ("shm", "always"),
    "gloo": ("gloo", "auto"),
    "gloo_size_only": ("gloo", "size"),
}
"""What is measured: transport and `sync.verify` (auto: checksum over gloo, size over shm)."""


def copy_s(num_bytes: int, repeats: int, device: str = "cpu") -> list[float]:
    """Seconds of each raw copy of the bytes from ordinary (pageable) memory into a buffer on
    `device`: memcpy on the CPU; on cuda, the host-to-GPU copy a generator there makes of a
    mapped version."""
    source = torch.randn(num_bytes // 4)
    target = torch.empty_like(source, device=device)
    target.copy_(source)
    times = []
    for _ in range(repeats):
        if target.is_cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        target.copy_(source)
        if target.is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return times


def _raw_peer(
    rank: int,
    port: int,
    num_bytes: int,
    bucket_values: int,
    repeats: int,
    out: Any,
    placement: Placement | None,
) -> None:
    host = "127.0.0.1"
    if placement is not None:  # rank 0 on the trainer's host, rank 1 on the generators'
        placement.enter("trainer" if rank == 0 else "generator")
        host = placement.trainer_address
    torch.set_num_threads(1)
    store = dist.TCPStore(host, port, 2, rank == 0, timedelta(TIMEOUT_S))
    group = gloo_pair_group(store, rank, TIMEOUT_S, host if rank == 0 else address_towards(host))
    buffer = torch.randn(num_bytes // 4) if rank == 0 else torch.empty(num_bytes // 4)
    times = []
    for _ in range(repeats + 1):  # the first round warms the connection up
        group.barrier().wait()
        started = time.perf_counter()
        for tag, (start, end) in enumerate(buckets(buffer.numel(), bucket_values)):
            chunk = [buffer[start:end]]
            work = group.send(chunk, 1, tag) if rank == 0 else group.recv(chunk, 0, tag)
            work.wait(timedelta(TIMEOUT_S))
        times.append(time.perf_counter() - started)
    if rank == 1:
        out.put(times[1:])


def timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def raw_gloo_s(num_bytes: int, bucket_values: int, repeats: int, placement: Placement | None = None) -> list[float]:
    """Seconds of each raw gloo send of the bytes between two processes (across the link of
    `placement`'s two hosts, when given), in buckets as ours."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port_block(size=1)  # free on the trainer's host too: a namespace of its own
    procs = [
        ctx.Process(
            target=_raw_peer,
            args=(rank, port, num_bytes, bucket_values, repeats, out, placement),
        )
        for rank in (0, 1)
    ]
    for proc in procs:
        proc.start()
    times: list[float] = out.get(timeout=TIMEOUT_S * 2)
    for proc in procs:
        proc.join(TIMEOUT_S)
    return times


def _sync_config(transport: str, verify: str, bucket_mb: float) -> SyncConfig:
    """The arm's `sync` section; `bucket_mb` where the transport streams in buckets."""
    fields = {"transport": transport, "timeout_s": TIMEOUT_S, "verify": verify}
    config: SyncConfig = TypeAdapter(SyncConfig).validate_python(fields)
    if "bucket_mb" in type(config).model_fields:
        config = config.model_copy(update={"bucket_mb": bucket_mb})
    return config


@dataclass
class Rounds:
    """The measured rounds of one trainer (one rank count)."""

    stage_s: list[list[float]] = field(default_factory=list)
    """Per round, per rank."""
    publish_s: list[list[float]] = field(default_factory=list)
    """Per round, per rank."""
    pull_s: list[float] = field(default_factory=list)
    """Per round: until every generator holds the version."""

    def add(self, published: Published, pull_s: float) -> None:
        self.stage_s.append(published.stage_s)
        self.publish_s.append(published.publish_s)
        self.pull_s.append(pull_s)


def arm_rounds(
    transport: str,
    verify: str,
    num_bytes: int,
    generators: Sequence[int],
    trainer_ranks: Sequence[int],
    repeats: int,
    bucket_mb: float,
    generator_device: str = "cpu",
    placement: Placement | None = None,
) -> dict[tuple[int, int], Rounds]:
    """Per (rank count, generator count): the measured rounds of one arm. Its processes start
    once: a trainer per rank count and the most generators asked for (on two hosts with
    `placement`: the trainer's weight servers bind its host's address)."""
    ctx = mp.get_context("spawn")
    config = _sync_config(transport, verify, bucket_mb)
    if placement is not None:
        config = config.model_copy(update={"host": placement.trainer_address})
    expected = trainer_checksum(num_bytes)
    pool = Generators(ctx, config, num_bytes, max(generators), generator_device, placement)
    trainers: dict[int, Trainer] = {}
    rounds = {(ranks, count): Rounds() for ranks in trainer_ranks for count in generators}
    versions = itertools.count()
    try:
        for ranks in trainer_ranks:
            run_id = f"bench-{transport}-r{ranks}"
            trainers[ranks] = Trainer(ctx, config, run_id, num_bytes, ranks, placement)
        for count in generators:
            for index in range(WARMUP_ROUNDS + repeats):
                version = next(versions)
                # the rank counts take turns, in alternating order, on the same generators
                order = trainer_ranks if index % 2 == 0 else list(reversed(trainer_ranks))
                for ranks in order:
                    published = trainers[ranks].publish(version)
                    pull_s = pool.pull(published.meta, count)
                    pool.check(expected, count)
                    if index >= WARMUP_ROUNDS:
                        rounds[ranks, count].add(published, pull_s)
    finally:
        pool.close()
        for trainer in trainers.values():
            trainer.close()
    return rounds


def transport_rounds(
    transport: str,
    verify: str,
    num_bytes: int,
    num_generators: int,
    repeats: int,
    bucket_mb: float,
) -> dict[str, list[float]]:
    """Per round of a 1-rank trainer: its stage and publish seconds and the wall time until
    every generator has pulled and loaded that version."""
    measured = arm_rounds(transport, verify, num_bytes, [num_generators], [1], repeats, bucket_mb)
    rounds = measured[1, num_generators]
    return {
        "stage_s": [max(r) for r in rounds.stage_s],
        "publish_s": [max(r) for r in rounds.publish_s],
        "pull_s": rounds.pull_s,
    }


def _gbps(num_bytes: int, seconds: list[float]) -> dict[str, float]:
    rates = [num_bytes / s / 1e9 for s in seconds]
    return spread(rates)


def summary(num_bytes: int, rounds: Rounds) -> dict[str, Any]:
    """One (arm, rank count, generator count): pull time and bandwidth; stage and publish time
    of the slowest rank each round, and stage time per rank."""
    return {
        "pull_s": spread(rounds.pull_s, DIGITS),
        "pull_GBps": _gbps(num_bytes, rounds.pull_s),
        "stage_s": spread([max(r) for r in rounds.stage_s], DIGITS),
        "stage_s_per_rank": [spread(list(rank), DIGITS) for rank in zip(*rounds.stage_s, strict=True)],
        "publish_s": spread([max(r) for r in rounds.publish_s], DIGITS),
    }


def add_ratios(entry: dict[str, Any], arm: str, generators: Sequence[int], trainer_ranks: Sequence[int]) -> None:
    """The arm's ratios (see the module docstring) into `entry`, medians over medians."""

    def median(ranks: int, count: int, figure: str) -> float:
        value: float = entry[arm][f"ranks_{ranks}"][f"generators_{count}"][figure]["median"]
        return value

    local = "h2d" if "h2d_GBps" in entry else "memcpy"  # what a shared-memory pull moves over
    base = "raw_gloo" if arm.startswith("gloo") else local
    g0, g1 = generators[0], generators[-1]
    r0, r1 = trainer_ranks[0], trainer_ranks[-1]
    entry[f"{arm}_vs_{base}"] = {
        f"ranks_{r}": round(median(r, g0, "pull_GBps") / entry[f"{base}_GBps"]["median"], 3) for r in trainer_ranks
    }
    entry[f"{arm}_time_{g1}_vs_{g0}"] = {
        f"ranks_{r}": round(median(r, g1, "pull_s") / median(r, g0, "pull_s"), 3) for r in trainer_ranks
    }
    for figure in ("pull_s", "stage_s"):
        name = f"{arm}_{figure[:-2]}_time_ranks_{r1}_vs_{r0}"
        entry[name] = {f"generators_{g}": round(median(r1, g, figure) / median(r0, g, figure), 3) for g in generators}


def size_entry(
    size_mb: float,
    generators: Sequence[int],
    trainer_ranks: Sequence[int],
    repeats: int,
    bucket_mb: float,
    generator_device: str,
    placement: Placement | None = None,
) -> dict[str, Any]:
    """Every figure of one model size (a raw host-to-GPU copy too, for generators on the GPU);
    with `placement`, the network arms only, across its two hosts' link."""
    num_bytes = int(size_mb * 1024 * 1024) // (4 * NUM_TENSORS) * 4 * NUM_TENSORS
    bucket_values = max(1, int(bucket_mb * 1024 * 1024) // 4)
    raw = raw_gloo_s(num_bytes, bucket_values, repeats, placement)
    entry: dict[str, Any] = {
        "mb": round(num_bytes / 2**20, 1),
        "memcpy_GBps": _gbps(num_bytes, copy_s(num_bytes, repeats)),
        "raw_gloo_GBps": _gbps(num_bytes, raw),
    }
    if generator_device == "cuda":
        entry["h2d_GBps"] = _gbps(num_bytes, copy_s(num_bytes, repeats, "cuda"))
    arms = {arm: how for arm, how in ARMS.items() if placement is None or how[0] != "shm"}
    for arm, (transport, verify) in arms.items():
        measured = arm_rounds(
            transport,
            verify,
            num_bytes,
            generators,
            trainer_ranks,
            repeats,
            bucket_mb,
            generator_device,
            placement,
        )
        entry[arm] = {
            f"ranks_{ranks}": {
                f"generators_{count}": summary(num_bytes, measured[ranks, count]) for count in generators
            }
            for ranks in trainer_ranks
        }
        add_ratios(entry, arm, generators, trainer_ranks)
    return entry


def bench(
    sizes_mb: list[float],
    generators: list[int],
    repeats: int,
    bucket_mb: float,
    trainer_ranks: Sequence[int] = (1, 2),
    generator_device: str = "cpu",
    across_hosts: bool = False,
) -> dict[str, Any]:
    """Every size's figures; `across_hosts`: the trainer and the generators on two simulated
    hosts (`llamarl.bench.hosts`), gloo only (shared memory cannot cross hosts)."""
    if generator_device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--generator-device: cuda, but this machine has no CUDA device")
    torch.set_num_threads(1)
    with two_hosts() if across_hosts else nullcontext() as placement:
        sizes = [
            size_entry(mb, generators, trainer_ranks, repeats, bucket_mb, generator_device, placement)
            for mb in sizes_mb
        ]
    return {
        "generators": generators,
        "trainer_ranks": list(trainer_ranks),
        "generator_device": generator_device,
        "across_hosts": across_hosts,
        "sizes": sizes,
    }
