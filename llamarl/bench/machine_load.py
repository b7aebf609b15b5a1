"""How busy the machine was while this process measured something: the cores other processes
used on average, from the kernel's CPU counters (/proc/stat) less this process's own CPU time
and its descendants' (those reaped, from `os.times`, and those still alive, from /proc).

A profile (`llamarl bench profile`) measured beside other work times every role slower than it
runs alone, and `workers.layout: auto` would choose from those figures for every later run of the
config; so a profile records this figure and is not trusted above BUSY_CORES.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from llamarl.launch import supervise

BUSY_CORES = 0.25
"""Other processes' average use, in cores, above which a measurement is not trusted: a quarter
of a core steals a tenth or more of a 2-core machine's time from what is measured, well beyond
the spread of the profile's own repeats."""
_TICKS = os.sysconf("SC_CLK_TCK")


def machine_cpu_s() -> float:
    """Seconds of CPU every process has used since boot (/proc/stat's first line, less idle and
    iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / _TICKS


def own_cpu_s() -> float:
    """This process's CPU seconds and its descendants': the reaped ones' from `os.times`, the
    live ones' from /proc/PID/stat (their own and their reaped children's)."""
    times = os.times()
    total = times.user + times.system + times.children_user + times.children_system
    for pid in supervise.descendants(os.getpid()):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile: counted once reaped, or lost to no one
        total += sum(int(v) for v in stat[11:15]) / _TICKS  # utime, stime, cutime, cstime
    return total


def others_now(seconds: float) -> float:
    """The cores other processes use, on average over the next `seconds` (this one sleeps)."""
    with OtherLoad() as load:
        time.sleep(seconds)
    return load.cores


class OtherLoad:
    """`with OtherLoad() as load: ...`; then `load.cores` is the cores other processes used on
    average while the block ran."""

    def __init__(self) -> None:
        self.cores = 0.0

    def __enter__(self) -> OtherLoad:
        self._wall = time.monotonic()
        self._machine = machine_cpu_s()
        self._own = own_cpu_s()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = max(time.monotonic() - self._wall, 1e-9)
        others = (machine_cpu_s() - self._machine) - (own_cpu_s() - self._own)
        self.cores = round(max(others, 0.0) / wall, 3)
