"""Helpers for tests that start one worker by hand against a broker of their own."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from llamarl.bus import BusClient
from llamarl.launch import supervise
from llamarl.net import BrokerEndpoints
from llamarl.topics import ROLLOUTS, SCORED
from tests.factories import rollout_group


def start_reward_worker(
    config: Path, redis_url: str, endpoints: BrokerEndpoints, log_path: Path, *options: str
) -> subprocess.Popen[bytes]:
    """`llamarl worker reward` as worker r0, its stderr (JSON logs) in `log_path`."""
    env = {**os.environ, "LLAMARL_REDIS_URL": redis_url, "LLAMARL_BROKER": str(endpoints)}
    with open(log_path, "wb") as log_file:
        return supervise.start(
            [
                sys.executable,
                "-m",
                "workers.cli",
                "worker",
                "reward",
                "--config",
                str(config),
                "--worker-id",
                "r0",
                "--log-format",
                "json",
                *options,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
        )


def scored_round_trip(endpoints: BrokerEndpoints, ticket_id: int) -> None:
    """Push a rollout group and wait for a reward worker's score of it."""
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
