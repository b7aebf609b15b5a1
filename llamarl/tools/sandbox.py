"""Runs a Python source string in a separate, isolated process under limits (Linux only, as root).

The forked child, before it execs a small wrapper interpreter in a new session, enters new
network, mount and pid namespaces (no network, not even loopback), bind-mounts read-only only
what the interpreter needs (`sys.base_prefix`, /usr, /lib, /lib64, /bin) and a fresh work
directory read-write at /work into a private root, `chroot`s there, sets the resource limits and
drops to uid/gid 65534 without groups or new privileges. The wrapper forks the pid namespace's
init, which runs the code (`/work/main.py`) and reaps what it leaves; when the init dies the
kernel kills every process of the namespace, so neither a fork bomb nor `setsid` outlives a run.
The parent reads stdout and stderr up to the output limit and at the wall-clock deadline, or on
too much output, ends the wrapper's process group, then removes the directory. Not protected
against: kernel exploits, side channels, many small files filling the disk (only each file's
size is limited). RLIMIT_NPROC counts every process of uid 65534 on the host, so runs take turns
host-wide (a lock file), and other programs running as uid 65534 use up the same budget.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import os
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

NOBODY = 65534
NAMESPACES = 0x00020000 | 0x20000000 | 0x40000000  # CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT = 1, 2, 4, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
REMOUNT = MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV
PR_SET_NO_NEW_PRIVS = 38
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/bin")
PYTHON = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
LOCK_FILE = Path(tempfile.gettempdir()) / "llamarl-sandbox.lock"
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/work", "TMPDIR": "/work", "LANG": "C.UTF-8"}
# The wrapper (outside the new pid namespace) forks its init, which runs main.py as its child
# in a process group of its own and reports that child's wait status through a pipe.
WRAPPER = """
import os, resource, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
done_r, done_w = os.pipe()
init = os.fork()
if init == 0:
    code = os.fork()
    if code == 0:
        os.setpgid(0, 0)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        os.execv(sys.executable, [sys.executable, "-I", "-S", "-B", sys.argv[1]])
    while (reaped := os.wait3(0))[0] != code:
        pass
    _, status, usage = reaped
    if os.WIFSIGNALED(status) and usage.ru_utime + usage.ru_stime >= resource.getrlimit(resource.RLIMIT_CPU)[0]:
        status = signal.SIGXCPU  # the CPU limit's SIGXCPU, or its SIGKILL a second later
    os.write(done_w, str(status).encode())
    os._exit(0)
signal.signal(signal.SIGTERM, lambda *_: os.kill(init, signal.SIGKILL))
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
os.waitpid(init, 0)
os.close(done_w)
status = int(os.read(done_r, 32) or signal.SIGKILL)
if os.WIFSIGNALED(status):
    if (sig := os.WTERMSIG(status)) != signal.SIGKILL:
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
os._exit(os.waitstatus_to_exitcode(status) & 255)
"""


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use; more ends it (see `SandboxResult.killed`)."""

    cpu_s: int = 2
    """CPU seconds (RLIMIT_CPU: SIGXCPU, then SIGKILL a second later)."""
    memory_mb: int = 512
    """Address space per process (RLIMIT_AS); the interpreter needs about 12 MiB to start."""
    output_bytes: int = 64 * 1024
    """stdout and stderr together; the run is killed as soon as more arrives."""
    wall_s: float = 5.0
    """Wall-clock seconds from start until the process group is killed."""
    num_processes: int = 8
    """Processes of uid 65534 on the host (RLIMIT_NPROC); the wrapper and the pid namespace's init
    count, so the code may have two fewer, itself included."""
    file_bytes: int = 1024 * 1024
    """Largest file the code may write (RLIMIT_FSIZE)."""


@dataclass(frozen=True)
class SandboxResult:
    """What happened to one run: its output (at most `output_bytes`) and how it ended."""

    stdout: str
    stderr: str
    exit_code: int | None
    """The code's exit status, -N when signal N ended it (as `Popen.returncode`); None when the
    sandbox ended it at the wall-clock or output limit."""
    killed: str | None
    """"wall_clock", "output", "cpu" or "memory" when a limit ended the run, else None."""
    seconds: float
    pgid: int
    """The process group the run was started in (no process of it is left when this returns)."""


class SandboxError(Exception):
    """A step of the isolation could not be applied; `step` names it, `reason` says why."""

    def __init__(self, step: str, reason: str) -> None:
        super().__init__(f"{step}: {reason}")
        self.step = step
        self.reason = reason


@dataclass(frozen=True)
class _Plan:
    root: bytes
    work: bytes
    read_only: tuple[bytes, ...]
    limits: SandboxLimits


def run_sandboxed(code: str, limits: SandboxLimits) -> SandboxResult:
    """Run `code` as `/work/main.py` in the sandbox; raises SandboxError if it cannot be built."""
    if sys.platform != "linux" or os.geteuid() != 0:
        raise SandboxError(
            "the sandbox", f"needs root on Linux, not uid {os.geteuid()} on {sys.platform}"
        )
    _libc()
    try:
        with open(LOCK_FILE, "a") as lock:  # one run at a time on the host: see the module notes
            fcntl.flock(lock, fcntl.LOCK_EX)
            base = Path(tempfile.mkdtemp(prefix="llamarl-sandbox-"))
            try:
                return _run(_prepare(base, code, limits))
            finally:
                _remove(base)
    except OSError as exc:
        raise SandboxError("a private work directory", str(exc)) from None


def _prepare(base: Path, code: str, limits: SandboxLimits) -> _Plan:
    """Mount points under base/root for what the interpreter needs, and base/work with main.py."""
    root, work = base / "root", base / "work"
    work.mkdir(mode=0o700)
    (work / "main.py").write_bytes(code.encode(errors="replace"))  # a lone surrogate: "?"
    for path in (work, work / "main.py"):
        os.chown(path, NOBODY, NOBODY)
    read_only: list[bytes] = []
    for name in (*SYSTEM_DIRS, sys.base_prefix):
        target = root / name.lstrip("/")
        real = Path(os.path.realpath(name))
        if os.path.islink(name):
            _make_dirs(root, target.parent)
            target.symlink_to(os.readlink(name))
        elif real.is_dir() and not any(real.is_relative_to(os.fsdecode(p)) for p in read_only):
            _make_dirs(root, target)
            read_only.append(os.fsencode(name))
    _make_dirs(root, root / "work")
    return _Plan(os.fsencode(root), os.fsencode(work), tuple(read_only), limits)


def _make_dirs(root: Path, path: Path) -> None:
    """Create root and the directories down to path, each mode 755 (readable by nobody)."""
    for directory in (*reversed(path.parents), path):
        if directory.is_relative_to(root):
            directory.mkdir(exist_ok=True)
            directory.chmod(0o755)


def _run(plan: _Plan) -> SandboxResult:
    start = time.monotonic()
    proc = _spawn(plan)
    with proc:
        try:
            stdout, stderr, killed = _collect(proc, plan.limits, start + plan.limits.wall_s)
        finally:
            _stop(proc)
    err, code = stderr.decode(errors="replace"), proc.returncode
    last_line = err.rstrip().rpartition("\n")[2]
    if killed is None and code == -signal.SIGXCPU:  # how the wrapper reports the CPU limit
        killed = "cpu"
    elif killed is None and code == 1 and last_line.startswith("MemoryError"):
        killed = "memory"
    exit_code = None if killed in ("wall_clock", "output") else code
    seconds = time.monotonic() - start
    return SandboxResult(stdout.decode(errors="replace"), err, exit_code, killed, seconds, proc.pid)


def _spawn(plan: _Plan) -> subprocess.Popen[bytes]:
    """Start the wrapper; a failing isolation step writes its name to a pipe, read back here."""
    read_fd, write_fd = os.pipe()
    with open(read_fd, "rb") as report:
        try:
            with open(write_fd, "wb"):  # the parent's copy closes once the child is started
                return subprocess.Popen(
                    [str(PYTHON), "-I", "-S", "-B", "-c", WRAPPER, "/work/main.py"],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=ENV,
                    start_new_session=True,
                    preexec_fn=functools.partial(_enter, plan, write_fd),
                )
        except (OSError, subprocess.SubprocessError) as exc:
            step, _, reason = report.read().decode(errors="replace").partition("\t")
            raise SandboxError(step or "starting the interpreter", reason or str(exc)) from None


def _enter(plan: _Plan, report_fd: int) -> None:
    """In the child before exec: each isolation step in turn; the first that fails is reported."""
    libc = _libc()
    steps = {
        "unshare (network, mount and pid namespaces)": lambda: _check(libc.unshare(NAMESPACES)),
        "read-only bind mounts": lambda: _mount_root(libc, plan),
        "chroot": lambda: _enter_root(plan.root),
        "resource limits": lambda: _set_limits(plan.limits),
        "uid/gid 65534": lambda: _become_nobody(libc),
    }
    for step, action in steps.items():
        try:
            action()
        except BaseException as exc:
            os.write(report_fd, f"{step}\t{exc}".replace("\n", " ").encode())
            raise


@functools.cache
def _libc() -> ctypes.CDLL:
    """libc with unshare, mount and prctl looked up, in the parent (dlsym is unsafe after fork)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for name in ("unshare", "mount", "prctl"):
        getattr(libc, name)
    return libc


def _check(result: int) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def _mount_root(libc: ctypes.CDLL, plan: _Plan) -> None:
    """Mounts seen only in the child's namespace: the root and its binds, all but /work read-only."""

    def mount(source: bytes | None, target: bytes, flags: int) -> None:
        _check(libc.mount(source, target, None, flags, None))

    mount(None, b"/", MS_REC | MS_PRIVATE)  # nothing below propagates to the host
    mount(plan.root, plan.root, MS_BIND)  # a mount of its own, to be made read-only
    for path in plan.read_only:
        mount(path, plan.root + path, MS_BIND)
    mount(plan.work, plan.root + b"/work", MS_BIND)
    mount(None, plan.root + b"/work", REMOUNT)
    for path in (b"", *plan.read_only):
        mount(None, plan.root + path, REMOUNT | MS_RDONLY)


def _enter_root(root: bytes) -> None:
    os.chroot(root)
    os.chdir("/work")


def _set_limits(limits: SandboxLimits) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb << 20,) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes,) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.num_processes,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _become_nobody(libc: ctypes.CDLL) -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))


def _collect(
    proc: subprocess.Popen[bytes], limits: SandboxLimits, deadline: float
) -> tuple[bytes, bytes, str | None]:
    """Read both pipes until the process exits, the deadline, or more than the output limit."""
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout.fileno(), proc.stderr.fileno()
    kept, total = {out: bytearray(), err: bytearray()}, 0

    def outcome(killed: str | None) -> tuple[bytes, bytes, str | None]:
        return bytes(kept[out]), bytes(kept[err]), killed

    with selectors.DefaultSelector() as selector:
        for fd in kept:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            if (left := deadline - time.monotonic()) <= 0:
                return outcome("wall_clock")
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                kept[key.fd] += chunk[: max(limits.output_bytes - total, 0)]
                total += len(chunk)
                if total > limits.output_bytes:
                    return outcome("output")
    try:
        proc.wait(max(deadline - time.monotonic(), 0))
    except subprocess.TimeoutExpired:
        return outcome("wall_clock")
    return outcome(None)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End the run's process group: SIGTERM (the wrapper kills the pid namespace), then SIGKILL.

    The group is signalled only while its leader is not reaped, so its id cannot be reused."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, None)):
        if proc.poll() is not None:
            return
        os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)


def _remove(base: Path) -> None:
    """Delete the run's directories, unless something is still mounted under them."""
    with open("/proc/self/mountinfo") as mounts:
        if any(line.split()[4].startswith(f"{base}/") for line in mounts):
            return
    shutil.rmtree(base, ignore_errors=True)
