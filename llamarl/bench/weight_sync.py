"""`llamarl bench weight-sync`: each weight transport against the raw limit of what it moves over,
measured on this machine in the same run.

For each model size: raw memcpy (one `copy_` of the bytes), raw torch.distributed gloo send/recv
between two processes (the same bucket size as ours, over a group formed beforehand), then ours:
the trainer's publish (stage = the copy on its critical path; publish = checksum and rename, on
its background thread) and the generators' pull (map or receive, verify, copy into the model), with
1, 2 and 4 generator processes pulling the same version at once. Every figure is the median of
`repeats` rounds (min and max beside it). Ratios: shm pull bandwidth / memcpy, gloo pull
bandwidth / raw send/recv, and the time for G generators / the time for one.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import time
from typing import Any

import torch
import torch.distributed as dist
from pydantic import TypeAdapter

from llamarl.bench.stats import spread
from llamarl.config import SyncConfig
from llamarl.net import free_port_block
from llamarl.weightsync import make_publisher, make_receiver
from llamarl.weightsync.gloo import gloo_pair_group
from llamarl.weightsync.p2p import buckets

NUM_TENSORS = 32
TIMEOUT_S = 120.0
WARMUP_ROUNDS = 2
"""Rounds not measured: pair groups form, pages are first touched, spare buffers appear."""
ARMS = {
    "shm": ("shm", "auto"),
    "shm_verified": ("shm", "always"),
    "gloo": ("gloo", "auto"),
    "gloo_size_only": ("gloo", "size"),
}
"""What is measured: transport and `sync.verify` (auto: checksum over gloo, size over shm)."""


class FlatModel(torch.nn.Module):
    """A stand-in model of `num_bytes` of float32 weights in NUM_TENSORS tensors."""

    def __init__(self, num_bytes: int, seed: int) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        per = num_bytes // 4 // NUM_TENSORS
        self.weights = torch.nn.ParameterList(
            torch.nn.Parameter(torch.randn(per, generator=generator)) for _ in range(NUM_TENSORS)
        )


def memcpy_s(num_bytes: int, repeats: int) -> list[float]:
    source = torch.randn(num_bytes // 4)
    target = torch.empty_like(source)
    target.copy_(source)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        target.copy_(source)
        times.append(time.perf_counter() - started)
    return times


def _raw_peer(rank: int, port: int, num_bytes: int, bucket_values: int, repeats: int, out) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timedelta(TIMEOUT_S))
    group = gloo_pair_group(store, rank, TIMEOUT_S)
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


def raw_gloo_s(num_bytes: int, bucket_values: int, repeats: int) -> list[float]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port_block(size=1)
    procs = [
        ctx.Process(target=_raw_peer, args=(rank, port, num_bytes, bucket_values, repeats, out))
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


def _generator(worker_id: str, config: SyncConfig, num_bytes: int, go, out) -> None:
    """Pull each announced version and swap it into a model, as a generator does; report the
    seconds each pull took."""
    torch.set_num_threads(1)
    model = FlatModel(num_bytes, seed=1)
    receiver = make_receiver(config, worker_id)
    while (meta := go.get(timeout=TIMEOUT_S * 4)) is not None:
        started = time.perf_counter()
        version, buffer = receiver.fetch(meta)
        receiver.swap_in(model, buffer)
        del buffer
        out.put((worker_id, version, time.perf_counter() - started))
    receiver.close()


def transport_rounds(
    transport: str,
    verify: str,
    num_bytes: int,
    num_generators: int,
    repeats: int,
    bucket_mb: float,
) -> dict[str, list[float]]:
    """Per round: the trainer's stage and publish seconds and the wall time until every
    generator has pulled and loaded that version."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    queues = [ctx.Queue() for _ in range(num_generators)]
    config = _sync_config(transport, verify, bucket_mb)
    procs = [
        ctx.Process(target=_generator, args=(f"gen-{i}", config, num_bytes, queues[i], out))
        for i in range(num_generators)
    ]
    for proc in procs:
        proc.start()
    trainer = FlatModel(num_bytes, seed=0)
    publisher = make_publisher(config, f"bench-{transport}")
    rounds: dict[str, list[float]] = {"stage_s": [], "publish_s": [], "pull_s": []}
    try:
        for version in range(repeats + WARMUP_ROUNDS):
            started = time.perf_counter()
            staged = publisher.stage(trainer, version)
            staged_at = time.perf_counter()
            meta = {k: str(v) for k, v in publisher.publish(staged).items()}
            published_at = time.perf_counter()
            for queue in queues:
                queue.put(meta | {"policy_version": str(version)})
            for _ in range(num_generators):
                _, got, _ = out.get(timeout=TIMEOUT_S * 2)
                assert got == version
            if version >= WARMUP_ROUNDS:
                rounds["stage_s"].append(staged_at - started)
                rounds["publish_s"].append(published_at - staged_at)
                rounds["pull_s"].append(time.perf_counter() - published_at)
    finally:
        for queue in queues:
            queue.put(None)
        for proc in procs:
            proc.join(TIMEOUT_S)
        publisher.close()
    return rounds


def _gbps(num_bytes: int, seconds: list[float]) -> dict[str, float]:
    rates = [num_bytes / s / 1e9 for s in seconds]
    return spread(rates)


def bench(
    sizes_mb: list[float], generators: list[int], repeats: int, bucket_mb: float
) -> dict[str, Any]:
    torch.set_num_threads(1)
    results: dict[str, Any] = {"sizes": []}
    for size_mb in sizes_mb:
        num_bytes = int(size_mb * 1024 * 1024) // (4 * NUM_TENSORS) * 4 * NUM_TENSORS
        bucket_values = max(1, int(bucket_mb * 1024 * 1024) // 4)
        entry: dict[str, Any] = {
            "mb": round(num_bytes / 2**20, 1),
            "memcpy_GBps": _gbps(num_bytes, memcpy_s(num_bytes, repeats)),
            "raw_gloo_GBps": _gbps(num_bytes, raw_gloo_s(num_bytes, bucket_values, repeats)),
        }
        for arm, (transport, verify) in ARMS.items():
            per_count: dict[str, Any] = {}
            for count in generators:
                rounds = transport_rounds(transport, verify, num_bytes, count, repeats, bucket_mb)
                per_count[str(count)] = {
                    "pull_s": spread(rounds["pull_s"], 4),
                    "pull_GBps": _gbps(num_bytes, rounds["pull_s"]),
                    "stage_s": spread(rounds["stage_s"], 4),
                    "publish_s": spread(rounds["publish_s"], 4),
                }
            entry[arm] = per_count
        first, last = str(generators[0]), str(generators[-1])
        for arm in ARMS:
            rate = entry[arm][first]["pull_GBps"]["median"]
            base = "raw_gloo" if arm.startswith("gloo") else "memcpy"
            entry[f"{arm}_vs_{base}"] = round(rate / entry[f"{base}_GBps"]["median"], 3)
            times = [entry[arm][c]["pull_s"]["median"] for c in (first, last)]
            entry[f"{arm}_time_{last}_vs_{first}"] = round(times[1] / times[0], 3)
        results["sizes"].append(entry)
    return results
