"""Rate limits and rejection counting: token buckets per peer, one log line per reason per
interval, counts batched to the sink and never lost when it fails."""

from __future__ import annotations

import time

import pytest
from structlog.testing import capture_logs

from llamarl.limits import RateLimiter, Rejections


def test_rate_limiter_allows_a_burst_then_the_rate_per_peer() -> None:
    limiter = RateLimiter(rate=100, burst=20)
    assert sum(limiter.allow(b"a") for _ in range(50)) == 20
    assert limiter.allow(b"b"), "another peer has its own bucket"
    time.sleep(0.1)  # refills about 10 tokens
    refilled = sum(limiter.allow(b"a") for _ in range(50))
    assert 5 <= refilled <= 15
    assert all(RateLimiter(rate=0, burst=1).allow(b"a") for _ in range(1000)), "0 means off"


def test_rejections_log_once_per_reason_per_interval_and_batch_counts() -> None:
    written: list[tuple[str, int]] = []
    rejections = Rejections(
        "reward", lambda reason, n: written.append((reason, n)), log_interval_s=0.2,
        flush_interval_s=3600,
    )  # fmt: skip
    with capture_logs() as logs:
        for _ in range(1000):
            rejections.record("garbage", "bad bytes")
        rejections.record("oversize")
        time.sleep(0.25)
        rejections.record("garbage")
    lines = [(e["reason"], e["count"]) for e in logs if e["event"] == "input rejected"]
    assert lines == [("garbage", 1), ("oversize", 1), ("garbage", 1000)]
    assert written == [], "nothing written before the flush interval"
    rejections.flush(force=True)
    assert sorted(written) == [("garbage", 1001), ("oversize", 1)]
    assert rejections.total == {"garbage": 1001, "oversize": 1}


def test_counts_stay_pending_when_the_sink_fails() -> None:
    calls: list[int] = []

    def flaky(reason: str, n: int) -> None:
        calls.append(n)
        if len(calls) == 1:
            raise ConnectionError("redis down")

    rejections = Rejections("broker", flaky, flush_interval_s=3600)
    for _ in range(3):
        rejections.record("garbage")
    with pytest.raises(ConnectionError):
        rejections.flush(force=True)
    rejections.flush(force=True)
    assert calls == [3, 3]
