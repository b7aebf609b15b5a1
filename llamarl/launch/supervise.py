"""Child processes, started and stopped so none outlives its owner: the one process-supervision
helper of the launcher and the tests.

`start` gives a child its own session (a terminal's Ctrl-C reaches the owner, which stops its
children in order) and, on Linux, asks the kernel to SIGKILL it when the thread that started it
dies, so a SIGKILLed owner leaves no orphan. `stop` is SIGTERM, a grace period, then SIGKILL of the
child and everything below it, always reaped. `kill_tree` finds descendants by pid through
`/proc/<pid>/task/*/children`, never by name or command line.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1
# Loaded in the parent: the child only calls into it between fork and exec.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def llamarl_command(*args: str) -> list[str]:
    """The installed `llamarl` command (beside this interpreter) with `args`, as a user runs it."""
    return [str(Path(sys.executable).parent / "llamarl"), *args]


def _die_with(parent_pid: int) -> Callable[[], None]:
    def arm() -> None:
        assert _LIBC is not None
        if _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            os._exit(127)
        # The parent may have died between fork and prctl; nothing would signal us then.
        if os.getppid() != parent_pid:
            os._exit(127)

    return arm


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; elsewhere nothing):
    for processes started by another tool (torchrun's ranks), so that killing the tool the
    launcher started leaves none of them behind."""
    if _LIBC is None:
        return
    parent = os.getppid()
    _die_with(parent)()


def start(args: Sequence[str], *, die_with_parent: bool = True, **popen: Any) -> subprocess.Popen[Any]:
    """`subprocess.Popen(args, **popen)` in a new session. With `die_with_parent` (Linux) the
    kernel SIGKILLs the child when the *thread* that called `start` exits, so call it from a
    thread that lives as long as the child should (the main thread, normally)."""
    preexec = _die_with(os.getpid()) if die_with_parent and _LIBC is not None else None
    return subprocess.Popen(args, start_new_session=True, preexec_fn=preexec, **popen)


def stop(proc: subprocess.Popen[Any], grace_s: float = 10.0) -> int:
    """SIGTERM `proc`, wait up to `grace_s`, then SIGKILL it and its descendants; the exit code
    (negative: the signal), once reaped."""
    if proc.poll() is not None:
        return proc.returncode
    proc.terminate()
    try:
        return proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        return proc.wait()


def children(pid: int) -> list[int]:
    """Direct children of `pid` (every thread's), [] when it is gone."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue  # the thread or the process ended meanwhile
    return found


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, parents before their children."""
    found: list[int] = []
    queue = children(pid)
    while queue:
        child = queue.pop(0)
        found.append(child)
        queue += children(child)
    return found


def alive(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie (exited, not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def kill_tree(pid: int) -> list[int]:
    """SIGKILL `pid` and every process below it; the pids signalled. Each is stopped (SIGSTOP)
    as it is found, so none forks a new child between the walk and the kill. Processes that are
    not the caller's children are reaped by their parent or by init, not here."""
    frozen: list[int] = []
    queue = [pid]
    while queue:
        current = queue.pop(0)
        try:
            os.kill(current, signal.SIGSTOP)
        except ProcessLookupError:
            continue
        frozen.append(current)
        queue += children(current)
    for current in frozen:
        try:
            os.kill(current, signal.SIGKILL)
        except ProcessLookupError:
            pass  # exited between the walk and the kill
    return frozen


def wait_gone(pids: Sequence[int], timeout_s: float) -> list[int]:
    """Wait until none of `pids` is alive; those still alive after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (left := [pid for pid in pids if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.01)
    return left
