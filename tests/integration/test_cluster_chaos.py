"""Chaos in a hand-started cluster: every role started with `llamarl worker`, as on separate
machines (Redis and the broker from the embedded services). Generators and the reward worker are
SIGKILLed at random moments and restarted by hand with the same command; the run finishes, the
ledger balances, nothing is trained twice and staleness stays within k."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from tests.integration.async_helpers import check_finished_run
from tests.integration.hand_cluster import HandCluster

pytestmark = pytest.mark.long  # a whole run of a minute or more: `make test-long`

STEPS = 250


def test_workers_killed_and_restarted_by_hand(tmp_path: Path) -> None:
    cluster = HandCluster(
        tmp_path, "cluster", trainer={"num_steps": STEPS}, staleness={"max_staleness": 1, "lease_s": 2.0}
    )
    procs, store = cluster.procs, cluster.store
    try:
        deadline = time.monotonic() + 120
        while store.ledger()["trained"] < 40:
            assert time.monotonic() < deadline, "training never started"
            time.sleep(0.2)
        rng = random.Random(11)
        kills = 0
        for victim in ["generator-0", "reward-0", "generator-1", "reward-0"]:
            time.sleep(rng.uniform(0.3, 2.0))
            if procs["trainer"].poll() is not None:
                break
            cluster.kill(victim)
            kills += 1
            cluster.start(victim)  # by hand
        assert procs["trainer"].wait(600) == 0
        assert kills >= 3
        for worker_id, proc in procs.items():
            assert proc.wait(60) == 0, f"{worker_id} did not stop cleanly"
        summary = {"ledger": store.ledger()}
        check_finished_run(summary, cluster.run_dir, STEPS * 4, k=1)
        assert summary["ledger"]["reissued"] > 0, "killed workers' tickets were redone"
    finally:
        cluster.close()
