"""Multi-turn episodes under `llamarl run`, end to end over Redis, the broker and real worker
processes: a generator SIGKILLed in the middle of an episode has its tickets reissued and each
trained exactly once; groups whose environment raised are refused (ended `skipped`, counted) and
the run goes on to finish with a balanced ledger (`killed_run`, which test_agents_run.py uses for
agents too)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.async_helpers import (
    check_reissued_run,
    launch,
    trained_entries,
    wait_for_steps,
    worker_pids,
    write_config,
)

STEPS = 6


def _kill_inside_an_episode(launcher_pid: int, markers: Path, run_id: str) -> int:
    """SIGKILL generator-0 just after its environment began a step (which takes 0.15 s)."""
    pid = worker_pids(launcher_pid, run_id)["generator-0"]
    marker = markers / str(pid)
    seen = marker.stat().st_mtime if marker.exists() else 0.0
    deadline = time.monotonic() + 60
    while not marker.exists() or marker.stat().st_mtime == seen:
        assert time.monotonic() < deadline, "generator-0 never stepped an environment"
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    return pid


def killed_run(tmp_path: Path, run_id: str, environment: dict[str, Any]) -> tuple[dict[str, Any], Path]:
    """A run of `environment`'s episodes, each step marked in a marker directory (handed to
    the environment as `marker_dir`, to an agent as $LLAMARL_TEST_MARKERS), whose generator-0 is
    SIGKILLed inside an episode after two steps: its summary, checked, and its run directory."""
    markers = tmp_path / "markers"
    markers.mkdir()
    if "options" in environment:
        environment["options"]["marker_dir"] = str(markers)
    config = write_config(
        tmp_path,
        run_id,
        environment=environment,
        trainer={"num_steps": STEPS, "eval_every": STEPS},
        task={"num_eval": 4},
        staleness={"max_staleness": 1, "lease_s": 2.0},
        workers={"max_restarts": 1},
    )
    run_dir = tmp_path / run_id
    proc = launch(config, env={**os.environ, "LLAMARL_TEST_MARKERS": str(markers)})
    try:
        wait_for_steps(run_dir, 2, proc)
        _kill_inside_an_episode(proc.pid, markers, run_id)
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    return check_reissued_run(proc, out, err, run_dir, STEPS * 4), run_dir


@pytest.mark.long
def test_killed_generator_episodes_are_reissued_and_trained_once(tmp_path: Path) -> None:
    environment = {
        "kind": "tests.episode_envs:PacedEnv",
        "max_turns": 2,
        "max_tokens": 12,
        "options": {},
    }
    summary, run_dir = killed_run(tmp_path, "episodes", environment)
    # Prompts 0, 7, 14, ... raise in their environment: refused, never trained.
    trainer = json.loads((run_dir / "timers" / "trainer.json").read_text())
    assert summary["ledger"]["skipped"] == trainer["groups_env_error"] >= 1
    generator = json.loads((run_dir / "timers" / "generator-1.json").read_text())
    assert generator["episodes_env_error"] >= 1 and generator["episode_turns"] > 0
    assert all(e["ticket_id"] % 7 for e in trained_entries(run_dir))
