"""Short runs under `llamarl run` (async, and `--mode sync`) with an agent that a hostile or
careless user wrote: a request whose context renders to no tokens is refused (400) and counted,
and a reward outside float32's range ends its episode `agent_error`. Each run must finish, train
every step's groups once and balance its ledger. (What the trainer's door does with such a reward
from a reward worker: tests/unit/test_set_aside.py.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.async_helpers import check_finished_run, launch, write_config

STEPS = 3
MODES = [pytest.param([], id="async"), pytest.param(["--mode", "sync"], id="sync")]


def finished_run(tmp_path: Path, mode: list[str], **sections: Any) -> tuple[dict[str, Any], Path]:
    """A run of STEPS steps with `sections` over the small run's config: its summary, checked
    (exit 0, every group trained once, a balanced ledger), and its run directory."""
    defaults: dict[str, Any] = {
        "trainer": {"num_steps": STEPS, "eval_every": STEPS},
        "task": {"num_eval": 4},
        "staleness": {"max_staleness": 1, "lease_s": 2.0},
    }
    config = write_config(tmp_path, "hostile", **{**defaults, **sections})
    proc = launch(config, *mode)
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the run did not finish in 240 s: {err[-3000:]}") from None
    assert proc.returncode == 0, err[-3000:]
    summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    run_dir = tmp_path / "hostile"
    check_finished_run(summary, run_dir, STEPS * 4, k=1)
    return summary, run_dir


def generator_counts(run_dir: Path, name: str) -> int:
    """Counter `name` summed over the run's generators' timers."""
    timers = [json.loads(p.read_text()) for p in (run_dir / "timers").glob("generator-*.json")]
    return sum(int(t.get(name, 0)) for t in timers)


@pytest.mark.parametrize("mode", MODES)
def test_empty_contexts_and_rewards_outside_float32_leave_the_run_to_finish(tmp_path: Path, mode: list[str]) -> None:
    environment = {"kind": "agent", "agent": "tests.user_agents:hostile", "max_tokens": 12}
    summary, run_dir = finished_run(tmp_path, mode, environment=environment)
    # Two refusals an episode (the empty message, the image-only one); a step's are counted by
    # the end at least (a generator's counts reach the store a second at a time).
    refused = summary["rejected"].get("generator.empty_context", 0)
    assert refused >= 2 * 4 * 2, summary["rejected"]
    # A reward past float32's range ends its episode agent_error at the generator; its group is
    # set aside (skipped) by the trainer, and no such reward reaches the trainer's door.
    assert generator_counts(run_dir, "episodes_agent_error") >= 1
    assert summary["ledger"]["skipped"] >= 1
    assert not summary["rejected"].get("trainer.bad_reward"), "no such reward reaches the trainer"
