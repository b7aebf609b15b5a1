"""Short runs under `llamarl run` (async, and `--mode sync`) with an agent or a reward that a
hostile or careless user wrote: a request whose context renders to no tokens is refused (400) and
counted, a reward outside float32's range ends its episode `agent_error`, and a group the trainer
refuses for its reward is set aside (its ticket ended `skipped`) instead of being redone forever.
Each run must finish, train every step's groups once and balance its ledger; a reward that is
always out of range ends the run naming it, rather than drawing prompts forever."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from llamarl.config import parse_config
from llamarl.errors import ConfigError
from llamarl.launch.sync_run import run_sync
from llamarl.roles import trainer as trainer_module
from tests.integration.async_helpers import SMALL_RUN, check_finished_run, launch, write_config

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
def test_an_empty_context_is_refused_and_counted_and_the_run_finishes(tmp_path: Path, mode: list[str]) -> None:
    environment = {"kind": "agent", "agent": "tests.user_agents:empty_first", "max_tokens": 12}
    summary, run_dir = finished_run(tmp_path, mode, environment=environment)
    # Two refusals an episode (the empty message, the image-only one); a step's are counted by
    # the end at least (a generator's counts reach the store a second at a time).
    refused = summary["rejected"].get("generator.empty_context", 0)
    assert refused >= 2 * 4 * 2, summary["rejected"]
    assert generator_counts(run_dir, "episodes_agent_error") == 0


@pytest.mark.parametrize("mode", MODES)
def test_a_reward_outside_float32_ends_its_episode_and_the_run_finishes(tmp_path: Path, mode: list[str]) -> None:
    environment = {"kind": "agent", "agent": "tests.user_agents:huge_reward", "max_tokens": 12}
    summary, run_dir = finished_run(tmp_path, mode, environment=environment)
    assert generator_counts(run_dir, "episodes_agent_error") >= 1
    assert summary["ledger"]["skipped"] >= 1
    assert not summary["rejected"].get("trainer.bad_reward"), "no such reward reaches the trainer"


@pytest.mark.parametrize("mode", MODES)
def test_a_group_refused_for_its_reward_is_set_aside_not_redone(tmp_path: Path, mode: list[str]) -> None:
    task = {"num_eval": 4, "reward": "tests.user_rewards:huge_for_some"}
    summary, run_dir = finished_run(tmp_path, mode, task=task)
    refused = summary["rejected"].get("trainer.bad_reward", 0)
    trainer = json.loads((run_dir / "timers" / "trainer.json").read_text())
    # A late copy of a ticket already set aside is refused again, and ends nothing more.
    assert refused >= trainer["groups_bad_reward"] == summary["ledger"]["skipped"] >= 1


def test_a_reward_always_out_of_range_ends_the_run_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trainer_module, "ENV_FAILURES_IN_A_ROW", 3)
    tree = {
        **SMALL_RUN,
        "run_id": "always-huge",
        "run_dir": str(tmp_path / "run"),
        "task": {"num_eval": 2, "reward": "tests.user_rewards:always_huge"},
        "trainer": {"prompts_per_step": 2, "num_steps": 2, "eval_every": 2, "sft_steps": 0},
    }
    with pytest.raises(ConfigError, match="rewards of 3 groups in a row were past float32's range .*task.reward"):
        run_sync(parse_config(tree))
