"""The steps a sandboxed child takes between fork and exec, as root, in this order: join the
run's cgroup; unshare the mount, pid, network, IPC and UTS namespaces; mount its private root (the
interpreter's directories read-only, and /work a tmpfs bounded in bytes and files, gone with the
mount namespace) with the code written there; chroot; set the resource limits; drop to uid/gid
65534 without groups or new privileges; join a fresh session keyring; load the seccomp filter.

Each step is one entry of `steps`; the first that fails is reported (`step\\treason`) on a pipe,
and the parent raises it as a SandboxError.
"""

from __future__ import annotations

import ctypes
import functools
import os
import resource
from collections.abc import Callable
from dataclasses import dataclass

from llamarl.tools.sandbox.limits import SandboxLimits
from llamarl.tools.sandbox.seccomp import run_filter

NOBODY = 65534
CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x20000000, 0x40000000
CLONE_NEWIPC, CLONE_NEWUTS = 0x08000000, 0x04000000
NAMESPACES = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT = 1, 2, 4, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
REMOUNT = MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV
PR_SET_NO_NEW_PRIVS = 38
KEYCTL_JOIN_SESSION_KEYRING = 1


@dataclass(frozen=True)
class Plan:
    """What the child needs, computed in the parent (the child only makes system calls)."""

    root: bytes
    read_only: tuple[bytes, ...]
    code: bytes
    limits: SandboxLimits
    join_paths: tuple[bytes, ...]
    keyctl: int
    """This machine's number of the keyctl system call (libc has no wrapper for it)."""


@functools.cache
def libc() -> ctypes.CDLL:
    """libc with unshare, mount, prctl and syscall looked up, in the parent (dlsym is unsafe
    after fork)."""
    library = ctypes.CDLL(None, use_errno=True)
    for name in ("unshare", "mount", "prctl", "syscall"):
        getattr(library, name)
    return library


def enter(plan: Plan, report_fd: int) -> None:
    """In the child before exec: each isolation step in turn; the first that fails is reported."""
    for step, action in steps(plan).items():
        try:
            action()
        except BaseException as exc:
            os.write(report_fd, f"{step}\t{exc}".replace("\n", " ").encode())
            raise


def steps(plan: Plan) -> dict[str, Callable[[], None]]:
    c = libc()
    return {
        "a cgroup per call": lambda: _join(plan.join_paths),
        "unshare (mount, pid, network, IPC and UTS namespaces)": lambda: _check(c.unshare(NAMESPACES)),
        "read-only bind mounts and a tmpfs /work": lambda: _mount_root(c, plan),
        "chroot": lambda: _enter_root(plan.root),
        "resource limits": lambda: _set_limits(plan.limits),
        "uid/gid 65534": lambda: _become_nobody(c),
        "a fresh session keyring": lambda: _new_session_keyring(c, plan.keyctl),
        "the seccomp filter": lambda: run_filter().load(),
    }


def _check(result: int) -> None:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def _join(paths: tuple[bytes, ...]) -> None:
    for path in paths:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, b"0")  # 0: the writing process
        finally:
            os.close(fd)


def _mount_root(c: ctypes.CDLL, plan: Plan) -> None:
    """Mounts seen only in the child's namespace: the root and its binds read-only, and /work a
    tmpfs of its own holding main.py."""

    def mount(
        source: bytes | None,
        target: bytes,
        flags: int,
        fstype: bytes | None = None,
        data: bytes | None = None,
    ) -> None:
        _check(c.mount(source, target, fstype, flags, data))

    mount(None, b"/", MS_REC | MS_PRIVATE)  # nothing below propagates to the host
    mount(plan.root, plan.root, MS_BIND)  # a mount of its own, to be made read-only
    for path in plan.read_only:
        mount(path, plan.root + path, MS_BIND)
    limits = plan.limits
    options = f"size={limits.work_bytes},nr_inodes={limits.work_files},mode=0700,uid={NOBODY},gid={NOBODY}"
    work = plan.root + b"/work"
    mount(b"tmpfs", work, MS_NOSUID | MS_NODEV, b"tmpfs", options.encode())
    main = os.open(work + b"/main.py", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(main, plan.code)
        os.fchown(main, NOBODY, NOBODY)
    finally:
        os.close(main)
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


def _become_nobody(c: ctypes.CDLL) -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    _check(c.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))


def _new_session_keyring(c: ctypes.CDLL, keyctl: int) -> None:
    """An anonymous session keyring of its own: the worker's session keys are out of reach (and
    the filter then refuses every keyring call)."""
    _check(c.syscall(keyctl, KEYCTL_JOIN_SESSION_KEYRING, None))
