"""The run's seccomp filter (libseccomp, through `pyseccomp`): a deny-list on top of the
namespaces, uid 65534 and no_new_privs, for the kernel interfaces that namespaces do not isolate
or that widen the kernel's attack surface.

Refused with EPERM: the kernel keyring (keyctl, add_key, request_key), io_uring, bpf,
perf_event_open, userfaultfd, ptrace and reading or writing another process's memory, every
mount and namespace call (a new user namespace would give the code capabilities inside it, so
clone with CLONE_NEWUSER too), module, kexec, swap, reboot and handle-based opens, and socket
families other than AF_UNIX (the network namespace has no interface, but AF_VSOCK, for one, is
not namespaced). clone3, whose flags a filter cannot read, answers ENOSYS, so the C library falls
back to clone. Calls of another architecture (the i386 ABI of an x86-64 kernel) kill the process:
libseccomp's default for a foreign architecture.
"""

from __future__ import annotations

import errno
import functools
import socket
from typing import TYPE_CHECKING, Any

from llamarl.tools.sandbox.limits import SandboxError

if TYPE_CHECKING:
    import pyseccomp

DENIED = {
    "the kernel keyring": ("keyctl", "add_key", "request_key"),
    "io_uring": ("io_uring_setup", "io_uring_enter", "io_uring_register"),
    "kernel tracing and programs": ("bpf", "perf_event_open", "userfaultfd"),
    "other processes' memory": ("ptrace", "process_vm_readv", "process_vm_writev"),
    "namespaces": ("unshare", "setns"),
    "mounts": ("mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount"),
    "new mount API": ("fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr"),
    "modules and kexec": (
        "init_module",
        "finit_module",
        "delete_module",
        "kexec_load",
        "kexec_file_load",
    ),
    "host administration": ("swapon", "swapoff", "reboot", "acct", "quotactl"),
    "handle-based opens": ("open_by_handle_at", "name_to_handle_at"),
}
"""System calls the run may not make (EPERM), by concern."""
CLONE_NEWUSER = 0x10000000


def _library() -> Any:
    try:
        import pyseccomp
    except (ImportError, OSError) as exc:  # the wheel, or the C library it binds, is missing
        raise SandboxError("the seccomp filter", f"{exc}: install libseccomp2 and `pip install pyseccomp`") from None
    return pyseccomp


@functools.cache
def syscall_number(name: str) -> int:
    """This machine's number for the system call `name` (for calls libc has no wrapper for)."""
    library = _library()
    return int(library.resolve_syscall(library.Arch.NATIVE, name))


@functools.cache
def run_filter() -> pyseccomp.SyscallFilter:
    """The filter, built once in the parent; the child only loads it (`.load()`)."""
    pyseccomp = _library()
    rules = pyseccomp.SyscallFilter(defaction=pyseccomp.ALLOW)
    refuse = pyseccomp.ERRNO(errno.EPERM)
    for names in DENIED.values():
        for name in names:
            rules.add_rule(refuse, name)
    rules.add_rule(refuse, "socket", pyseccomp.Arg(0, pyseccomp.NE, socket.AF_UNIX))
    rules.add_rule(refuse, "socketpair", pyseccomp.Arg(0, pyseccomp.NE, socket.AF_UNIX))
    rules.add_rule(refuse, "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
    rules.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
    return rules
