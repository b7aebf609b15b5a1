"""A private Redis and broker for one run on one machine, started and stopped together.

Used by `llamarl run` when the config names no Redis URL, and by the integration tests. The broker
runs as its own process (`python -m brokers`), exactly as in a cluster. No port is chosen in one
process and bound in another without a way back: the broker binds its own block and reports it,
and Redis, which cannot, is started again on a new port when another process took its first.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from brokers.broker_process import start_broker
from brokers.redis_server import RedisServer
from llamarl.config import RunConfig
from llamarl.curve import load_curve
from llamarl.launch import supervise
from llamarl.net import BrokerEndpoints


@dataclass
class EmbeddedServices:
    """Redis (AOF in `directory/redis`) plus a broker process on loopback ports, the broker's on
    `broker_port` when the user set one."""

    directory: Path
    run_id: str
    curve_keys: str | None = None
    broker_port: int | None = None
    redis: RedisServer | None = None
    broker: subprocess.Popen[bytes] | None = None
    endpoints: BrokerEndpoints | None = None

    @classmethod
    def for_run(cls, config: RunConfig, run_dir: Path) -> EmbeddedServices:
        """The services of `config`'s run, not started, keeping its `broker.port` if set."""
        return cls(run_dir, config.run_id, config.broker.curve_keys, config.broker.port)

    @property
    def redis_url(self) -> str:
        assert self.redis is not None, "services not started"
        return self.redis.url

    def env(self) -> dict[str, str]:
        """Environment that points a worker process at these services."""
        assert self.endpoints is not None, "services not started"
        return self._run_env() | {"LLAMARL_BROKER": str(self.endpoints)}

    def _run_env(self) -> dict[str, str]:
        """The run's Redis, id and CURVE keys: what the broker and every worker share."""
        env = {"LLAMARL_REDIS_URL": self.redis_url, "LLAMARL_RUN_ID": self.run_id}
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
        return [name for name, proc in procs.items() if proc is not None and proc.poll() is not None]

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
        """The broker where it was (a restart), else on `broker_port` or ports it binds itself."""
        assert self.redis is not None, "Redis first: the broker counts rejections there"
        port = self.endpoints.port if self.endpoints is not None else self.broker_port
        started = start_broker(
            {**os.environ, **self._run_env()},
            self.directory / "broker.log",
            port=port,
            curve=load_curve(self.curve_keys),
            timeout_s=timeout_s,
        )
        self.broker, self.endpoints = started.process, started.endpoints

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
