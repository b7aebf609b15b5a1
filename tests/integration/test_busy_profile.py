"""A profile measured while other processes keep the machine busy is not trusted: `llamarl bench
profile` measures again, and, the machine still busy, refuses in one line and caches nothing (a
cached busy profile would misjudge every later auto layout of the config). Its own descendants'
CPU (the co-run probes it forks) is its own: tests/unit/test_machine_load.py. A second
measurement runs in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import torch

from llamarl.bench.profile_apart import measure_apart
from llamarl.config import parse_config
from llamarl.launch.cores import usable_cores
from tests.busy_loops import busy_loops
from tests.integration.commands import LLAMARL, TINY_MODEL


def test_a_profile_measured_beside_busy_loops_is_measured_again_then_refused(tmp_path: Path) -> None:
    config = tmp_path / "tiny.json"
    config.write_text(
        json.dumps(
            {
                "model": TINY_MODEL,
                "task": {"num_digits": 1, "num_eval": 8},
                "generation": {"num_samples": 2, "max_new_tokens": 4},
                "trainer": {"prompts_per_step": 2},
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "LLAMARL_PROFILE_BUSY"}
    env["LLAMARL_CACHE_DIR"] = str(tmp_path / "cache")
    with busy_loops(os.cpu_count() or 2):
        done = subprocess.run(
            [*LLAMARL, "bench", "profile", str(config)], capture_output=True, text=True, env=env, timeout=600
        )
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("config error: profile: the machine stayed busy ("), lines[-1]
    assert "LLAMARL_PROFILE_BUSY=accept" in lines[-1] and "Traceback" not in done.stderr
    attempts = [line for line in lines if line.startswith("profile: other processes used ")]
    assert [line.rsplit("(", 1)[1] for line in attempts] == ["attempt 1 of 2)", "attempt 2 of 2)"]
    assert not list((tmp_path / "cache").rglob("*.json")), "a busy profile is not cached"


def test_a_second_measurement_runs_in_a_process_of_its_own() -> None:
    """A second attempt (the first was busy) measures in a fresh process: this one has run torch
    on two threads by then, and co-run probes forked from it could deadlock in the OpenMP runtime
    they inherit (seen here: a probe stuck in libgomp for REPLY_S). The fresh process's profile
    comes back whole."""
    torch.set_num_threads(2)
    torch.randn(256, 256) @ torch.randn(256, 256)  # this process's OpenMP threads, as an attempt's
    tree = {
        "model": TINY_MODEL,
        "task": {"num_digits": 1, "num_eval": 8},
        "generation": {"num_samples": 2, "max_new_tokens": 4},
        "trainer": {"prompts_per_step": 2},
    }
    costs, extra = measure_apart(parse_config(tree, environ={}))
    assert sorted(costs.threads) == list(range(1, usable_cores() + 1))
    assert set(costs.turns_phase_s) == {"generate", "train"} and costs.turns_s_per_step > 0
    if usable_cores() > 1:
        assert set(costs.corun_slowdown) == {"generate", "train"} and extra["probes_s"]["side_by_side"]
