"""One cgroup per sandboxed run: memory (memfds and tmpfs pages included), process count and CPU
bounded for the run as a whole, not per process.

`host_cgroups()` finds, once, where this process may make cgroups: cgroup v2 when its controllers
`memory`, `pids` and `cpu` can be given to a child of this process's cgroup, else the cgroup v1
hierarchies of `memory`, `pids`, `cpu` and `cpuacct` (hosts that still mount them, as this
project's CI machine does); neither is a `SandboxError` naming what to enable. `new_run` makes the
run's cgroup with its limits; the sandboxed child joins it (writes 0 to each `join_paths` file)
before it execs, so everything it starts is counted. The parent polls `cpu_seconds` and
`oom_kills` while the run goes, and `remove` kills what is left and deletes the cgroup.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from llamarl.tools.sandbox.limits import SandboxError, SandboxLimits

CONTROLLERS = ("memory", "pids", "cpu")
V1_CONTROLLERS = (*CONTROLLERS, "cpuacct")
CPU_PERIOD_US = 100_000
"""cpu.max's period: a run may use one core's worth of CPU time in each period."""
REMOVE_WAIT_S = 5.0
STEP = "a cgroup per call"


class RunCgroup(Protocol):
    """The cgroup of one run."""

    @property
    def join_paths(self) -> tuple[bytes, ...]:
        """The `cgroup.procs` files a process writes 0 to, to join (one per v1 hierarchy)."""
        ...

    def cpu_seconds(self) -> float:
        """CPU time every process of the run has used so far."""
        ...

    def oom_kills(self) -> int:
        """Processes the kernel killed for the run's memory limit so far."""
        ...

    def remove(self) -> None:
        """Kill every process left in the cgroup and delete it."""
        ...


class HostCgroups(Protocol):
    def new_run(self, limits: SandboxLimits) -> RunCgroup: ...


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _field(path: Path, name: str) -> int:
    """The value of `name` in a flat keyed file (`memory.events`, `cpu.stat`)."""
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return int(value)
    return 0


def _remove_dirs(directories: list[Path], procs_of: list[Path]) -> None:
    """SIGKILL what each cgroup still holds, then rmdir them (a dying process leaves its cgroup
    a moment after the signal, so rmdir is retried for a while)."""
    deadline = time.monotonic() + REMOVE_WAIT_S
    while True:
        for procs in procs_of:
            with contextlib.suppress(FileNotFoundError):
                for pid in procs.read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
        try:
            for directory in directories:
                with contextlib.suppress(FileNotFoundError):
                    directory.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@dataclass
class _V2Run:
    directory: Path

    @property
    def join_paths(self) -> tuple[bytes, ...]:
        return (os.fsencode(self.directory / "cgroup.procs"),)

    def cpu_seconds(self) -> float:
        return _field(self.directory / "cpu.stat", "usage_usec") / 1e6

    def oom_kills(self) -> int:
        return _field(self.directory / "memory.events", "oom_kill")

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            _write(self.directory / "cgroup.kill", "1")
        _remove_dirs([self.directory], [self.directory / "cgroup.procs"])


@dataclass(frozen=True)
class _V2:
    parent: Path

    def new_run(self, limits: SandboxLimits) -> RunCgroup:
        run = _V2Run(self.parent / f"llamarl-run-{uuid.uuid4().hex[:12]}")
        run.directory.mkdir()
        try:
            memory = str(limits.memory_mb << 20)
            _write(run.directory / "memory.max", memory)
            _write(run.directory / "memory.swap.max", "0")
            _write(run.directory / "memory.oom.group", "1")
            _write(run.directory / "pids.max", str(limits.num_processes))
            _write(run.directory / "cpu.max", f"{CPU_PERIOD_US} {CPU_PERIOD_US}")
        except BaseException:
            run.remove()
            raise
        return run


@dataclass
class _V1Run:
    directories: dict[str, Path]
    """Controller -> the run's directory in that controller's hierarchy."""

    @property
    def join_paths(self) -> tuple[bytes, ...]:
        unique = dict.fromkeys(self.directories.values())
        return tuple(os.fsencode(directory / "cgroup.procs") for directory in unique)

    def cpu_seconds(self) -> float:
        return int((self.directories["cpuacct"] / "cpuacct.usage").read_text()) / 1e9

    def oom_kills(self) -> int:
        return _field(self.directories["memory"] / "memory.oom_control", "oom_kill")

    def remove(self) -> None:
        unique = list(dict.fromkeys(self.directories.values()))
        _remove_dirs(unique, [directory / "cgroup.procs" for directory in unique])


@dataclass(frozen=True)
class _V1:
    parents: dict[str, Path]

    def new_run(self, limits: SandboxLimits) -> RunCgroup:
        name = f"llamarl-run-{uuid.uuid4().hex[:12]}"
        run = _V1Run({c: parent / name for c, parent in self.parents.items()})
        try:
            for directory in dict.fromkeys(run.directories.values()):
                directory.mkdir()
            memory, directories = str(limits.memory_mb << 20), run.directories
            _write(directories["memory"] / "memory.limit_in_bytes", memory)
            swap = directories["memory"] / "memory.memsw.limit_in_bytes"
            if swap.exists():  # with swap accounting, no swap beyond the same figure
                _write(swap, memory)
            _write(directories["pids"] / "pids.max", str(limits.num_processes))
            _write(directories["cpu"] / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(directories["cpu"] / "cpu.cfs_quota_us", str(CPU_PERIOD_US))
        except BaseException:
            run.remove()
            raise
        return run


@dataclass(frozen=True)
class _Mount:
    point: Path
    root: str
    """The part of the hierarchy mounted there ("/" unless a container mounted a subtree)."""
    fstype: str
    options: frozenset[str]

    def directory(self, own: str) -> Path:
        """The directory of the cgroup at `own` (a path in the hierarchy) under this mount."""
        return self.point / os.path.relpath(own, self.root)


def _mounts() -> list[_Mount]:
    """Each cgroup mount this process sees."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        fstype, _, options = tail.split(" ", 2)
        if fstype in ("cgroup", "cgroup2"):
            root, point = fields.split()[3:5]
            found.append(_Mount(Path(point), root, fstype, frozenset(options.split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """Controller (or "" for cgroup v2) -> this process's cgroup path in its hierarchy."""
    paths = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _v2(mounts: list[_Mount], own: dict[str, str]) -> _V2 | None:
    """Cgroup v2 where this process's cgroup can hand memory, pids and cpu to its children."""
    for mount in mounts:
        if mount.fstype != "cgroup2" or "" not in own:
            continue
        parent = mount.directory(own[""])
        try:
            available = set((parent / "cgroup.controllers").read_text().split())
            if not set(CONTROLLERS) <= available:
                continue
            enabled = set((parent / "cgroup.subtree_control").read_text().split())
            missing = [c for c in CONTROLLERS if c not in enabled]
            if missing:  # refused (EBUSY) where this cgroup holds processes and is not the root
                _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))
            return _V2(parent)
        except OSError:
            continue
    return None


def _v1(mounts: list[_Mount], own: dict[str, str]) -> _V1 | None:
    parents = {}
    for controller in V1_CONTROLLERS:
        mount = next((m for m in mounts if m.fstype == "cgroup" and controller in m.options), None)
        if mount is None or controller not in own:
            return None
        parent = mount.directory(own[controller])
        if not os.access(parent, os.W_OK):
            return None
        parents[controller] = parent
    return _V1(parents)


def host_cgroups() -> HostCgroups:
    """Where this host lets the sandbox make one cgroup per run; SandboxError where it does not."""
    mounts, own = _mounts(), _own_paths()
    found = _v2(mounts, own) or _v1(mounts, own)
    if found is None:
        raise SandboxError(
            STEP,
            "no writable cgroup v2 with the memory, pids and cpu controllers for this process's "
            "children (mount cgroup2 with them enabled, or delegate them: systemd Delegate=yes, "
            "docker --cgroupns=private), nor cgroup v1 hierarchies of memory, pids, cpu and "
            "cpuacct",
        )
    return found
