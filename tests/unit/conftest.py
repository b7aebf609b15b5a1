"""Fixtures of the sandbox tests (test_python_sandbox.py, test_sandbox_attacks.py): one runner
per module, and `unharmed`, which checks after each attack that the worker is as it was, nothing
of the run is left on the host, and the same runner still works."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from llamarl.tools.python_runner import PythonRunner
from tests.unit.sandbox_support import LIMITS, ROOT_ON_LINUX, sandbox_leftovers, worker_state

GONE_WITHIN_S = 5.0
"""A killed run's pid-namespace init whose wrapper the OOM killer took is reparented to the
host's init, which reaps it a moment later: gone within this, not at once."""


@pytest.fixture(scope="module")
def runner() -> PythonRunner:
    if not ROOT_ON_LINUX:
        pytest.skip("the sandbox needs root on Linux")
    return PythonRunner(LIMITS)


@pytest.fixture
def unharmed(runner: PythonRunner) -> Iterator[None]:
    state, (processes, dirs) = worker_state(), sandbox_leftovers()
    yield
    assert worker_state() == state
    deadline = time.monotonic() + GONE_WITHIN_S
    while not sandbox_leftovers()[0] <= processes:
        assert time.monotonic() < deadline, "a process of the sandbox outlived its run"
        time.sleep(0.05)
    dirs_after = sandbox_leftovers()[1]
    assert dirs_after == dirs, "the run's directory or cgroup was not removed"
    assert runner.call("print(2+2)") == "4\n"
