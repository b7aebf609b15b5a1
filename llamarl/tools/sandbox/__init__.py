"""Runs a Python source string in a separate, isolated process under limits (Linux only, as root).

The child joins a cgroup of its own (memory, processes and CPU bounded for the whole run:
`cgroups`), enters new mount, pid, network, IPC and UTS namespaces (no network, not even
loopback; SysV and POSIX IPC objects die with the run), mounts only what the interpreter needs
read-only (`sys.base_prefix`, /usr, /lib, /lib64, /bin) and a tmpfs bounded in bytes and files
at /work into a private root, `chroot`s there, sets resource limits, drops to uid/gid 65534
without groups or new privileges, joins a fresh session keyring and loads a seccomp filter
(`seccomp`) before it execs (`isolation`). The parent reads its output up to the limits and
ends and removes everything before it returns (`run`). Not protected against: kernel exploits
in the system calls the filter allows, side channels, and what the host grants uid 65534.
"""

from llamarl.tools.sandbox.limits import SandboxError, SandboxLimits, SandboxResult
from llamarl.tools.sandbox.run import LOCK_FILE, PYTHON, run_sandboxed

__all__ = [
    "LOCK_FILE",
    "PYTHON",
    "SandboxError",
    "SandboxLimits",
    "SandboxResult",
    "run_sandboxed",
]
