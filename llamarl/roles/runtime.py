"""What every role loop shares: its store and bus, a stop flag, heartbeats, busy/idle time and
counters.

A `RoleRuntime` is handed its collaborators and touches nothing global: the process that hosts it
(workers/, or the synchronous baseline) decides about signals, threads and connections. A loop
calls `beat()` often and ends when `stopping` is set (`request_stop()`, e.g. from a signal
handler, or a `stop` on the control topic).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from llamarl.bus import Bus
from llamarl.config import RunConfig
from llamarl.limits import Clock, Rejections
from llamarl.roles.liveness import BusWatch
from llamarl.store import Store, WorkerBeat
from llamarl.topics import CONTROL

log = structlog.get_logger(__name__)


SPAN_MERGE_S = 0.01
"""Busy spans closer together than this are recorded as one (the timeline's resolution)."""


@dataclass
class BusyTimer:
    """Busy and idle seconds of a loop, from its own clock, counted from its first unit of work
    (start-up, model loading and the trainer's warm start are not idle time), and the busy spans
    in wall-clock time for the per-role timeline (`llamarl plot`)."""

    clock: Clock = time.monotonic
    wall: Clock = time.time
    busy_s: float = 0.0
    idle_s: float = 0.0
    spans: list[list[float]] = field(default_factory=list)
    """[start, end] of each busy span, seconds since the epoch (comparable across processes)."""
    _mark: float | None = field(default=None, repr=False)
    _span_start: float | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        """Whether a busy span is open."""
        return self._span_start is not None

    def busy(self) -> None:
        now = self.clock()
        if self._mark is not None:
            self.idle_s += now - self._mark
        self._mark = now
        self._span_start = self.wall()

    def idle(self) -> None:
        now = self.clock()
        if self._mark is not None:
            self.busy_s += now - self._mark
        self._mark = now
        if self._span_start is not None:
            self._add_span(self._span_start, self.wall())
            self._span_start = None

    def _add_span(self, start: float, end: float) -> None:
        if self.spans and start - self.spans[-1][1] < SPAN_MERGE_S:
            self.spans[-1][1] = end
        else:
            self.spans.append([start, end])


@dataclass
class Phase:
    """The status a keep-alive thread beats; a `Progress` listener (`report`) moves it on."""

    status: str

    def report(self, label: str, done: int, total: int) -> None:
        self.status = f"{label} {done}/{total}"


class RoleRuntime:
    def __init__(
        self,
        role: str,
        config: RunConfig,
        worker_id: str,
        store: Store,
        bus: Bus,
        rejections: Rejections,
        connect_bus: Callable[[], Bus],
        clock: Clock = time.monotonic,
        bus_name: str = "the in-process bus",
    ) -> None:
        self.role = role
        self.config = config
        self.worker_id = worker_id
        self.store = store
        self.bus = bus
        self.rejections = rejections
        self.connect_bus = connect_bus
        """A further bus client, for a thread of the role's own (bus clients are not thread-safe)."""
        self.clock = clock
        self.stopping = False
        self.timer = BusyTimer(clock)
        self.counters: dict[str, float] = {}
        self.control = bus.subscribe([CONTROL])
        self.bus_watch = BusWatch(
            bus, bus_name, every_s=config.workers.heartbeat_s, dead_after_s=config.broker.dead_after_s, clock=clock
        )
        self._last_beat = -float("inf")

    def register(self) -> None:
        self.store.register_worker(self.worker_id, self.role, self.config.workers.heartbeat_ttl_s)

    def request_stop(self, reason: str) -> None:
        self.stopping = True
        log.info("stopping", reason=reason)

    def stop_requested(self) -> bool:
        """True once `request_stop()` or a `stop` on the control topic asked this role to stop."""
        while (message := self.control.recv(0)) is not None:
            if message[1].payload.command == "stop":
                self.request_stop(f"stop from {message[1].sender}")
        return self.stopping

    def beat(self, **status: Any) -> None:
        """Heartbeat (rate-limited); check the control topic and the run status for a stop, and
        that the bus still answers (ConnectionError once it has been silent too long)."""
        now = self.clock()
        self.stop_requested()
        self.bus_watch.check()
        self.rejections.flush()
        if now - self._last_beat < self.config.workers.heartbeat_s:
            return
        self._last_beat = now
        if self.role != "trainer" and self.store.run_status() == "finished":
            # Also reaches a worker that joined after the stop message was published.
            self.stopping = True
        ttl_s = self.config.workers.heartbeat_ttl_s
        self.store.heartbeat(self.worker_id, ttl_s, **self._beat_fields(status))

    @contextmanager
    def keep_alive(self, status: str, beat_now: bool = True) -> Iterator[Phase]:
        """Heartbeats with `status`, from a thread of their own, while the caller spends what may
        be longer than a heartbeat TTL in one call (warm start, evaluation, an LLM's training step
        or generation batch); the next `beat()` sets the status back. `beat_now=False` waits a
        heartbeat interval before the first one (for phases that are usually short). The phase
        it yields can report progress: `phase.report(label, done, total)` shows in the status."""
        ttl_s = self.config.workers.heartbeat_ttl_s
        done = threading.Event()
        phase = Phase(status)

        def beat() -> None:
            if not beat_now and done.wait(self.config.workers.heartbeat_s):
                return
            while True:
                try:  # with role and pid: a key that expired is re-created whole
                    fields = self._beat_fields({"status": phase.status})
                    self.store.heartbeat(self.worker_id, ttl_s, **fields)
                except ConnectionError as err:  # the phase goes on; the next beat retries
                    log.warning("heartbeat failed", status=status, error=str(err))
                if done.wait(self.config.workers.heartbeat_s):
                    return

        thread = threading.Thread(target=beat, name=f"keep-alive-{status}", daemon=True)
        thread.start()
        try:
            yield phase
        finally:
            done.set()
            thread.join()

    def count(self, name: str, amount: float = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + amount

    def add_time(self, name: str, started: float) -> float:
        """Add the seconds since `started` (this runtime's clock) to the counter `name`; the
        counters go into the heartbeat and RUN_DIR/timers/, where the benchmarks read them."""
        elapsed = self.clock() - started
        self.count(name, elapsed)
        return elapsed

    def step_beat(self, **status: Any) -> WorkerBeat:
        """A heartbeat for the caller to write in its own store round trip (the trainer's one per
        step); the rate-limited `beat()` then has nothing to write for a while."""
        self._last_beat = self.clock()
        ttl_s = self.config.workers.heartbeat_ttl_s
        return WorkerBeat(self.worker_id, ttl_s, self._beat_fields(status))

    def _beat_fields(self, status: dict[str, Any]) -> dict[str, Any]:
        # With its pid: a registration that expired (a long warm start) is re-created by a beat.
        fields = {"role": self.role, "pid": os.getpid(), "status": "running", "busy_s": round(self.timer.busy_s, 3)}
        return fields | {"idle_s": round(self.timer.idle_s, 3), **self.counters, **status}

    def identity(self) -> dict[str, str]:
        """Whose this runtime is: its run, role and worker id."""
        return {"run_id": self.config.run_id, "role": self.role, "worker_id": self.worker_id}

    def gauges(self) -> dict[str, float]:
        """Busy, idle and bus seconds and every counter, as they are now: what a worker's
        Prometheus export reads at each scrape and RUN_DIR/timers/ gets at the end."""
        return {"busy_s": self.timer.busy_s, "idle_s": self.timer.idle_s, "bus_s": self.bus.busy_s, **self.counters}

    def write_timers(self) -> None:
        directory = Path(self.config.run_dir) / "timers"
        directory.mkdir(parents=True, exist_ok=True)
        spans = [[round(t, 3) for t in span] for span in self.timer.spans]
        record = {"role": self.role, **self.gauges(), "busy_spans": spans}
        (directory / f"{self.worker_id}.json").write_text(json.dumps(record))

    def close(self) -> None:
        """Write the timers, record the stop, close the bus (the store belongs to the caller)."""
        self.write_timers()
        try:
            self.rejections.flush(force=True)
            self.store.record_stop(self.worker_id)
        except ConnectionError:
            log.warning("could not record the stop in the store")
        self.control.close()
        self.bus.close()
