"""Starting llamarl's roles on the hosts of a `netns.Cluster`, as a user starts them on machines:
Redis with a password and the broker with CURVE keys on one host, every other role with
`llamarl worker ROLE` given the head's addresses through the environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis
import yaml

from brokers.redis_server import find_redis_server
from llamarl.store import RedisStore
from tests.integration.async_helpers import worker_argv
from tests.multihost.netns import Cluster, Host

PASSWORD = "multihost-secret"
REDIS_PORT = 6379
BROKER_PORT = 5555


def write_config(directory: Path, run_id: str, tree: dict[str, Any]) -> Path:
    path = directory / f"{run_id}.yaml"
    path.write_text(yaml.safe_dump({**tree, "run_id": run_id, "run_dir": str(directory / run_id)}))
    return path


def curve_keys(directory: Path) -> Path:
    """`llamarl keys generate DIR` into a directory every host sees."""
    keys = directory / "keys"
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "keys", "generate", str(keys)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return keys


class Head:
    """Redis (password) and the broker on `host`; `env` is what a worker on any host needs."""

    def __init__(self, cluster: Cluster, host: str, run_dir: Path, config: Path) -> None:
        self.cluster = cluster
        self.host = cluster[host]
        self.run_dir = run_dir
        self.config = config
        self.run_id = str(yaml.safe_load(config.read_text())["run_id"])
        self.redis_url = f"redis://:{PASSWORD}@{self.host.address}:{REDIS_PORT}/0"
        self.env = {
            **os.environ,
            "LLAMARL_REDIS_URL": self.redis_url,
            "LLAMARL_BROKER": f"{self.host.address}:{BROKER_PORT}",
        }

    def start(self) -> Head:
        logs = self.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        data = self.run_dir / "redis"
        data.mkdir(exist_ok=True)
        self.host.start(
            [
                find_redis_server(),
                "--bind",
                self.host.address,
                "--port",
                str(REDIS_PORT),
                "--requirepass",
                PASSWORD,
                "--dir",
                str(data),
                "--appendonly",
                "yes",
                "--save",
                "",
            ],
            log=logs / "redis.log",
        )
        self.wait_redis()
        worker(
            self.host,
            "broker",
            "broker",
            self.config,
            {**self.env, "LLAMARL_BROKER": f"{self.host.address}:{BROKER_PORT}"},
            logs,
        )
        return self

    def ledger(self) -> dict[str, int]:
        store = RedisStore(self.redis_url, self.run_id, connect_deadline_s=5)
        try:
            return store.ledger()
        finally:
            store.close()

    def hosts_of_workers(self) -> dict[str, str]:
        """worker id -> the host name each live worker registered from."""
        store = RedisStore(self.redis_url, self.run_id, connect_deadline_s=5)
        try:
            return {w.worker_id: str(w.fields["host"]) for w in store.workers() if w.alive}
        finally:
            store.close()

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url, socket_timeout=5)

    def wait_redis(self, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.client().ping()
                return
            except redis.exceptions.ConnectionError:
                assert time.monotonic() < deadline, "redis on the head host never answered"
                time.sleep(0.1)


def worker(
    host: Host, role: str, worker_id: str, config: Path, env: dict[str, str], logs: Path
) -> subprocess.Popen[bytes]:
    """`llamarl worker ROLE` on `host`, its output in logs/WORKER_ID.log."""
    return host.start(
        worker_argv(role, worker_id, config),
        env=env,
        log=logs / f"{worker_id}.log",
    )


def log_tail(logs: Path, worker_id: str, chars: int = 3000) -> str:
    path = logs / f"{worker_id}.log"
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def timers(run_dir: Path, worker_id: str) -> dict[str, Any]:
    return json.loads((run_dir / "timers" / f"{worker_id}.json").read_text())
