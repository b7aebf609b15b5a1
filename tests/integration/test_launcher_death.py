"""SIGKILL of the `llamarl run` launcher: every process it started (redis-server, the broker,
every worker) exits within 5 s, and the weight files the killed trainer left in /dev/shm are
removed by the run's next start."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from llamarl.launch import supervise
from tests.integration.async_helpers import launch, wait_for_steps, write_config

pytestmark = pytest.mark.long  # a whole run of a minute or more: `make test-long`

SHM = Path("/dev/shm")


def test_children_die_with_the_launcher_and_the_next_start_cleans_shared_memory(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, "orphans", trainer={"num_steps": 100_000}, sync={"transport": "shm"})
    proc = launch(config)
    try:
        wait_for_steps(tmp_path / "orphans", 3, proc)
        started = supervise.descendants(proc.pid)
        assert len(started) >= 5, started  # redis, broker, trainer, two generators, reward
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert supervise.wait_gone(started, timeout_s=5) == [], "children outlived the launcher"
    finally:
        supervise.stop(proc)
    # Taken after the deaths: a running trainer removes its older versions itself.
    left_files = list(SHM.glob("llamarl-orphans-*"))
    assert left_files, "the killed trainer left its newest versions in /dev/shm"

    rerun = write_config(tmp_path, "orphans", trainer={"num_steps": 4}, sync={"transport": "shm"})
    again = launch(rerun)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-3000:]
    assert not any(path.exists() for path in left_files), "the next start left the orphans"
    assert not list(SHM.glob("llamarl-orphans-*")), "a clean exit leaves no weight file"
