"""The `llamarl` command as a user runs it: help, worker broker lifecycle."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from llamarl.bus import query_broker_stats
from llamarl.net import BrokerEndpoints, free_port_block
from tests.integration.commands import LLAMARL


def test_help_lists_the_roles() -> None:
    done = subprocess.run([*LLAMARL, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    for role in ("broker", "generator", "reward", "trainer"):
        assert role in done.stdout


def test_worker_broker_serves_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    """Without a port it binds a free block itself and writes the base port where it was told."""
    port_file = tmp_path / "broker.port"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMARL_BROKER")}
    proc = subprocess.Popen(
        [*LLAMARL, "worker", "broker", "--log-format", "json", "--port-file", str(port_file)],
        env=env,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        endpoints = BrokerEndpoints("127.0.0.1", int(port_file.read_text()))
        while True:
            try:
                assert "queued.rollouts" in query_broker_stats(endpoints, timeout_s=0.5)
                break
            except TimeoutError:
                assert proc.poll() is None and time.monotonic() < deadline
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        assert b"broker stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_worker_broker_without_port_is_a_config_error() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMARL")}
    done = subprocess.run([*LLAMARL, "worker", "broker"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "config error: broker.port" in done.stderr


def test_worker_without_redis_exits_3_after_the_deadline() -> None:
    env = {
        **os.environ,
        "LLAMARL_REDIS_URL": f"redis://127.0.0.1:{free_port_block(size=1)}/0",
        "LLAMARL_BROKER": f"127.0.0.1:{free_port_block()}",
        "LLAMARL__REDIS__CONNECT_DEADLINE_S": "1",
    }
    done = subprocess.run(
        [*LLAMARL, "worker", "reward", "--worker-id", "r0", "--log-format", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3
    assert "reward r0: redis unreachable for 1s during run status" in done.stderr


def test_monitor_shows_progress_workers_and_rejections(redis_server, store) -> None:
    store.publish_version(0, {})
    store.claim_tickets("generator-0", 1, lease_s=60, max_staleness=1, prompts_per_step=4)
    store.register_worker("generator-0", "generator", ttl_s=60)
    store.register_worker("reward-0", "reward", ttl_s=0.05)  # its heartbeat lapses at once
    store.register_worker("reward-1", "reward", ttl_s=0.05)
    store.record_stop("reward-1")  # it finished cleanly: done, not dead
    store.register_worker("learner-a", "trainer", ttl_s=60)  # a trainer under any id
    store.heartbeat("learner-a", 60, status="running", step=7, policy_version=7)
    store.heartbeat("generator-0", 60, status="running", policy_version=0)
    store.count_rejected("broker", "garbage", 7)
    deadline = time.monotonic() + 10
    while any(w.alive for w in store.workers() if w.worker_id == "reward-0"):
        assert time.monotonic() < deadline, "reward-0's registration never lapsed"
        time.sleep(0.01)
    env = {**os.environ, "LLAMARL_REDIS_URL": redis_server.url, "LLAMARL_RUN_ID": "test"}
    done = subprocess.run([*LLAMARL, "monitor", "--once"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "step 7/" in lines[0] and "version 7" in lines[0], "the trainer found by its role"
    assert "tickets issued 1 trained 0 stale 0 open 1" in lines[0]
    generator = next(line for line in lines if "generator-0" in line).split()
    assert generator[1:4] == ["generator", "running", "alive"]
    assert next(line for line in lines if "reward-0" in line).split()[1:4] == ["?", "-", "dead"]
    assert next(line for line in lines if "reward-1" in line).split()[1:4] == ["reward", "stopped", "done"]
    assert "broker.garbage 7" in lines[-1]


def test_monitor_of_a_run_id_with_no_keys_says_so(redis_server, store) -> None:
    store.set_run_status("running")  # run "test" exists; run "tset" does not
    env = {**os.environ, "LLAMARL_REDIS_URL": redis_server.url, "LLAMARL_RUN_ID": "tset"}
    done = subprocess.run([*LLAMARL, "monitor", "--once"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 1
    assert done.stderr.startswith(f"monitor: run tset has no keys in the Redis at {redis_server.url}; check run_id"), (
        done.stderr
    )


def test_monitor_without_redis_exits_3(tmp_path) -> None:
    env = {
        **os.environ,
        "LLAMARL_REDIS_URL": f"redis://127.0.0.1:{free_port_block()}/0",
        "LLAMARL__REDIS__CONNECT_DEADLINE_S": "1",
    }
    done = subprocess.run([*LLAMARL, "monitor", "--once"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 3
    assert done.stderr.startswith("monitor: redis unreachable for 1s")
