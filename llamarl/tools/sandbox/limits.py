"""What one sandboxed run may use (`SandboxLimits`), what happened to it (`SandboxResult`), and the
error for an isolation step that cannot be applied on this host (`SandboxError`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use; more ends it (see `SandboxResult.killed`)."""

    cpu_s: int = 2
    """CPU seconds of the whole run, every process of it together (its cgroup's usage; each
    process also has RLIMIT_CPU: SIGXCPU, then SIGKILL a second later)."""
    memory_mb: int = 512
    """Memory of the whole run (its cgroup: every process, memfds and /work's files included);
    each process's address space is bounded by the same figure (RLIMIT_AS)."""
    output_bytes: int = 64 * 1024
    """stdout and stderr together; the run is killed as soon as more arrives."""
    wall_s: float = 5.0
    """Wall-clock seconds from start until the process group is killed."""
    num_processes: int = 8
    """Processes of the run (its cgroup's pids.max, and RLIMIT_NPROC for uid 65534 host-wide);
    the wrapper and the pid namespace's init count, so the code may have two fewer, itself
    included."""
    file_bytes: int = 1024 * 1024
    """Largest file the code may write (RLIMIT_FSIZE)."""
    work_bytes: int = 16 * 1024 * 1024
    """Bytes of /work, a tmpfs of the run's own mount namespace (ENOSPC past it)."""
    work_files: int = 4096
    """Files and directories /work may hold (the tmpfs's inodes; ENOSPC past it)."""


@dataclass(frozen=True)
class SandboxResult:
    """What happened to one run: its output (at most `output_bytes`) and how it ended."""

    stdout: str
    stderr: str
    exit_code: int | None
    """The code's exit status, -N when signal N ended it (as `Popen.returncode`); None when the
    sandbox ended it at a limit of the whole run (wall clock, output, the cgroup's CPU or
    memory)."""
    killed: str | None
    """"wall_clock", "output", "cpu" or "memory" when a limit ended the run, else None."""
    seconds: float
    cpu_s: float
    """CPU seconds every process of the run used together (the kernel's count for its cgroup)."""
    pgid: int
    """The process group the run was started in (no process of it is left when this returns)."""


class SandboxError(Exception):
    """A step of the isolation could not be applied; `step` names it, `reason` says why."""

    def __init__(self, step: str, reason: str) -> None:
        super().__init__(f"{step}: {reason}")
        self.step = step
        self.reason = reason
