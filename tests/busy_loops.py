"""Busy loops of other processes, for tests of what a busy machine changes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def busy_loops(count: int) -> Iterator[list[int]]:
    """`count` busy loops that are not this process's descendants (their shell exits at once and
    they are reparented), killed by their pids on the way out."""
    loop = f'{sys.executable} -c "while True: pass" >/dev/null 2>&1 &'
    started = subprocess.run(
        ["sh", "-c", f"for i in $(seq {count}); do {loop} echo $!; done"], capture_output=True, text=True, check=True
    )
    pids = [int(pid) for pid in started.stdout.split()]
    try:
        yield pids
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
