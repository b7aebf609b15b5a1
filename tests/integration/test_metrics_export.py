"""A worker started with `--metrics-port` serves its counters to a Prometheus scrape, and they
move with its work."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from brokers.redis_server import RedisServer
from llamarl.launch import supervise
from llamarl.net import free_port_block
from tests.conftest import start_broker_process
from tests.integration.async_helpers import write_config
from tests.integration.worker_helpers import scored_round_trip, start_reward_worker


def _scrape(port: int) -> dict[str, dict[str, float]]:
    """metric name -> {worker_id: value}, or {} while the endpoint is not up yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
            text = answer.read().decode()
    except OSError:
        return {}
    return {
        family.name: {sample.labels["worker_id"]: sample.value for sample in family.samples}
        for family in text_string_to_metric_families(text)
        if family.name.startswith("llamarl_")
    }


def test_a_worker_serves_its_counters_to_prometheus(tmp_path: Path, redis_server: RedisServer) -> None:
    port = free_port_block(size=1)
    config = write_config(tmp_path, "test")
    broker = start_broker_process()
    endpoints = broker.endpoints
    worker = start_reward_worker(
        config, redis_server.url, endpoints, tmp_path / "reward.log", "--metrics-port", str(port)
    )
    try:
        deadline = time.monotonic() + 60
        while "llamarl_busy_s" not in (metrics := _scrape(port)):
            assert worker.poll() is None, (tmp_path / "reward.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "no metrics served"
            time.sleep(0.1)
        assert metrics["llamarl_busy_s"] == {"r0": 0.0}
        assert "llamarl_scored" not in metrics
        scored_round_trip(endpoints, 1)
        scored_round_trip(endpoints, 2)
        metrics = _scrape(port)
        assert metrics["llamarl_scored"] == {"r0": 2.0}
        assert metrics["llamarl_busy_s"]["r0"] > 0
    finally:
        supervise.stop(worker)
        supervise.stop(broker.process)
