"""`llamarl bench sandbox`: what one Python tool call costs, start to result, on this machine.

Runs `print(1)` in the sandbox `calls` times in a row (each a fresh isolated process, as the tool
runs them) and reports the seconds per call (median, min, max), beside the same interpreter
started bare (`python -c 'print(1)'`): the sandbox's own overhead is the difference.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

from llamarl.bench.stats import spread
from llamarl.tools.sandbox import PYTHON, SandboxLimits, run_sandboxed


def _timed(action: Any) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def bench(calls: int) -> dict[str, Any]:
    limits = SandboxLimits()
    run_sandboxed("print(1)", limits)  # warm: the interpreter's files in the page cache

    def sandboxed() -> None:
        result = run_sandboxed("print(1)", limits)
        assert result.stdout == "1\n", result

    def bare() -> None:
        subprocess.run([str(PYTHON), "-I", "-S", "-B", "-c", "print(1)"], check=True, stdout=subprocess.DEVNULL)

    sandbox_s, bare_s = [], []
    for _ in range(calls):  # interleaved, so both see the same machine
        sandbox_s.append(_timed(sandboxed))
        bare_s.append(_timed(bare))
    overhead = [s - b for s, b in zip(sandbox_s, bare_s, strict=True)]
    return {
        "bench": "sandbox",
        "calls": calls,
        "call_s": spread(sandbox_s, 4),
        "bare_interpreter_s": spread(bare_s, 4),
        "overhead_s": spread(overhead, 4),
    }
