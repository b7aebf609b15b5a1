"""One sandboxed run, from the parent's side: its cgroup and private root are made, the child is
started through the isolation steps (`llamarl.tools.sandbox.isolation`), its output is read up to
the limits while the cgroup's CPU time and OOM kills are watched, and everything is ended and
removed before the result is returned.

The child execs a small wrapper interpreter, outside the new pid namespace, that forks the
namespace's init, which runs the code (`/work/main.py`) and reaps what it leaves; when the init
dies the kernel kills every process of the namespace, so neither a fork bomb nor `setsid` outlives
a run, and the namespace's IPC objects and /work go with it. RLIMIT_NPROC counts every process of
uid 65534 on the host, so runs take turns host-wide (a lock file).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from llamarl.tools.sandbox.cgroups import STEP as CGROUP_STEP
from llamarl.tools.sandbox.cgroups import HostCgroups, RunCgroup, host_cgroups
from llamarl.tools.sandbox.isolation import Plan, enter, libc
from llamarl.tools.sandbox.limits import SandboxError, SandboxLimits, SandboxResult
from llamarl.tools.sandbox.seccomp import run_filter, syscall_number

SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/bin")
PYTHON = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
LOCK_FILE = Path(tempfile.gettempdir()) / "llamarl-sandbox.lock"
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/work", "TMPDIR": "/work", "LANG": "C.UTF-8"}
POLL_S = 0.05
"""How often the parent reads the run's CPU time and OOM kills while it waits."""
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


def run_sandboxed(code: str, limits: SandboxLimits) -> SandboxResult:
    """Run `code` as `/work/main.py` in the sandbox; raises SandboxError if it cannot be built."""
    if sys.platform != "linux" or os.geteuid() != 0:
        raise SandboxError("the sandbox", f"needs root on Linux, not uid {os.geteuid()} on {sys.platform}")
    libc()
    cgroups = _host_cgroups()
    run_filter()  # built here: the child only loads it
    with open(LOCK_FILE, "a") as lock:  # one run at a time on the host: see the module notes
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            cgroup = cgroups.new_run(limits)
        except OSError as exc:
            raise SandboxError(CGROUP_STEP, str(exc)) from None
        try:
            base = Path(tempfile.mkdtemp(prefix="llamarl-sandbox-"))
            try:
                return _run(_prepare(base, code, limits, cgroup), cgroup)
            finally:
                _remove(base)
        finally:
            cgroup.remove()


@functools.cache
def _host_cgroups() -> HostCgroups:
    return host_cgroups()


def _prepare(base: Path, code: str, limits: SandboxLimits, cgroup: RunCgroup) -> Plan:
    """Mount points under base/root for what the interpreter needs and for /work (a tmpfs the
    child mounts); nothing the code writes ever lands in base."""
    root = base / "root"
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
    source = code.encode(errors="replace")  # a lone surrogate: "?"
    return Plan(
        os.fsencode(root),
        tuple(read_only),
        source,
        limits,
        cgroup.join_paths,
        syscall_number("keyctl"),
    )


def _make_dirs(root: Path, path: Path) -> None:
    """Create root and the directories down to path, each mode 755 (readable by nobody)."""
    for directory in (*reversed(path.parents), path):
        if directory.is_relative_to(root):
            directory.mkdir(exist_ok=True)
            directory.chmod(0o755)


def _run(plan: Plan, cgroup: RunCgroup) -> SandboxResult:
    start = time.monotonic()
    proc = _spawn(plan)
    with proc:
        try:
            stdout, stderr, killed = _collect(proc, plan.limits, start, cgroup)
        finally:
            _stop(proc)
    err, code = stderr.decode(errors="replace"), proc.returncode
    exit_code = None if killed is not None else code  # the sandbox ended it: no exit of its own
    last_line = err.rstrip().rpartition("\n")[2]
    if killed is None and cgroup.oom_kills():
        killed = "memory"
    elif killed is None and code == -signal.SIGXCPU:  # how the wrapper reports RLIMIT_CPU
        killed = "cpu"
    elif killed is None and code == 1 and last_line.startswith("MemoryError"):
        killed = "memory"
    seconds = time.monotonic() - start
    return SandboxResult(
        stdout.decode(errors="replace"),
        err,
        exit_code,
        killed,
        seconds,
        cgroup.cpu_seconds(),
        proc.pid,
    )


def _spawn(plan: Plan) -> subprocess.Popen[bytes]:
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
                    preexec_fn=functools.partial(enter, plan, write_fd),
                )
        except (OSError, subprocess.SubprocessError) as exc:
            step, _, reason = report.read().decode(errors="replace").partition("\t")
            raise SandboxError(step or "starting the interpreter", reason or str(exc)) from None


def _over(cgroup: RunCgroup, limits: SandboxLimits) -> str | None:
    """The limit of the whole run it has reached, if any."""
    if cgroup.oom_kills():
        return "memory"
    if cgroup.cpu_seconds() > limits.cpu_s:
        return "cpu"
    return None


def _collect(
    proc: subprocess.Popen[bytes], limits: SandboxLimits, start: float, cgroup: RunCgroup
) -> tuple[bytes, bytes, str | None]:
    """Read both pipes until the process exits, or it reaches a limit of the whole run: the
    deadline, more than the output limit, its cgroup's CPU time or an OOM kill."""
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout.fileno(), proc.stderr.fileno()
    kept, total = {out: bytearray(), err: bytearray()}, 0
    deadline = start + limits.wall_s

    def outcome(killed: str | None) -> tuple[bytes, bytes, str | None]:
        return bytes(kept[out]), bytes(kept[err]), killed

    with selectors.DefaultSelector() as selector:
        for fd in kept:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            if (left := deadline - time.monotonic()) <= 0:
                return outcome("wall_clock")
            if over := _over(cgroup, limits):
                return outcome(over)
            for key, _ in selector.select(min(left, POLL_S)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                kept[key.fd] += chunk[: max(limits.output_bytes - total, 0)]
                total += len(chunk)
                if total > limits.output_bytes:
                    return outcome("output")
    while proc.poll() is None:
        if time.monotonic() > deadline:
            return outcome("wall_clock")
        if over := _over(cgroup, limits):
            return outcome(over)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(POLL_S)
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
    """Delete the run's mount points, unless something is still mounted under them."""
    with open("/proc/self/mountinfo") as mounts:
        if any(line.split()[4].startswith(f"{base}/") for line in mounts):
            return
    shutil.rmtree(base, ignore_errors=True)
