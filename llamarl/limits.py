"""Guards for input that crosses a process boundary: per-peer rate limits and rejection counting.

`RateLimiter` is a token bucket per peer (the sender's address, or its CURVE public key), checked
before a frame is decoded. `Rejections` counts every refused frame by reason, logs the first of
each reason and then at most one line per reason per interval (with the count since), and adds
the counts to Redis in batches (`flush`), so a flood of garbage costs neither a log line nor a
Redis round trip per frame.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

import structlog

log = structlog.get_logger(__name__)
RejectSink = Callable[[str, int], None]
RejectHook = Callable[[str, str], None]
"""What a receiver calls with (reason, detail) for each refused input: `Rejections.record`."""
Clock = Callable[[], float]
"""Seconds from an arbitrary origin, never going back (`time.monotonic`; tests inject one)."""
MAX_PEERS = 10_000


class RateLimiter:
    """At most `rate` frames a second per peer, with bursts up to `burst`; 0 means no limit."""

    def __init__(self, rate: float, burst: float, *, clock: Clock = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self._buckets: dict[bytes, tuple[float, float]] = {}

    def allow(self, peer: bytes) -> bool:
        if self.rate <= 0:
            return True
        now = self.clock()
        tokens, last = self._buckets.get(peer, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if len(self._buckets) >= MAX_PEERS and peer not in self._buckets:
            self._buckets.clear()  # bounded memory against address spraying
        if tokens < 1:
            self._buckets[peer] = (tokens, now)
            return False
        self._buckets[peer] = (tokens - 1, now)
        return True


class Rejections:
    """Counts refused frames of one source (`broker`, `trainer`, ...) by reason; thread-safe
    (the trainer's weight server records from its own thread)."""

    def __init__(
        self,
        source: str,
        sink: RejectSink | None = None,
        *,
        log_interval_s: float = 60.0,
        flush_interval_s: float = 1.0,
        clock: Clock = time.monotonic,
    ) -> None:
        self.source = source
        self.sink = sink
        self.log_interval_s = log_interval_s
        self.flush_interval_s = flush_interval_s
        self.clock = clock
        self.total: Counter[str] = Counter()
        self._pending: Counter[str] = Counter()
        self._unlogged: Counter[str] = Counter()
        self._last_log: dict[str, float] = {}
        self._last_flush = clock()
        self._lock = threading.Lock()

    def record(self, reason: str, detail: str = "") -> None:
        with self._lock:
            self._record(reason, detail)
        self.flush()

    def _record(self, reason: str, detail: str) -> None:
        self.total[reason] += 1
        self._pending[reason] += 1
        self._unlogged[reason] += 1
        now = self.clock()
        last = self._last_log.get(reason)
        if last is None or now - last >= self.log_interval_s:
            log.warning(
                "input rejected",
                source=self.source,
                reason=reason,
                count=self._unlogged[reason],
                detail=detail[:200],
            )
            self._last_log[reason] = now
            self._unlogged[reason] = 0

    def flush(self, force: bool = False) -> None:
        """Add the counts not yet written to the sink (Redis `rejected` hash); unless `force`,
        at most once per `flush_interval_s`. Counts stay pending if the sink fails."""
        with self._lock:
            now = self.clock()
            if not force and now - self._last_flush < self.flush_interval_s:
                return
            self._last_flush = now
            if self.sink is None:
                self._pending.clear()
                return
            for reason in list(self._pending):
                self.sink(reason, self._pending[reason])
                del self._pending[reason]
