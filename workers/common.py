"""What every role process shares: arguments, config, logging, Redis, bus, heartbeats, stop.

A worker is built from this context and then runs its own loop; the loop calls `beat()` often and
stops when `stopping` is set (SIGTERM, SIGINT, or a `stop` command on the control topic).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import structlog
import torch

from llamarl.bus import BusClient, Subscriber
from llamarl.config import RunConfig, load_config, parse_config
from llamarl.curve import load_curve
from llamarl.errors import ConfigError
from llamarl.limits import Rejections
from llamarl.log import configure_logging
from llamarl.net import BrokerEndpoints
from llamarl.topics import CONTROL
from llamarl.version_store import VersionStore, WorkerBeat

log = structlog.get_logger(__name__)


@dataclass
class BusyTimer:
    """Busy and idle seconds of a worker's loop, from its own clock, counted from its first
    unit of work (start-up, model loading and the trainer's warm-start are not idle time)."""

    busy_s: float = 0.0
    idle_s: float = 0.0
    _mark: float | None = None

    def busy(self) -> None:
        now = time.monotonic()
        if self._mark is not None:
            self.idle_s += now - self._mark
        self._mark = now

    def idle(self) -> None:
        now = time.monotonic()
        if self._mark is not None:
            self.busy_s += now - self._mark
        self._mark = now


class WorkerContext:
    def __init__(self, role: str, config: RunConfig, worker_id: str) -> None:
        if config.redis.url is None or config.broker.port is None:
            raise ConfigError(
                "redis.url and broker.port: a worker needs both (or LLAMARL_REDIS_URL, LLAMARL_BROKER)"
            )
        self.role = role
        self.config = config
        self.worker_id = worker_id
        self.stopping = False
        self.timer = BusyTimer()
        self.counters: dict[str, float] = {}
        threads = {"trainer": config.workers.trainer_threads,
                   "generator": config.workers.generator_threads}.get(role)  # fmt: skip
        torch.set_num_threads(threads or 1)
        self.curve = load_curve(config.broker.curve_keys)
        self.store = VersionStore(config.redis.url, config.run_id, config.redis.connect_deadline_s)
        self.rejections = Rejections(
            role,
            lambda reason, count: self.store.count_rejected(role, reason, count),
            log_interval_s=config.broker.reject_log_interval_s,
        )
        self.bus = self.connect_bus()
        self.control: Subscriber = self.bus.subscribe([CONTROL])
        self._last_beat = 0.0
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self.store.register_worker(worker_id, role, config.workers.heartbeat_ttl_s)

    def connect_bus(self) -> BusClient:
        """A bus client of this worker; one per thread (ZeroMQ sockets are not thread-safe)."""
        config = self.config
        assert config.broker.port is not None
        return BusClient(
            BrokerEndpoints(config.broker.host, config.broker.port),
            run_id=config.run_id,
            sender=self.worker_id,
            hwm=config.broker.hwm,
            max_message_bytes=config.broker.max_message_bytes,
            on_reject=self.rejections.record,
            curve=self.curve,
        )

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True
        log.info("stopping on signal", signal=signal.Signals(signum).name)

    def stop_requested(self) -> bool:
        """True once a signal or a `stop` on the control topic asked this worker to stop."""
        while (message := self.control.recv(0)) is not None:
            if message[1].payload.command == "stop":
                log.info("stop requested", by=message[1].sender)
                self.stopping = True
        return self.stopping

    def beat(self, **status: Any) -> None:
        """Heartbeat (rate-limited); check the control topic and the run status for a stop."""
        now = time.monotonic()
        self.stop_requested()
        self.rejections.flush()
        if now - self._last_beat < self.config.workers.heartbeat_s:
            return
        self._last_beat = now
        if self.role != "trainer" and self.store.run_status() == "finished":
            # Also reaches a worker that joined after the stop message was published.
            self.stopping = True
        self.store.heartbeat(self.worker_id, self.config.workers.heartbeat_ttl_s,
                             **self._beat_fields(status))  # fmt: skip

    def add_time(self, name: str, started: float) -> float:
        """Add the seconds since `started` (time.monotonic) to the counter `name`; the counters
        go into the heartbeat and RUN_DIR/timers/, where the benchmarks read them."""
        elapsed = time.monotonic() - started
        self.counters[name] = self.counters.get(name, 0.0) + elapsed
        return elapsed

    def step_beat(self, **status: Any) -> WorkerBeat:
        """A heartbeat for the caller to write in its own Redis round trip (the trainer's one
        per step); the rate-limited `beat()` then has nothing to write for a while."""
        self._last_beat = time.monotonic()
        ttl_s = self.config.workers.heartbeat_ttl_s
        return WorkerBeat(self.worker_id, ttl_s, self._beat_fields(status))

    def _beat_fields(self, status: dict[str, Any]) -> dict[str, Any]:
        fields = {"role": self.role, "status": "running", "busy_s": round(self.timer.busy_s, 3)}
        return fields | {"idle_s": round(self.timer.idle_s, 3), **self.counters, **status}

    def write_timers(self) -> None:
        directory = Path(self.config.run_dir) / "timers"
        directory.mkdir(parents=True, exist_ok=True)
        record = {"role": self.role, "busy_s": self.timer.busy_s, "idle_s": self.timer.idle_s,
                  "bus_s": self.bus.busy_s}  # fmt: skip
        (directory / f"{self.worker_id}.json").write_text(json.dumps(record | self.counters))

    def close(self) -> None:
        self.write_timers()
        try:
            self.rejections.flush(force=True)
            self.store.heartbeat(
                self.worker_id, self.config.workers.heartbeat_ttl_s, status="stopped"
            )
        except ConnectionError:
            log.warning("could not record the stop in redis")
        self.bus.close()
        self.store.close()


def parse_worker_args(role: str, argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"llamarl worker {role}")
    parser.add_argument("--config", help="run config YAML (defaults apply when omitted)")
    parser.add_argument("--worker-id", default=os.environ.get("LLAMARL_WORKER_ID"))
    parser.add_argument("--log-format", choices=["auto", "console", "json"], default="auto")
    return parser.parse_args(argv)


def run_worker(role: str, argv: list[str] | None, body: Callable[[WorkerContext], None]) -> int:
    """Build the role's context, run `body`, always close. Exit codes: 0 done, 2 bad config,
    3 Redis unreachable past `redis.connect_deadline_s` (one clear line, no retry loop)."""
    args = parse_worker_args(role, argv)
    worker_id = args.worker_id or f"{role}-{socket.gethostname()}-{os.getpid()}"
    configure_logging(role, worker_id, args.log_format)
    try:
        config = load_config(args.config) if args.config else parse_config({})
        ctx = WorkerContext(role, config, worker_id)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    except ConnectionError as err:
        print(f"{role} {worker_id}: {err}", file=sys.stderr)
        return 3
    try:
        body(ctx)
    except ConnectionError as err:
        log.error("giving up", error=str(err))
        print(f"{role} {worker_id}: {err}", file=sys.stderr)
        return 3
    finally:
        ctx.close()
    return 0
