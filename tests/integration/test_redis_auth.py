"""Redis credentials come from the URL; wrong or missing ones fail at once with one clear error
(no retry loop), and a worker exits 3 naming the problem."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from brokers.redis_server import RedisServer
from llamarl.net import free_port_block
from llamarl.store import RedisStore


@pytest.fixture
def locked_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis", password="s3cret").start()
    yield server
    server.stop()


def test_password_in_the_url(locked_redis: RedisServer) -> None:
    store = RedisStore(f"redis://:s3cret@127.0.0.1:{locked_redis.port}/0", "auth")
    store.publish_version(0, {"checksum": "a"})
    assert store.policy_version() == 0
    store.close()


@pytest.mark.parametrize("credentials", ["", ":wrong@"])
def test_bad_credentials_fail_at_once(locked_redis: RedisServer, credentials: str) -> None:
    store = RedisStore(f"redis://{credentials}127.0.0.1:{locked_redis.port}/0", "auth", 600)
    with (
        capture_logs() as logs,
        pytest.raises(ConnectionError, match="redis refused the credentials"),
    ):
        store.policy_version()
    assert [e for e in logs if e["event"] == "redis retry"] == [], "must not retry"


def test_worker_with_a_wrong_password_exits_3(locked_redis: RedisServer) -> None:
    env = {
        **os.environ,
        "LLAMARL_REDIS_URL": f"redis://:wrong@127.0.0.1:{locked_redis.port}/0",
        "LLAMARL_BROKER": f"127.0.0.1:{free_port_block()}",
    }
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "worker", "reward", "--worker-id", "r0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 3
    assert "reward r0: redis refused the credentials in redis.url" in done.stderr
