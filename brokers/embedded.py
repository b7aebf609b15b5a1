"""A private Redis and broker for one run on one machine, started and stopped together.

Used by `llamarl run` when the config names no Redis URL, and by the integration tests. The broker
runs as its own process (`python -m brokers`), exactly as in a cluster.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from brokers.redis_server import RedisServer
from llamarl.bus import query_broker_stats
from llamarl.curve import load_curve
from llamarl.launch import supervise
from llamarl.net import BrokerEndpoints, free_port_block


@dataclass
class EmbeddedServices:
    """Redis (AOF in `directory/redis`) plus a broker process on free loopback ports."""

    directory: Path
    run_id: str
    curve_keys: str | None = None
    redis: RedisServer | None = None
    broker: subprocess.Popen[bytes] | None = None
    endpoints: BrokerEndpoints = field(
        default_factory=lambda: BrokerEndpoints("127.0.0.1", free_port_block())
    )

    @property
    def redis_url(self) -> str:
        assert self.redis is not None, "services not started"
        return self.redis.url

    def env(self) -> dict[str, str]:
        """Environment that points a worker process at these services."""
        env = {
            "LLAMARL_REDIS_URL": self.redis_url,
            "LLAMARL_BROKER": str(self.endpoints),
            "LLAMARL_RUN_ID": self.run_id,
        }
        if self.curve_keys:
            env["LLAMARL__BROKER__CURVE_KEYS"] = self.curve_keys
        return env

    def start(self, timeout_s: float = 20.0) -> EmbeddedServices:
        self.redis = RedisServer(self.directory / "redis").start()
        try:
            self.start_broker(timeout_s)
        except BaseException:
            self.stop()  # no Redis left behind by a broker that would not start
            raise
        return self

    def dead(self) -> list[str]:
        """The services ("redis", "broker") whose process has exited."""
        procs = {"redis": self.redis.process if self.redis else None, "broker": self.broker}
        return [
            name for name, proc in procs.items() if proc is not None and proc.poll() is not None
        ]

    def restart(self, name: str) -> None:
        """Start a dead service again where it was: Redis on its port from its append-only
        file (nothing acknowledged is lost: every write is fsynced), the broker on its ports
        (clients reconnect and re-announce their credit)."""
        if name == "redis":
            assert self.redis is not None
            self.redis = RedisServer(self.directory / "redis", port=self.redis.port).start()
        else:
            self.start_broker()

    def start_broker(self, timeout_s: float = 20.0) -> None:
        log_path = self.directory / "broker.log"
        with open(log_path, "ab") as log_file:
            self.broker = supervise.start(
                [sys.executable, "-m", "brokers", "--log-format", "json"],
                env={**os.environ, **self.env()},
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        curve = load_curve(self.curve_keys)
        while True:
            if self.broker.poll() is not None:
                raise RuntimeError(f"broker exited {self.broker.returncode}; see {log_path}")
            try:
                query_broker_stats(self.endpoints, timeout_s=0.5, curve=curve)
                return
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise

    def stop_broker(self, timeout_s: float = 10.0) -> int | None:
        return None if self.broker is None else supervise.stop(self.broker, timeout_s)

    def stop(self) -> None:
        try:
            self.stop_broker()
        finally:
            if self.redis is not None:
                self.redis.stop()

    def __enter__(self) -> EmbeddedServices:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
