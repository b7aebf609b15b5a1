"""End to end with a trainer of two ranks (torchrun, gloo) and two generators: the tiny demo learns
and its ledger balances under the local launcher, and balances on a
short run under Ray; a trainer rank of FSDP shards SIGKILLed mid-run (rank 1, then rank 0) takes
the others down with it, and the restarted ranks resume from their sharded checkpoint; a stopped
two-rank FSDP run resumes on one rank."""

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
    check_resumed_run,
    launch,
    metrics_records,
    wait_for_steps,
    write_config,
)
from tests.integration.test_learning import NOISE, PROMPTS_PER_STEP, STEPS, TINY, shorter

pytestmark = pytest.mark.long  # a whole run of a minute or more: `make test-long`

SCALED = {"LLAMARL__TRAINER__RANKS": "2", "LLAMARL__WORKERS__NUM_GENERATORS": "2"}
"""Two trainer ranks and two generators (a GPU run sets its own ranks on top), on the demo's
first STEPS steps from its warm start, like the learning tests."""
RAY_STEPS = 20


def rank_stopped(run_dir: Path) -> dict[str, Any]:
    """What trainer rank 1 logged when rank 0 stopped it."""
    for line in (run_dir / "logs" / "trainer.log").read_text().splitlines():
        if '"trainer rank stopped"' in line:
            record: dict[str, Any] = json.loads(line)
            return record
    raise AssertionError("trainer rank 1 never stopped cleanly")


def learning_run(run_dir: Path, warm_start: Path, env: dict[str, str], *options: str, steps: int = STEPS) -> None:
    """`llamarl run` of the demo's first `steps` steps with two generators and `env` on top;
    checks that each group was trained once with a balanced ledger, that every generator took
    versions without a failure and, on a run of STEPS or more, that it learned."""
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "run", TINY, *options],
        capture_output=True,
        text=True,
        timeout=1400,
        env={**os.environ, **shorter(warm_start, steps), **SCALED, **env, "LLAMARL_RUN_DIR": str(run_dir)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["steps"] == steps and summary["restarts"] == {}
    if steps >= STEPS:
        assert summary["final_accuracy"] - summary["initial_accuracy"] >= NOISE, summary
    check_finished_run(summary, run_dir, steps * PROMPTS_PER_STEP, k=1)
    for generator in ("generator-0", "generator-1"):
        counters = json.loads((run_dir / "timers" / f"{generator}.json").read_text())
        assert counters["syncs"] >= 2 and counters.get("sync_failures", 0) == 0, generator


@pytest.mark.timeout(1500)
def test_two_ranks_and_two_generators_learn_and_balance_the_ledger(tmp_path: Path, tiny_warm_start: Path) -> None:
    """Replicas; FSDP shards take the one-process steps (test_trainer_ranks.py) and run end to
    end below (killed ranks, a resume on one rank)."""
    learning_run(tmp_path / "run", tiny_warm_start, {})
    stopped = rank_stopped(tmp_path / "run")
    assert stopped["rank"] == 1 and stopped["steps"] == STEPS, "rank 1 trained every step"


@pytest.mark.timeout(1500)
def test_two_ranks_and_two_generators_under_ray_balance_the_ledger(tmp_path: Path, tiny_warm_start: Path) -> None:
    """The same layout with every role a Ray actor, on a short run: what Ray changes is where
    and how the roles start (learning is the local run's, above)."""
    learning_run(tmp_path / "run", tiny_warm_start, {}, "--launcher", "ray", steps=RAY_STEPS)
    stopped = rank_stopped(tmp_path / "run")
    assert stopped["rank"] == 1 and stopped["steps"] == RAY_STEPS, "rank 1 trained every step"


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


def test_killed_ranks_restart_the_trainer_from_its_checkpoint(tmp_path: Path) -> None:
    """Rank 1 SIGKILLed, then (after the restart) rank 0: each kill takes torchrun's ranks down,
    the launcher restarts the trainer, both ranks resume from the checkpoint (FSDP shards, each
    rank reading its own part) and no version number is used twice."""
    steps = 24
    config = write_config(
        tmp_path,
        "ranks-kill",
        trainer={"ranks": 2, "num_steps": steps, "checkpoint_every": 5, "eval_every": steps, "sharding": "fsdp"},
    )
    run_dir = tmp_path / "ranks-kill"
    proc = launch(config)
    kills: list[tuple[int, int]] = []  # (steps recorded at the kill, versions used before it)
    try:
        for rank, after in ((1, 8), (0, 17)):
            records = wait_for_steps(run_dir, after, proc, timeout_s=300)
            os.kill(rank_pid(proc.pid, rank), signal.SIGKILL)
            kills.append((len(records), max(r["policy_version"] for r in records) + 1))
        out, err = proc.communicate(timeout=600)
    finally:
        supervise.stop(proc)
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["restarts"] == {"trainer": 2}
    check_finished_run(summary, run_dir, steps * 4, k=1)
    records = metrics_records(run_dir)
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    for seen, versions_before in kills:  # steps trained after the resume (5 steps of margin)
        resumed = [r for r in records if r["step"] > seen + 5]
        assert min(r["policy_version"] for r in resumed) > versions_before, "version reused"
    assert 0 < rank_stopped(run_dir)["steps"] < steps, "a new rank 1 followed from the resume"


def test_a_two_rank_fsdp_run_stopped_resumes_on_one_rank(tmp_path: Path) -> None:
    """Ctrl-C an fsdp run of two ranks, then `llamarl run --resume` with one: the one rank reads
    both ranks' shards (resharded on load) and the run completes, ledger balanced, every step
    once, versions only rising."""
    steps = 20
    trainer = {"num_steps": steps, "checkpoint_every": 4, "eval_every": steps, "sharding": "fsdp"}
    config = write_config(tmp_path, "reshard", trainer=trainer | {"ranks": 2})
    run_dir = tmp_path / "reshard"
    proc = launch(config)
    try:
        wait_for_steps(run_dir, 9, proc, timeout_s=300)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    finally:
        supervise.stop(proc)
    assert proc.returncode == 130
    latest = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    assert len(list((latest / "shards").glob("*.distcp"))) == 2, "two ranks wrote shards"
    config = write_config(tmp_path, "reshard", trainer=trainer | {"ranks": 1})
    proc = launch(config, "--resume")
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        supervise.stop(proc)
    assert proc.returncode == 0, err[-3000:]
    check_resumed_run(out, run_dir, steps)
