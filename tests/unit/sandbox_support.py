"""What the sandbox tests share: the limits they run under, what a run must leave unchanged in
the worker, and what it must not leave on the host (processes of uid 65534, directories,
cgroups). The fixtures that use them are in tests/unit/conftest.py."""

from __future__ import annotations

import fcntl
import glob
import os
import resource
import sys
import tempfile

from llamarl.tools.sandbox import LOCK_FILE, SandboxLimits

LIMITS = SandboxLimits(wall_s=3, cpu_s=1)
MARGIN_S = 2.0  # for the kill and the namespace's teardown, on a busy machine
ROOT_ON_LINUX = sys.platform == "linux" and os.geteuid() == 0
CGROUP_DIRS = (
    "/sys/fs/cgroup/llamarl-run-*",
    "/sys/fs/cgroup/*/llamarl-run-*",
    "/sys/fs/cgroup/*/*/*/llamarl-run-*",
)


def worker_state() -> dict[str, object]:
    """What a sandbox run must not change in the process that starts it."""
    kinds = ("mnt", "net", "pid", "ipc", "uts")
    namespaces = {name: os.readlink(f"/proc/self/ns/{name}") for name in kinds}
    limits = {
        which: resource.getrlimit(which) for which in (resource.RLIMIT_AS, resource.RLIMIT_CPU, resource.RLIMIT_NPROC)
    }
    cgroups = open("/proc/self/cgroup").read()
    return {
        "ns": namespaces,
        "limits": limits,
        "uid": os.getuid(),
        "cwd": os.getcwd(),
        "cgroups": cgroups,
    }


def sandbox_processes() -> set[int]:
    """Processes on the host running as the sandbox's uid 65534."""
    found = set()
    for status in glob.glob("/proc/[0-9]*/status"):
        try:
            uid_line = next(line for line in open(status) if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue  # exited while we looked
        if uid_line.split()[1] == "65534":
            found.add(int(status.split("/")[2]))
    return found


def sandbox_leftovers() -> tuple[set[int], set[str]]:
    """Processes of uid 65534, and sandbox directories and cgroups, while no run is in progress
    on the host (runs take turns on the lock file, and each reaps and removes its own before it
    lets go)."""
    with open(LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        dirs = set(glob.glob(os.path.join(tempfile.gettempdir(), "llamarl-sandbox-*")))
        for pattern in CGROUP_DIRS:
            dirs |= set(glob.glob(pattern))
        return sandbox_processes(), dirs
