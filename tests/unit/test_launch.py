"""The launcher's restart budget (`workers.max_restarts` crashes of one worker within any
`workers.restart_window_s`, not over the whole run) and its stop (each child's grace before
SIGKILL)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llamarl.config import parse_config
from llamarl.launch import local, supervise
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


CHILD = """
import signal, sys, time
def on_term(*_):
    if sys.argv[1] == "ignores":
        return
    time.sleep(float(sys.argv[1]))  # its stop work: a checkpoint written
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def test_the_trainer_is_given_the_time_to_write_its_stop_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop SIGKILLs a generator that ignores SIGTERM after STOP_TIMEOUT_S, and waits for a
    trainer whose stop checkpoint takes longer than that (but less than `sync.timeout_s`)."""
    monkeypatch.setattr(local, "STOP_TIMEOUT_S", 0.3)
    config = parse_config({"sync": {"timeout_s": 1.0}})
    procs = {
        "trainer": supervise.start([sys.executable, "-c", CHILD, "1.0"], stdout=subprocess.PIPE),
        "generator-0": supervise.start([sys.executable, "-c", CHILD, "ignores"], stdout=subprocess.PIPE),
    }
    try:
        for proc in procs.values():
            assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        children = [local.Child(w.split("-")[0], w, local.LocalProcess(p)) for w, p in procs.items()]
        codes = local.stop_all(children, config)
    finally:
        for proc in procs.values():
            supervise.stop(proc, 0.1)
    assert codes == {"trainer": 0, "generator-0": -9}
    assert local.stop_grace_s("trainer", config) == 0.3 + 2 * 1.0
