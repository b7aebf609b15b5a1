"""Process supervision with real processes: grace then SIGKILL, whole trees, death with parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from llamarl.launch import supervise

# Prints its pid's children once they are all up, then waits for a signal.
TREE = """
import subprocess, sys, time
from llamarl.launch import supervise
kids = [supervise.start([sys.executable, "-c", {child!r}]) for _ in range(2)]
while sum(len(supervise.children(k.pid)) for k in kids) < 2:
    time.sleep(0.01)
print(" ".join(str(pid) for kid in kids for pid in [kid.pid, *supervise.children(kid.pid)]),
      flush=True)
time.sleep(600)
"""
SLEEPER = "import subprocess, sys, time; subprocess.Popen(['sleep', '600']); time.sleep(600)"
IGNORES_TERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"
)


def _python(code: str, **popen: object) -> subprocess.Popen[str]:
    return supervise.start([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, **popen)


def _read_pids(proc: subprocess.Popen[str]) -> list[int]:
    assert proc.stdout is not None
    return [int(pid) for pid in proc.stdout.readline().split()]


def test_stop_ends_a_cooperative_child_with_sigterm() -> None:
    proc = _python("import time; print('ready', flush=True); time.sleep(600)")
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    assert supervise.stop(proc, grace_s=30) == -signal.SIGTERM  # ended by SIGTERM, not the kill
    assert proc.returncode == -signal.SIGTERM and not supervise.alive(proc.pid)


def test_stop_sigkills_a_child_that_ignores_sigterm_after_the_grace() -> None:
    proc = _python(IGNORES_TERM)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    started = time.monotonic()
    assert supervise.stop(proc, grace_s=0.5) == -signal.SIGKILL
    assert time.monotonic() - started >= 0.5
    assert proc.returncode == -signal.SIGKILL  # reaped: Popen holds the status


def test_child_runs_in_its_own_session() -> None:
    proc = _python("import time; print('ready', flush=True); time.sleep(600)")
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        assert os.getsid(proc.pid) == proc.pid != os.getsid(0)
    finally:
        supervise.stop(proc, grace_s=5)


def test_kill_tree_kills_children_and_grandchildren() -> None:
    proc = _python(TREE.format(child=SLEEPER))
    try:
        pids = _read_pids(proc)  # two children, each with its sleep grandchild
        assert len(pids) == 4
        assert sorted(supervise.descendants(proc.pid)) == sorted(pids)
        killed = supervise.kill_tree(proc.pid)
        assert sorted(killed) == sorted([proc.pid, *pids])
        assert proc.wait(10) == -signal.SIGKILL
        assert supervise.wait_gone(pids, timeout_s=10) == []
    finally:
        supervise.stop(proc, grace_s=1)


def test_children_die_when_their_parent_is_sigkilled() -> None:
    # Grandchildren are started by `supervise.start` in the middle process, which is then
    # SIGKILLed alone: only the kernel's parent-death signal can end them.
    proc = _python(TREE.format(child=SLEEPER))
    try:
        pids = _read_pids(proc)
        middle = [pid for pid in pids if pid in supervise.children(proc.pid)]
        assert len(middle) == 2
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
        assert supervise.wait_gone(middle, timeout_s=10) == []
    finally:
        supervise.kill_tree(proc.pid)
        proc.wait(10)
        for pid in pids:  # the `sleep`s were started by plain Popen: no death signal
            if supervise.alive(pid):
                supervise.kill_tree(pid)


def test_without_the_death_signal_a_child_outlives_its_parent() -> None:
    # The control for the test above: the same tree, started without the death signal.
    code = (
        "import subprocess, sys; from llamarl.launch import supervise; "
        "kid = supervise.start(['sleep', '600'], die_with_parent=False); "
        "print(kid.pid, flush=True); sys.stdin.read()"
    )
    proc = _python(code, stdin=subprocess.PIPE, die_with_parent=False)
    (orphan,) = _read_pids(proc)
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert supervise.wait_gone([orphan], timeout_s=0.5) == [orphan]
    finally:
        supervise.kill_tree(orphan)
        assert supervise.wait_gone([orphan], timeout_s=10) == []


def test_children_of_a_missing_pid_is_empty() -> None:
    proc = supervise.start(["true"])
    proc.wait(10)
    assert supervise.children(proc.pid) == [] and not supervise.alive(proc.pid)
    assert supervise.kill_tree(proc.pid) == []
