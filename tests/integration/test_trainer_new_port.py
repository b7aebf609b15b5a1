"""A trainer restarted on a new port mid-run, as `docker compose down` / `up` does: every
generator produces again soon after the new trainer publishes, also one that was asking the old
trainer's endpoint (still in the version record) when the new one came up.

Every role is started by hand with `llamarl worker` (Redis and the broker from the embedded
services), weights over gloo. The trainer and one generator are SIGKILLed; a plain TCP listener
takes the old weight server's port, so that the restarted generator's request to it provably
hangs there (it connects; nothing answers) before the new trainer starts. The other generator
runs through the restart. With `sync.timeout_s` far above the bound, a generator that waited out
its request instead of following the record fails the test.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

import pytest

from llamarl.store import RedisStore
from tests.integration.async_helpers import check_finished_run
from tests.integration.hand_cluster import HandCluster

pytestmark = pytest.mark.long  # a whole run of a minute or more: `make test-long`

STEPS = 40
HEARTBEAT_S = 0.5
SYNC_TIMEOUT_S = 120.0
BOUND_S = 20.0
"""How soon after the new trainer's first publish every generator must have produced: 40
heartbeats, a sixth of the sync timeout that a generator stuck on the old endpoint waits out."""
GENERATORS = ("generator-0", "generator-1")
START_S = 300
"""Patience for a process to start (imports under a loaded machine's CPU can take minutes)."""


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _produced(store: RedisStore, pids: dict[str, int], policy_version: int, groups_before: dict[str, float]) -> bool:
    """Whether each generator process has taken up `policy_version` (or newer) and published
    groups since `groups_before`."""
    beats = {w.worker_id: w.fields for w in store.workers() if w.alive}
    for worker_id, pid in pids.items():
        fields = beats.get(worker_id, {})
        if fields.get("pid") != str(pid) or int(fields.get("policy_version", -1)) < policy_version:
            return False
        if float(fields.get("groups", 0)) <= groups_before[worker_id]:
            return False
    return True


def test_generators_follow_a_trainer_restarted_on_a_new_port(tmp_path: Path) -> None:
    cluster = HandCluster(
        tmp_path,
        "newport",
        trainer={"num_steps": STEPS, "checkpoint_every": 5},
        staleness={"max_staleness": 1, "lease_s": 2.0},
        workers={"heartbeat_s": HEARTBEAT_S},
        sync={"transport": "gloo", "host": "127.0.0.1", "timeout_s": SYNC_TIMEOUT_S},
    )
    procs, store = cluster.procs, cluster.store
    listener = socket.socket()
    try:
        _wait_for(lambda: store.ledger()["trained"] >= 12, "training never started", START_S)
        cluster.kill("trainer")
        cluster.kill("generator-1")
        # Read once the trainer is gone: it may publish between a read before the kill and the kill.
        old = store.version_meta()
        # The old weight server's port, taken: the restarted generator's request hangs there.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", urlparse(old["endpoint"]).port or 0))
        listener.listen()
        listener.settimeout(START_S)
        cluster.start("generator-1")
        asking, _ = listener.accept()  # a generator asks the old trainer's endpoint
        asking.close()
        cluster.start("trainer")
        _wait_for(lambda: store.policy_version() > int(old["policy_version"]), "no new trainer version", START_S)
        published = store.version_meta()
        assert published["endpoint"] != old["endpoint"], "the new trainer is on a new port"
        groups = {w.worker_id: float(w.fields.get("groups", 0)) for w in store.workers() if w.alive}
        before = {wid: groups.get(wid, 0.0) if wid == "generator-0" else 0.0 for wid in GENERATORS}
        pids = {wid: procs[wid].pid for wid in GENERATORS}
        version = int(published["policy_version"])
        _wait_for(
            lambda: _produced(store, pids, version, before),
            f"a generator did not produce within {BOUND_S}s of version {version} at {published['endpoint']}",
            BOUND_S,
        )
        assert procs["trainer"].wait(300) == 0
        for worker_id, proc in procs.items():
            assert proc.wait(60) == 0, f"{worker_id} did not stop cleanly"
        check_finished_run({"ledger": store.ledger()}, cluster.run_dir, STEPS * 4, k=1)
    finally:
        listener.close()
        cluster.close()
