"""How busy the machine was while something was measured (`llamarl.bench.machine_load`): busy
loops of other processes count, this process's children do not (a profile's co-run probes are
its own work); a profile measured while they ran is measured again, then refused."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from llamarl.bench import profile
from llamarl.bench.machine_load import BUSY_CORES, OtherLoad, own_cpu_s
from llamarl.config import RunConfig
from llamarl.errors import ConfigError
from llamarl.sim.costs import Costs
from tests.busy_loops import busy_loops

SPIN = "import time\nend = time.process_time() + 1\nwhile time.process_time() < end: pass\ninput()"


def test_another_processs_busy_loop_counts_as_a_core() -> None:
    with busy_loops(1), OtherLoad() as load:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:  # the window the load is averaged over
            time.sleep(0.05)
    assert load.cores >= 0.8, load.cores


def test_a_child_processs_cpu_is_this_processs_own() -> None:
    """Alive (from /proc) and once reaped (from os.times), a child that spun for a CPU second
    adds about a second to this process's own CPU."""
    before = own_cpu_s()
    child = subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while own_cpu_s() - before < 0.9:  # counted while it is alive
            assert time.monotonic() < deadline, "the live child's CPU was not counted"
            time.sleep(0.05)
    finally:
        child.communicate(b"\n", timeout=30)
    assert own_cpu_s() - before >= 0.9, "the reaped child's CPU was not counted"
    assert os.times().children_user > 0


def test_a_profile_that_other_processes_slowed_while_it_measured_is_measured_again_then_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The machine quiet when each attempt looks (`others_now` answers 0 here: under `make test`
    the other pytest worker is on it) but busy while it measures: measured twice, then refused.
    A machine busy before it measures: tests/integration/test_busy_profile.py."""
    measured: list[str] = []

    def beside_a_busy_loop(where: str) -> Callable[[RunConfig], tuple[Costs, dict[str, Any]]]:
        def measure(config: RunConfig) -> tuple[Costs, dict[str, Any]]:
            with busy_loops(2):
                time.sleep(0.5)
            measured.append(where)
            return Costs({}, 0.0, 0.0, 0.0, 0.0, {}, 2), {}

        return measure

    monkeypatch.setattr(profile, "measure", beside_a_busy_loop("here"))
    # The second attempt measures in a process of its own (`measure_apart`).
    monkeypatch.setattr(profile, "measure_apart", beside_a_busy_loop("apart"))
    monkeypatch.setattr(profile, "others_now", lambda seconds: 0.0)
    monkeypatch.setattr(profile, "RETRY_WAIT_S", 0.0)
    monkeypatch.delenv("LLAMARL_PROFILE_BUSY")
    config = RunConfig()
    with pytest.raises(ConfigError, match="while it measured, 2 times"):
        profile.trusted_measure(config)
    assert measured == ["here", "apart"]
    assert capsys.readouterr().err.count("while it measured (attempt") == 2
    monkeypatch.setenv("LLAMARL_PROFILE_BUSY", "accept")
    costs, extra = profile.trusted_measure(config)
    assert extra["busy"] and extra["others_cores"] > BUSY_CORES and measured == ["here", "apart", "here"]
