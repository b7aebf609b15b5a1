"""Redis credentials come from the URL; wrong or missing ones fail at once with one clear error
naming redis.url (no retry loop). What each command then prints, and its exit code (2), is
tests/integration/test_redis_answers.py's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from brokers.redis_server import RedisServer
from llamarl.errors import ConfigError
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


@pytest.mark.parametrize(
    ("credentials", "refusal"),
    [("", "asks for a password (NOAUTH)"), (":wrong@", "refused the password (WRONGPASS)")],
)
def test_bad_credentials_fail_at_once(locked_redis: RedisServer, credentials: str, refusal: str) -> None:
    store = RedisStore(f"redis://{credentials}127.0.0.1:{locked_redis.port}/0", "auth", 600)
    with capture_logs() as logs, pytest.raises(ConfigError) as refused:
        store.policy_version()
    shown = f"redis://{':***@' if credentials else ''}127.0.0.1:{locked_redis.port}/0"
    assert str(refused.value).startswith(f"redis.url {shown}: Redis {refusal}")
    assert [e for e in logs if e["event"] == "redis retry"] == [], "must not retry"
