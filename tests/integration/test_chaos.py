"""Chaos under `llamarl run`: 8 SIGKILLs at random moments across every role (the trainer, both
generators, the reward worker, the run's Redis and its broker, each at least once; the trainer
and a generator a second time, once restarted). The launcher restarts each (the trainer resumes
from its checkpoint, Redis from its append-only file); the run completes, the ledger balances
exactly, no rollout is trained twice and staleness stays within its bound."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from llamarl.launch import supervise
from tests.integration.async_helpers import (
    check_finished_run,
    launch,
    metrics_records,
    service_pids,
    wait_for_steps,
    worker_pids,
    write_config,
)

pytestmark = pytest.mark.long  # a whole run of a minute or more: `make test-long`

RUN_ID = "chaos"
STEPS = 400
"""Measured: 20 kills took about 25 steps each (up to 80 for a generator's, which the other
generator works through), so 8 end near step 250 at most and the run outlasts them."""
PROMPTS_PER_STEP = 16
WORKERS = ("trainer", "generator-0", "generator-1", "reward-0")
SERVICES = ("redis", "broker")
VICTIMS = [*WORKERS, *SERVICES, "trainer", "generator-0"]


def _pid_of(launcher: subprocess.Popen[str], victim: str) -> int | None:
    """The live pid of `victim` (None while it is being restarted or Redis is away)."""
    try:
        if victim in SERVICES:
            return service_pids(launcher.pid, RUN_ID)[SERVICES.index(victim)]
        return worker_pids(launcher.pid, RUN_ID).get(victim)
    except (redis.RedisError, ConnectionError, OSError, ValueError):
        return None


def _wait_for_replacement(launcher: subprocess.Popen[str], victim: str, killed: int) -> None:
    deadline = time.monotonic() + 120
    while _pid_of(launcher, victim) in (None, killed):
        assert launcher.poll() is None, f"the run ended after {victim} was killed"
        assert time.monotonic() < deadline, f"{victim} was not restarted"
        time.sleep(0.1)


def test_kills_across_every_role(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        RUN_ID,
        trainer={"num_steps": STEPS, "prompts_per_step": PROMPTS_PER_STEP, "checkpoint_every": 10},
        staleness={"max_staleness": 1, "lease_s": 2.0},
        workers={"max_restarts": VICTIMS.count("generator-0") + 1},
    )
    run_dir = tmp_path / RUN_ID
    proc = launch(config)
    rng = random.Random(20)
    victims = rng.sample(VICTIMS, len(VICTIMS))
    kills: list[str] = []
    try:
        wait_for_steps(run_dir, 12, proc)  # past the first checkpoint
        for victim in victims:
            deadline = time.monotonic() + 120
            while (pid := _pid_of(proc, victim)) is None:
                assert time.monotonic() < deadline and proc.poll() is None, f"no {victim} to kill"
                time.sleep(0.1)
            time.sleep(rng.uniform(0.0, 0.5))  # a random moment: the scenario
            os.kill(pid, signal.SIGKILL)
            kills.append(victim)
            _wait_for_replacement(proc, victim, pid)
            wait_for_steps(run_dir, len(metrics_records(run_dir)) + 2, proc, timeout_s=180)
        out, err = proc.communicate(timeout=900)
    finally:
        supervise.stop(proc)
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert len(kills) == len(VICTIMS)
    assert set(kills) == {*WORKERS, *SERVICES}, "every role was killed"
    restarts = summary["restarts"]
    assert {name: restarts.get(name, 0) for name in set(kills)} == {name: kills.count(name) for name in set(kills)}, (
        "each kill was answered by exactly one restart"
    )
    check_finished_run(summary, run_dir, STEPS * PROMPTS_PER_STEP, k=1)
    print(json.dumps({"kills": kills, "restarts": restarts, "ledger": summary["ledger"]}))  # -s
