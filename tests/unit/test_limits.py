"""Rate limits and rejection counting: token buckets per peer, one log line per reason per
interval, counts batched to the sink and never lost when it fails."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from llamarl.limits import RateLimiter, Rejections
from tests.factories import FakeClock


def test_rate_limiter_allows_a_burst_then_the_rate_per_peer() -> None:
    clock = FakeClock()
    limiter = RateLimiter(rate=100, burst=20, clock=clock)
    assert sum(limiter.allow(b"a") for _ in range(50)) == 20
    assert limiter.allow(b"b"), "another peer has its own bucket"
    clock.advance(0.1)  # refills 10 tokens
    assert sum(limiter.allow(b"a") for _ in range(50)) == 10
    clock.advance(0.005)  # half a token: still refused
    assert not limiter.allow(b"a")
    clock.advance(3600)  # refills to the burst, never above it
    assert sum(limiter.allow(b"a") for _ in range(50)) == 20
    assert all(RateLimiter(rate=0, burst=1).allow(b"a") for _ in range(1000)), "0 means off"


def test_rejections_log_once_per_reason_per_interval_and_batch_counts() -> None:
    written: list[tuple[str, int]] = []
    clock = FakeClock()
    rejections = Rejections(
        "reward",
        lambda reason, n: written.append((reason, n)),
        log_interval_s=60,
        flush_interval_s=3600,
        clock=clock,
    )
    with capture_logs() as logs:
        for _ in range(1000):
            rejections.record("garbage", "bad bytes")
        rejections.record("oversize")
        clock.advance(59.9)
        rejections.record("garbage")  # within the interval: counted, not logged
        clock.advance(0.1)
        rejections.record("garbage")
    lines = [(e["reason"], e["count"]) for e in logs if e["event"] == "input rejected"]
    assert lines == [("garbage", 1), ("oversize", 1), ("garbage", 1001)]
    assert written == [], "nothing written before the flush interval"
    clock.advance(3600 - 60)
    rejections.record("oversize")  # the flush interval has passed: this record flushes
    assert sorted(written) == [("garbage", 1002), ("oversize", 2)]
    assert rejections.total == {"garbage": 1002, "oversize": 2}
    rejections.flush(force=True)
    assert len(written) == 2, "nothing pending after a flush"


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
