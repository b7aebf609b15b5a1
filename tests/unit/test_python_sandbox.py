"""The Python tool's sandbox against real attacks, in real processes: reading outside its
directory, the network, fork bombs, endless loops, huge allocations and floods of output are each
refused or killed within their limit, and afterwards this process (the worker) is untouched (same
namespaces, uid and limits), no process of the sandbox is left, its directory is gone, and the same
runner still answers `print(2+2)`. Without root on Linux the tool refuses to start, in one line.
"""

from __future__ import annotations

import errno
import os
import select
import shutil
import socket
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from llamarl.tools.python_runner import PythonRunner, reply
from llamarl.tools.sandbox import SandboxLimits, SandboxResult, run_sandboxed
from tests.unit.sandbox_support import LIMITS, MARGIN_S, ROOT_ON_LINUX


def _run(code: str) -> SandboxResult:
    return run_sandboxed(code, LIMITS)


@pytest.mark.usefixtures("unharmed")
def test_reading_outside_its_directory_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the launch codes")
    code = f"""
for path in [{str(secret)!r}, "/etc/passwd", "/root/.bashrc", "/proc/self/environ"]:
    try:
        print(open(path).read())
    except OSError as exc:
        print(type(exc).__name__)
"""
    result = _run(code)
    assert result.exit_code == 0, result.stderr
    assert set(result.stdout.split()) <= {"FileNotFoundError", "PermissionError"}
    assert len(result.stdout.split()) == 4
    assert "launch codes" not in result.stdout + result.stderr


@pytest.mark.usefixtures("unharmed")
def test_connecting_to_a_socket_is_refused() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        code = f"""
import socket
for host in ["127.0.0.1", "1.1.1.1"]:
    try:
        with socket.create_connection((host, {port}), timeout=1) as conn:
            conn.sendall(b"exfiltrated")
        print("connected")
    except OSError as exc:
        print(exc.errno)
"""
        result = _run(code)
        listener.setblocking(False)
        assert select.select([listener], [], [], 0) == ([], [], [])
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert result.exit_code == 0, result.stderr
    # The seccomp filter refuses an AF_INET socket before the empty network namespace would.
    assert [int(n) for n in result.stdout.split()] == [errno.EPERM] * 2


@pytest.mark.usefixtures("unharmed")
@pytest.mark.parametrize(
    "code",
    [
        "import os\nwhile True: os.fork()",
        "import os\nwhile True:\n    try:\n        os.fork() or os.setsid()\n    except OSError:\n        pass",
    ],
    ids=["plain", "setsid-and-retry"],
)
def test_a_fork_bomb_is_limited_and_leaves_nothing(code: str) -> None:
    result = _run(code)
    assert result.seconds < LIMITS.wall_s + MARGIN_S
    assert result.killed in (None, "wall_clock", "cpu", "output")
    assert result.exit_code != 0
    if result.killed is None:
        assert "BlockingIOError" in result.stderr  # fork refused by RLIMIT_NPROC
    with pytest.raises(ProcessLookupError):
        os.killpg(result.pgid, 0)


@pytest.mark.usefixtures("unharmed")
def test_the_processes_the_code_may_have_are_limited() -> None:
    code = """
import os, time
n = 1
try:
    while True:
        os.fork() or time.sleep(60)
        n += 1
except OSError:
    print(n)
"""
    result = _run(code)
    assert result.stdout == f"{LIMITS.num_processes - 2}\n"  # the wrapper and init count
    assert result.seconds < LIMITS.wall_s, "the sleeping children die with the code"


IGNORING_SIGXCPU = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass"


SPINNING_CHILDREN = """
import os
for _ in range(2):
    if os.fork() == 0:
        break
while True:
    pass
"""


@pytest.mark.parametrize(
    "code",
    ["while True:\n    pass", IGNORING_SIGXCPU, SPINNING_CHILDREN],
    ids=["a-loop", "a-loop-ignoring-sigxcpu", "three-processes"],
)
@pytest.mark.usefixtures("unharmed")
def test_an_endless_loop_is_killed_by_the_cpu_limit_of_the_whole_run(code: str) -> None:
    """The run's cgroup counts every process: three spinning processes share one budget, and
    ignoring SIGXCPU (the per-process limit's first signal) buys nothing."""
    limits = SandboxLimits(wall_s=30, cpu_s=LIMITS.cpu_s)  # CPU seconds, however busy the host
    result = run_sandboxed(code, limits)
    assert result.killed == "cpu", result
    # The kernel's count for the run's cgroup. The upper margin is a poll and the kill on a busy
    # host; per process the CPU limit alone would let three processes use three times the budget.
    assert limits.cpu_s - 0.05 < result.cpu_s < limits.cpu_s + 0.9, result
    assert reply(result, limits) == "error: cpu limit 1 s"


@pytest.mark.usefixtures("unharmed")
def test_sleeping_past_the_wall_clock_is_killed() -> None:
    result = _run("import time\ntime.sleep(60)")
    assert result.killed == "wall_clock"
    assert LIMITS.wall_s <= result.seconds < LIMITS.wall_s + MARGIN_S
    assert result.exit_code is None
    assert reply(result, LIMITS) == "error: killed after 3 s wall-clock limit"


@pytest.mark.usefixtures("unharmed")
def test_a_ten_gigabyte_allocation_hits_the_memory_limit(runner: PythonRunner) -> None:
    result = _run("x = bytearray(10 * 1024**3)")
    assert result.killed == "memory"
    assert result.seconds < LIMITS.wall_s
    assert runner.call("x = bytearray(10 * 1024**3)") == "error: memory limit 512 MiB exceeded"


@pytest.mark.usefixtures("unharmed")
@pytest.mark.parametrize(
    "code",
    ['import sys\nsys.stdout.write("x" * 100_000_000)', 'while True:\n    print("x" * 1000)'],
    ids=["one-write", "loop"],
)
def test_a_flood_of_output_is_cut_at_the_limit(code: str) -> None:
    limits = SandboxLimits(wall_s=30, cpu_s=10)  # only the output limit, however busy the host
    tracemalloc.start()
    try:
        result = run_sandboxed(code, limits)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.killed == "output"
    assert len(result.stdout.encode()) <= limits.output_bytes
    assert peak < 4 * limits.output_bytes + (1 << 20), "the parent buffered the flood"


@pytest.mark.usefixtures("unharmed")
def test_files_are_written_only_inside_work_and_removed_after() -> None:
    code = """
import os
with open("note.txt", "w") as note:
    note.write("kept")
print(open("/work/note.txt").read(), os.getcwd(), os.getuid())
for path, size in [("/work/big.bin", 2 << 20), ("/usr/x", 1), ("/x", 1)]:
    try:
        with open(path, "wb") as out:
            out.write(bytes(size))
    except OSError as exc:
        print(exc.errno)
"""
    result = _run(code)  # the fixture checks that the directory is gone afterwards
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split() == [
        "kept",
        "/work",
        "65534",
        *map(str, [errno.EFBIG, errno.EROFS, errno.EROFS]),
    ]


def _construct_as(*setpriv: str) -> subprocess.CompletedProcess[str]:
    snippet = (
        "from llamarl.errors import ConfigError\n"
        "from llamarl.tools.python_runner import PythonRunner\n"
        "try:\n    PythonRunner()\nexcept ConfigError as exc:\n"
        "    print(exc, file=__import__('sys').stderr)\n    raise SystemExit(2)\n"
    )
    command = [*setpriv, sys.executable, "-c", snippet]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


NOT_ROOT = "--reuid 4242 --regid 4242 --clear-groups --inh-caps +dac_read_search --ambient-caps +dac_read_search"
"""A plain user, still able to read any file (the venv is under /root, mode 700); not the
sandbox's uid 65534, so a run's leftover check at the same time does not count it."""


@pytest.mark.parametrize(
    ("setpriv", "step"),
    [(NOT_ROOT, "the sandbox"), ("--bounding-set -sys_admin", "unshare")],
    ids=["not-root", "root-without-cap-sys-admin"],  # the second is docker's default
)
def test_the_tool_refuses_to_start_where_it_cannot_isolate(setpriv: str, step: str) -> None:
    if ROOT_ON_LINUX and shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    finished = _construct_as(*(["setpriv", *setpriv.split()] if ROOT_ON_LINUX else []))
    assert finished.returncode == 2, finished.stderr
    lines = finished.stderr.splitlines()
    assert len(lines) == 1, finished.stderr
    assert lines[0].startswith("tools.python: cannot apply ")
    assert lines[0].endswith("remove it from environment.tools")
    if ROOT_ON_LINUX:
        assert lines[0].startswith(f"tools.python: cannot apply {step}")
