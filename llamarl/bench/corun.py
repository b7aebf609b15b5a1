"""The profile's co-run probes: how a generator and a trainer slow each other on this machine.

Two forked copies of the profiling process (one-threaded and warm when forked), one repeating a
generation unit and one a training unit, each warmed once (its first touch of the memory it
shares with the parent copies it: for a 135M-parameter model, seconds) and then reused for every
phase: each role alone on one core, both side by side on a core each, and a trainer on every
core alone and then beside a one-thread generator, left to the scheduler. A phase's units start
together and repeat for CORUN_S (at least once); every repeat's seconds come back. Orders and
times travel as JSON over pipes.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from typing import Any, Protocol

import torch

CORUN_S = 1.5
"""Seconds each probe repeats its unit of work in a phase."""
REPLY_S = 600
"""Seconds to wait for a probe's reply before giving up on it."""

Work = Callable[[], Any]


def _serve(work: Work, conn: Connection, go: Any, every_core: list[int]) -> None:
    """A probe: warm once, then for each order ([threads, core or null]) set them up (warm
    again on a new thread count), say ready, wait for go, repeat `work` for CORUN_S and send
    back every repeat's seconds; a null order ends it."""
    work()
    conn.send_bytes(b"ready")
    threads_now = torch.get_num_threads()
    while (order := json.loads(conn.recv_bytes())) is not None:
        threads, core = order
        os.sched_setaffinity(0, {core} if core is not None else set(every_core))
        if threads != threads_now:
            torch.set_num_threads(threads)
            threads_now = threads
            work()
        conn.send_bytes(b"ready")
        go.wait()
        times: list[float] = []
        ends = time.perf_counter() + CORUN_S
        while time.perf_counter() < ends or not times:
            started = time.perf_counter()
            work()
            times.append(time.perf_counter() - started)
        conn.send_bytes(json.dumps(times).encode())


class Probe:
    """A forked probe repeating one unit of work on order."""

    def __init__(self, ctx: Any, label: str, work: Work, go: Any) -> None:
        self.label = label
        self.conn, child = ctx.Pipe()
        every_core = sorted(os.sched_getaffinity(0))
        self.proc = ctx.Process(target=_serve, args=(work, child, go, every_core), daemon=True)
        self.proc.start()

    def reply(self) -> bytes:
        if not self.conn.poll(REPLY_S):
            raise RuntimeError(f"profile: the {self.label} probe did not answer in {REPLY_S} s")
        return self.conn.recv_bytes()

    def order(self, threads: int, core: int | None) -> None:
        self.conn.send_bytes(json.dumps([threads, core]).encode())

    def close(self) -> None:
        if self.proc.is_alive():
            self.conn.send_bytes(b"null")
            self.proc.join(60)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


class Outside(Protocol):
    """A probe in a process not forked from this one (`llamarl.bench.engine_probe`): ordered
    and read as a `Probe`, its go given by `start`."""

    label: str

    def order(self, threads: int, core: int | None) -> None: ...
    def reply(self) -> bytes: ...
    def start(self) -> None: ...
    def close(self) -> None: ...


class ProbeSet:
    """A warm probe per labelled unit, sharing one go signal, and the `outside` probes."""

    def __init__(self, units: dict[str, Work], outside: tuple[Outside, ...] = ()) -> None:
        ctx = mp.get_context("fork")
        self.go = ctx.Event()
        self.probes: dict[str, Probe | Outside] = {
            label: Probe(ctx, label, work, self.go) for label, work in units.items()
        }
        self.outside = {probe.label: probe for probe in outside}
        self.probes |= self.outside

    def phase(self, orders: dict[str, tuple[int, int | None]]) -> dict[str, list[float]]:
        """Every repeat's seconds of the ordered probes (label: (threads, core or None)),
        started together."""
        self.go.clear()
        for label, (threads, core) in orders.items():
            self.probes[label].order(threads, core)
        for label in orders:
            self.probes[label].reply()
        self.go.set()
        for label in orders.keys() & self.outside.keys():
            self.outside[label].start()
        return {label: json.loads(self.probes[label].reply()) for label in orders}


@contextmanager
def forked(units: dict[str, Work], outside: tuple[Outside, ...] = ()) -> Iterator[ProbeSet]:
    """The units' probes, warm, and the `outside` ones (warm when they first reply), all closed
    on the way out."""
    probes = ProbeSet(units, outside)
    try:
        for probe in probes.probes.values():
            probe.reply()
        yield probes
    finally:
        for probe in probes.probes.values():
            probe.close()


def corun(generate: Work | Outside, train: Work) -> tuple[dict[str, float], float, dict[str, float], dict[str, Any]]:
    """(each role's time beside the other / alone, a core each; the oversubscribed slowdown: a
    trainer on every core beside a one-thread generator, left to the scheduler, against its
    fair share of the cores (its threads wait for each other at every parallel region, so one
    descheduled thread holds up all of them); each role's spread alone, as a coefficient of
    variation; the probes' median seconds). `generate` is a unit to fork, or a probe of its own
    (a vLLM generator, `llamarl.bench.engine_probe`)."""
    cores = sorted(os.sched_getaffinity(0))
    roles = ("generate", "train")
    units: dict[str, Work] = {"train": train}
    outside: tuple[Outside, ...] = ()
    if callable(generate):
        units = {"generate": generate, "train": train}
    else:
        outside = (generate,)
    with forked(units, outside) as probes:
        alone_runs = {role: probes.phase({role: (1, cores[0])})[role] for role in roles}
        alone = {role: statistics.median(t) for role, t in alone_runs.items()}
        jitter = {role: statistics.pstdev(t) / statistics.mean(t) for role, t in alone_runs.items()}
        if len(cores) == 1:
            return {}, 1.0, jitter, {"alone": alone}
        side_runs = probes.phase({"generate": (1, cores[0]), "train": (1, cores[1])})
        side = {role: statistics.median(t) for role, t in side_runs.items()}
        slowdown = {role: max(1.0, side[role] / alone[role]) for role in roles}
        wide_alone = statistics.median(probes.phase({"train": (len(cores), None)})["train"])
        crowd = probes.phase({"train": (len(cores), None), "generate": (1, None)})
    fair = (len(cores) + 1) / len(cores)
    crowded = statistics.median(crowd["train"]) / (wide_alone * fair * slowdown["train"])
    probes_s = {
        "alone": alone,
        "side_by_side": side,
        "train_on_every_core": wide_alone,
        "crowded": {label: statistics.median(t) for label, t in crowd.items()},
    }
    return slowdown, max(1.0, crowded), jitter, probes_s
