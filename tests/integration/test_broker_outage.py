"""A worker and a broker that goes away (cluster mode: nobody restarts the broker for it). The
worker keeps running while the broker is down, carries on with its work when the broker comes back
on the same ports, and exits with code 3 and one line naming the broker once it has been silent
for `broker.dead_after_s`."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from brokers.redis_server import RedisServer
from llamarl.launch import supervise
from tests.conftest import start_broker_process
from tests.integration.async_helpers import write_config
from tests.integration.worker_helpers import scored_round_trip, start_reward_worker

DEAD_AFTER_S = 4


def _wait_for_line(path: Path, text: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while text not in path.read_text():
        assert proc.poll() is None, f"the worker exited ({proc.returncode}) before: {text}"
        assert time.monotonic() < deadline, f"the worker never logged: {text}"
        time.sleep(0.1)


def test_a_worker_rides_out_a_broker_restart_and_gives_up_on_a_dead_broker(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    config = write_config(tmp_path, "test", broker={"dead_after_s": DEAD_AFTER_S})
    broker = start_broker_process()
    endpoints = broker.endpoints
    log_path = tmp_path / "reward.log"
    worker = start_reward_worker(config, redis_server.url, endpoints, log_path)
    try:
        scored_round_trip(endpoints, 1)
        supervise.stop(broker.process)
        _wait_for_line(log_path, "bus not answering", worker)
        broker = start_broker_process(port=endpoints.port)  # where the worker looks for it
        _wait_for_line(log_path, "bus answers again", worker)
        scored_round_trip(endpoints, 2)

        supervise.stop(broker.process)
        assert worker.wait(120) == 3  # gave up (after dead_after_s: the line below names it)
        last = log_path.read_text().strip().splitlines()[-1]
        assert last.startswith(f"reward r0: broker {endpoints} did not answer for "), last
        assert last.endswith(
            f"(broker.dead_after_s {DEAD_AFTER_S}); start it again, or check broker.host and broker.port"
        ), last
    finally:
        supervise.stop(worker)
        supervise.stop(broker.process)
