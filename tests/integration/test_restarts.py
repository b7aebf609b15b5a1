"""Infrastructure deaths during an async run: the run's own Redis and broker are SIGKILLed, one
after the other, and the launcher restarts each (Redis from its append-only file, the broker on
the same ports) under the workers' restart budget. No worker restarts, the run completes and the
ledger balances."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import redis

from llamarl.launch import supervise
from tests.integration.async_helpers import (
    check_finished_run,
    launch,
    metrics_records,
    service_pids,
    wait_for_steps,
    write_config,
)

pytestmark = pytest.mark.long  # a whole run of a minute or more: `make test-long`

STEPS = 200
RUN_ID = "restarts"


def _kill_and_wait_for_replacement(launcher_pid: int, service: int) -> None:
    """SIGKILL the run's redis-server (service 0) or broker (1); return once the launcher has
    started a new one (a different pid in that place)."""
    old = service_pids(launcher_pid, RUN_ID)[service]
    os.kill(old, signal.SIGKILL)
    assert supervise.wait_gone([old], timeout_s=10) == []
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "the launcher did not restart the service"
        try:
            if service_pids(launcher_pid, RUN_ID)[service] != old:
                return
        except (redis.RedisError, OSError, ValueError):
            pass  # Redis not back yet, or the broker between its death and its replacement
        time.sleep(0.2)


def test_run_survives_redis_and_broker_deaths(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        RUN_ID,
        trainer={"num_steps": STEPS},
        staleness={"max_staleness": 1, "lease_s": 3.0},
        workers={"max_restarts": 1},
    )
    run_dir = tmp_path / RUN_ID
    proc = launch(config)
    try:
        wait_for_steps(run_dir, 30)
        _kill_and_wait_for_replacement(proc.pid, 0)
        after_redis = len(metrics_records(run_dir))
        wait_for_steps(run_dir, after_redis + 30)
        _kill_and_wait_for_replacement(proc.pid, 1)
        out, err = proc.communicate(timeout=300)
    finally:
        supervise.stop(proc)
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["restarts"] == {"redis": 1, "broker": 1}, err[-3000:]
    check_finished_run(summary, run_dir, STEPS * 4, k=1)
