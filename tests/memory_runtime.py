"""A role's runtime on an in-memory store and hub, as the lock-step program builds it: the unit
tests' way to run a real role without Redis or ZeroMQ."""

from __future__ import annotations

import time

from llamarl.bus import MemoryHub
from llamarl.config import RunConfig
from llamarl.limits import Clock
from llamarl.roles import build
from llamarl.roles.runtime import RoleRuntime
from llamarl.store import Store


def memory_runtime(
    role: str, config: RunConfig, worker_id: str, store: Store, hub: MemoryHub, clock: Clock = time.monotonic
) -> RoleRuntime:
    """`worker_id`'s runtime for `role`: its bus and reconnections are `hub`'s clients."""
    return RoleRuntime(
        role,
        config,
        worker_id,
        store,
        hub.client(worker_id),
        build.rejections_of(role, config, store),
        lambda: hub.client(worker_id),
        clock,
    )
