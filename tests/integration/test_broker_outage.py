"""A worker and a broker that goes away (cluster mode: nobody restarts the broker for it). The
worker keeps running while the broker is down, carries on with its work when the broker comes back
on the same ports, and exits with code 3 and one line naming the broker once it has been silent
for `broker.dead_after_s`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from brokers.redis_server import RedisServer
from llamarl import supervise
from llamarl.bus import BusClient
from llamarl.net import BrokerEndpoints, free_port_block
from llamarl.topics import ROLLOUTS, SCORED
from tests.conftest import start_broker_process
from tests.factories import rollout_group
from tests.integration.async_helpers import write_config

DEAD_AFTER_S = 4


def _wait_for_line(path: Path, text: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while text not in path.read_text():
        assert proc.poll() is None, f"the worker exited ({proc.returncode}) before: {text}"
        assert time.monotonic() < deadline, f"the worker never logged: {text}"
        time.sleep(0.1)


def _scored_round_trip(endpoints: BrokerEndpoints, ticket_id: int) -> None:
    """Push a rollout group and wait for the reward worker's score of it."""
    client = BusClient(endpoints, run_id="test", sender="test")
    try:
        scored = client.consume(SCORED, credit=1)
        client.push(ROLLOUTS, rollout_group(ticket_id), 0, timeout_s=10)
        deadline = time.monotonic() + 60
        while (envelope := scored.recv(100)) is None:
            assert time.monotonic() < deadline, "the reward worker never scored the group"
        assert envelope.payload.group.ticket_id == ticket_id
    finally:
        client.close()


def test_a_worker_rides_out_a_broker_restart_and_gives_up_on_a_dead_broker(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    endpoints = BrokerEndpoints("127.0.0.1", free_port_block())
    config = write_config(tmp_path, "test", broker={"dead_after_s": DEAD_AFTER_S})
    env = {**os.environ, "LLAMARL_REDIS_URL": redis_server.url, "LLAMARL_BROKER": str(endpoints)}
    broker = start_broker_process(endpoints)
    log_path = tmp_path / "reward.log"
    with open(log_path, "wb") as log_file:
        worker = supervise.start(
            [sys.executable, "-m", "workers.cli", "worker", "reward", "--config", str(config),
             "--worker-id", "r0", "--log-format", "json"],
            env=env, stdout=subprocess.DEVNULL, stderr=log_file,
        )  # fmt: skip
    try:
        _scored_round_trip(endpoints, 1)
        supervise.stop(broker)
        _wait_for_line(log_path, "bus not answering", worker)
        broker = start_broker_process(endpoints)
        _wait_for_line(log_path, "bus answers again", worker)
        _scored_round_trip(endpoints, 2)

        supervise.stop(broker)
        silent = time.monotonic()
        assert worker.wait(DEAD_AFTER_S + 30) == 3
        assert time.monotonic() - silent < DEAD_AFTER_S + 10
        last = log_path.read_text().strip().splitlines()[-1]
        assert last.startswith(f"reward r0: broker {endpoints} did not answer for "), last
        assert last.endswith(
            f"(broker.dead_after_s {DEAD_AFTER_S}); start it again, or check broker.host and "
            "broker.port"
        ), last
    finally:
        supervise.stop(worker)
        supervise.stop(broker)
