"""The launcher's restart budget: `workers.max_restarts` crashes of one worker within any
`workers.restart_window_s`, not over the whole run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llamarl.config import parse_config
from llamarl.launch.local import Supervisor


def test_restarts_are_budgeted_per_window_not_per_run() -> None:
    config = parse_config({"workers": {"max_restarts": 2, "restart_window_s": 10}})
    now = [0.0]
    started: list[subprocess.Popen[bytes]] = []

    def spawn(role: str, worker_id: str) -> subprocess.Popen[bytes]:
        started.append(subprocess.Popen([sys.executable, "-c", "pass"]))
        return started[-1]

    supervisor = Supervisor(config, spawn, {}, clock=lambda: now[0])
    supervisor.start("generator", "generator-0")
    for moment in (0.0, 5.0, 30.0, 35.0):  # two crashes, a quiet spell, two more: all restarted
        now[0] = moment
        supervisor.restart(0, 1)
    assert supervisor.restarts == {"generator-0": 4}
    now[0] = 39.0  # a third crash within 10 s of the last two
    with pytest.raises(RuntimeError, match="generator generator-0 exited with code 1 after 2 restarts in 10 s"):
        supervisor.restart(0, 1)
    assert len(started) == 5
    for proc in started:
        proc.wait(10)
