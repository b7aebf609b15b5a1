"""Chaos in a hand-started cluster: every role started with `llamarl worker`, as on separate
machines (Redis and the broker from the embedded services). Generators and the reward worker are
SIGKILLed at random moments and restarted by hand with the same command; the run finishes, the
ledger balances, nothing is trained twice and staleness stays within k."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

from brokers.embedded import EmbeddedServices
from llamarl.store import RedisStore
from tests.integration.async_helpers import check_finished_run, worker_argv, write_config

STEPS = 250


def _worker(role: str, worker_id: str, config: Path, env: dict[str, str], logs: Path):
    with open(logs / f"{worker_id}.log", "ab") as log:
        return subprocess.Popen(
            worker_argv(role, worker_id, config),
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def test_workers_killed_and_restarted_by_hand(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        "cluster",
        trainer={"num_steps": STEPS},
        staleness={"max_staleness": 1, "lease_s": 2.0},
    )
    run_dir = tmp_path / "cluster"
    logs = run_dir / "logs"
    logs.mkdir(parents=True)
    services = EmbeddedServices(run_dir, "cluster").start()
    env = services.env()
    roles = {"trainer": "trainer", "generator-0": "generator", "generator-1": "generator", "reward-0": "reward"}
    procs = {wid: _worker(role, wid, config, env, logs) for wid, role in roles.items()}
    store = RedisStore(services.redis_url, "cluster")
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
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait(30)
            kills += 1
            procs[victim] = _worker(roles[victim], victim, config, env, logs)  # by hand
        assert procs["trainer"].wait(600) == 0
        assert kills >= 3
        for worker_id, proc in procs.items():
            assert proc.wait(60) == 0, f"{worker_id} did not stop cleanly"
        summary = {"ledger": store.ledger()}
        check_finished_run(summary, run_dir, STEPS * 4, k=1)
        assert summary["ledger"]["reissued"] > 0, "killed workers' tickets were redone"
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
        store.close()
        services.stop()
