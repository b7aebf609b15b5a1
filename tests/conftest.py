"""Shared fixtures: a real redis-server per test on a free port, and a real broker process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokers.redis_server import RedisServer
from llamarl.bus import query_broker_stats
from llamarl.curve import Curve
from llamarl.launch import supervise
from llamarl.net import BrokerEndpoints, free_port_block
from llamarl.store import RedisStore

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[RedisStore]:
    store = RedisStore(redis_server.url, "test", connect_deadline_s=5)
    yield store
    store.close()


def start_broker_process(
    endpoints: BrokerEndpoints, extra_env: dict[str, str] | None = None, curve: Curve | None = None
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "LLAMARL_BROKER": str(endpoints), "LLAMARL_RUN_ID": "test"}
    env.update(extra_env or {})
    proc = supervise.start(
        [sys.executable, "-m", "brokers", "--log-format", "json"],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 20
    while True:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "broker died"
        try:
            query_broker_stats(endpoints, timeout_s=0.5, curve=curve)
            return proc
        except TimeoutError:
            assert time.monotonic() < deadline, "broker did not come up"


@pytest.fixture
def broker() -> Iterator[BrokerEndpoints]:
    endpoints = BrokerEndpoints("127.0.0.1", free_port_block())
    proc = start_broker_process(endpoints)
    yield endpoints
    supervise.stop(proc)
