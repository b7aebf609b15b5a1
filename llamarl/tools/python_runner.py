"""The Python tool: the model's code runs in a separate, isolated process (`llamarl.tools.sandbox`:
a cgroup of its own bounding memory, processes and CPU for the whole call; new mount, pid,
network, IPC and UTS namespaces; a read-only chroot with only the interpreter and a bounded tmpfs
/work; uid 65534, a fresh session keyring and a seccomp filter; output, file-size and wall-clock
limits) and the tool answers with what it printed, or with one `error:` line naming the limit
that ended it. A call never raises: whatever goes wrong is its answer. It needs root on Linux,
and refuses to start, at construction, where any isolation step cannot be applied. It does not
protect against kernel exploits or side channels.
"""

from __future__ import annotations

import structlog

from llamarl.errors import ConfigError
from llamarl.tools.sandbox import SandboxError, SandboxLimits, SandboxResult, run_sandboxed

log = structlog.get_logger(__name__)
MAX_CHARS = 2000


class PythonRunner:
    """Runs the model's Python code in the sandbox; the reply is its stdout (then stderr).

    Construction runs `print(1)` in the sandbox once and raises ConfigError, one line naming the
    step, if the sandbox cannot be built here."""

    name = "python"

    def __init__(self, limits: SandboxLimits | None = None, max_chars: int = MAX_CHARS) -> None:
        self.limits = limits or SandboxLimits()
        self.max_chars = max_chars
        try:
            probe = run_sandboxed("print(1)", self.limits)
        except SandboxError as exc:
            raise _refusal(exc.step, exc.reason) from None
        if probe.stdout != "1\n" or probe.exit_code != 0:
            last = probe.stderr.strip().rpartition("\n")[2] or probe.killed or "no output"
            raise _refusal("the limits", f"print(1) ended with {probe.exit_code}: {last}")

    def call(self, argument: str) -> str:
        """Run `argument` as a Python script; what it printed, or one `error:` line."""
        try:
            result = run_sandboxed(argument, self.limits)
        except SandboxError as exc:
            return f"error: the sandbox could not start ({' '.join(str(exc).split())})"
        except Exception as exc:  # a call never raises: the model reads what went wrong
            log.error("sandbox failure", error=repr(exc))
            return f"error: the sandbox failed ({type(exc).__name__}: {exc})"
        return reply(result, self.limits, self.max_chars)


def reply(result: SandboxResult, limits: SandboxLimits, max_chars: int = MAX_CHARS) -> str:
    """The text the model reads back for one run: a limit's `error:` line, or its output (stdout,
    then stderr) with the middle left out past `max_chars`, and how a signal ended it."""
    if result.killed == "wall_clock":
        return f"error: killed after {limits.wall_s:g} s wall-clock limit"
    if result.killed == "memory":
        return f"error: memory limit {limits.memory_mb} MiB exceeded"
    if result.killed == "output":
        return f"error: output over {limits.output_bytes} bytes"
    if result.killed == "cpu":
        return f"error: cpu limit {limits.cpu_s} s"
    parts = [result.stdout, result.stderr]
    if result.exit_code is not None and result.exit_code < 0:
        parts.append(f"error: killed by signal {-result.exit_code}")
    text = ""
    for part in filter(None, parts):
        text += part if text.endswith("\n") or not text else "\n" + part
    if len(text) > max_chars:
        half = max_chars // 2
        text = f"{text[:half]}\n... ({len(text) - 2 * half} characters left out) ...\n{text[-half:]}"
    return text or "(no output)"


def _refusal(step: str, reason: str) -> ConfigError:
    reason = " ".join(reason.split())
    return ConfigError(
        f"tools.python: cannot apply {step} on this host ({reason}); run the Python tool as root "
        "on Linux, or remove it from environment.tools"
    )
