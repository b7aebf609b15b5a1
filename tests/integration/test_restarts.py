"""Infrastructure restarts during an async run: Redis (SIGKILL, restarted on its AOF) and the
broker (SIGKILL, restarted on the same ports). The run completes and the ledger balances."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from brokers.redis_server import RedisServer
from llamarl import supervise
from tests.integration.async_helpers import (
    check_finished_run,
    launch,
    run_redis_url,
    service_pids,
    wait_for_steps,
    write_config,
)

STEPS = 500
RUN_ID = "restarts"


def _restart_redis(launcher_pid: int, run_dir: Path) -> RedisServer:
    """SIGKILL the run's redis-server and start a new one on the same port and AOF directory."""
    port = int(run_redis_url(launcher_pid).rsplit(":", 1)[1].split("/")[0])
    redis_pid, _ = service_pids(launcher_pid, RUN_ID)
    os.kill(redis_pid, signal.SIGKILL)
    assert supervise.wait_gone([redis_pid], timeout_s=10) == []
    time.sleep(1.0)  # the outage: the scenario, not synchronisation
    return RedisServer(run_dir / "redis", port=port).start()


def _restart_broker(launcher_pid: int, run_dir: Path) -> subprocess.Popen[bytes]:
    """SIGKILL the run's broker and start it again with the same command and environment (read
    from /proc by its pid)."""
    _, pid = service_pids(launcher_pid, RUN_ID)
    proc_dir = Path(f"/proc/{pid}")
    argv = [a.decode() for a in (proc_dir / "cmdline").read_bytes().split(b"\0") if a]
    pairs = (proc_dir / "environ").read_bytes().split(b"\0")
    environ = dict(item.decode().split("=", 1) for item in pairs if b"=" in item)
    os.kill(pid, signal.SIGKILL)
    assert supervise.wait_gone([pid], timeout_s=10) == []
    time.sleep(1.0)  # the outage: the scenario, not synchronisation
    with open(run_dir / "broker2.log", "ab") as log:
        return supervise.start(argv, env=environ, stdout=log, stderr=subprocess.STDOUT)


def test_run_survives_redis_and_broker_restarts(tmp_path: Path) -> None:
    config = write_config(
        tmp_path, RUN_ID,
        trainer={"num_steps": STEPS}, staleness={"max_staleness": 1, "lease_s": 3.0},
        workers={"max_restarts": 0},
    )  # fmt: skip
    run_dir = tmp_path / RUN_ID
    proc = launch(config)
    redis: RedisServer | None = None
    broker: subprocess.Popen[bytes] | None = None
    try:
        wait_for_steps(run_dir, 50)
        redis = _restart_redis(proc.pid, run_dir)
        wait_for_steps(run_dir, 150)
        broker = _restart_broker(proc.pid, run_dir)
        out, err = proc.communicate(timeout=300)
    finally:
        if broker is not None:
            supervise.stop(broker)
        if redis is not None:
            redis.stop()
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    check_finished_run(summary, run_dir, STEPS * 4, k=1)
