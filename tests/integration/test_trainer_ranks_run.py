"""End to end with a trainer of two ranks (torchrun, gloo) and two generators: the tiny demo learns
and its ledger balances under the local launcher and under Ray; a trainer rank SIGKILLed mid-run
takes the others down with it, and the restarted ranks resume from the checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llamarl.launch import supervise
from tests.integration.async_helpers import (
    check_finished_run,
    launch,
    metrics_records,
    wait_for_steps,
    write_config,
)
from tests.integration.test_learning import NOISE, PROMPTS_PER_STEP, STEPS, TINY, shorter

SCALED = {"LLAMARL__TRAINER__RANKS": "2", "LLAMARL__WORKERS__NUM_GENERATORS": "2"}
"""Two trainer ranks and two generators (a GPU run sets its own ranks on top), on the demo's
first STEPS steps from its warm start, like the learning tests."""


def rank_stopped(run_dir: Path) -> dict[str, Any]:
    """What trainer rank 1 logged when rank 0 stopped it."""
    for line in (run_dir / "logs" / "trainer.log").read_text().splitlines():
        if '"trainer rank stopped"' in line:
            record: dict[str, Any] = json.loads(line)
            return record
    raise AssertionError("trainer rank 1 never stopped cleanly")


def learning_run(run_dir: Path, warm_start: Path, env: dict[str, str], *options: str) -> None:
    """`llamarl run` of the demo's first STEPS steps with two generators and `env` on top; checks
    that it learned, trained each group once with a balanced ledger and that every generator
    took versions without a failure."""
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "run", TINY, *options],
        capture_output=True, text=True, timeout=1400,
        env={**os.environ, **shorter(warm_start), **SCALED, **env,
             "LLAMARL_RUN_DIR": str(run_dir)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["steps"] == STEPS and summary["restarts"] == {}
    assert summary["final_accuracy"] - summary["initial_accuracy"] >= NOISE, summary
    check_finished_run(summary, run_dir, STEPS * PROMPTS_PER_STEP, k=1)
    for generator in ("generator-0", "generator-1"):
        counters = json.loads((run_dir / "timers" / f"{generator}.json").read_text())
        assert counters["syncs"] >= 2 and counters.get("sync_failures", 0) == 0, generator


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("launcher", ["local", "ray"])
def test_two_ranks_and_two_generators_learn_and_balance_the_ledger(
    tmp_path: Path, launcher: str, tiny_warm_start: Path
) -> None:
    learning_run(tmp_path / "run", tiny_warm_start, {}, "--launcher", launcher)
    stopped = rank_stopped(tmp_path / "run")
    assert stopped["rank"] == 1 and stopped["steps"] == STEPS, "rank 1 trained every step"


def rank_pid(launcher_pid: int, rank: int) -> int:
    """The pid of a trainer rank below the launcher, found by the RANK torchrun gave it."""
    for pid in supervise.descendants(launcher_pid):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and b"LLAMARL_REDIS_URL" in b" ".join(environ):
            return pid
    raise AssertionError(f"no trainer rank {rank} below the launcher")


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_a_killed_rank_restarts_the_trainer_from_its_checkpoint(tmp_path: Path, rank: int) -> None:
    steps = 40
    config = write_config(
        tmp_path, f"ranks-kill-{rank}",
        trainer={"ranks": 2, "num_steps": steps, "checkpoint_every": 10, "eval_every": 20},
    )  # fmt: skip
    run_dir = tmp_path / f"ranks-kill-{rank}"
    proc = launch(config)
    try:
        records = wait_for_steps(run_dir, 15, proc, timeout_s=300)
        os.kill(rank_pid(proc.pid, rank), signal.SIGKILL)
        versions_before = max(r["policy_version"] for r in records) + 1
        out, err = proc.communicate(timeout=600)
    finally:
        supervise.stop(proc)
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["restarts"] == {"trainer": 1}
    check_finished_run(summary, run_dir, steps * 4, k=1)
    records = metrics_records(run_dir)
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    resumed = [r for r in records if r["step"] > 20]
    assert min(r["policy_version"] for r in resumed) > versions_before, "version reused"
    assert 0 < rank_stopped(run_dir)["steps"] < steps, "a new rank 1 followed from the resume"
