"""Each Store implementation behind one shape, so a contract test body runs on all of them.

Time is the one thing the backends cannot share: RedisStore's leases and TTLs run on redis-server's
clock, MemoryStore's on a fake clock the test owns. `Backend.until` hides the difference: it
retries a probe until it returns something truthy, letting real time pass (Redis) or moving the
fake clock forward a step per miss (memory), and fails at a deadline either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from brokers.redis_server import RedisServer
from llamarl.store import MemoryStore, RedisStore, Store
from tests.factories import FakeClock

T = TypeVar("T")
KINDS = ["redis", "memory"]
DEADLINE_S = 15.0  # real seconds for Redis, clock seconds for memory
POLL_S = 0.01


@dataclass
class Backend:
    kind: str
    store: Store
    pass_time: Callable[[], None]
    close: Callable[[], None]

    def until(self, probe: Callable[[], T], what: str) -> T:
        """The first truthy result of `probe`, letting time pass between tries."""
        for _ in range(int(DEADLINE_S / POLL_S)):
            got = probe()
            if got:
                return got
            self.pass_time()
        raise AssertionError(f"{self.kind}: no {what} within {DEADLINE_S:.0f}s")


def open_backend(kind: str, redis_server: Callable[[], RedisServer]) -> Backend:
    """A fresh, empty store of `kind`; `redis_server` starts a server only when one is needed."""
    if kind == "redis":
        redis_store = RedisStore(redis_server().url, "contract", connect_deadline_s=5)
        return Backend(kind, redis_store, lambda: time.sleep(POLL_S), redis_store.close)
    clock = FakeClock()
    memory_store = MemoryStore(clock=clock)
    return Backend(kind, memory_store, lambda: clock.advance(POLL_S), memory_store.close)
