"""Agents over the generators' OpenAI-compatible endpoint (`environment.kind: agent`) under
`llamarl run`, end to end over Redis, the broker and real worker processes: a generator SIGKILLed
in the middle of an agent's episode has its tickets reissued and each trained exactly once;
groups whose agent raised are set aside (ended `skipped`, counted) and the run goes on to finish
with a balanced ledger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_episodes_run import killed_run

pytestmark = pytest.mark.long  # a whole run of a minute or more: `make test-long`


def test_killed_generator_agents_are_reissued_and_raising_agents_set_aside(tmp_path: Path) -> None:
    environment = {"kind": "agent", "agent": "tests.user_agents:paced", "max_tokens": 12}
    summary, run_dir = killed_run(tmp_path, "agents", environment)
    # Prompts whose `a` is a multiple of 7 raise in their agent: set aside, never trained.
    trainer = json.loads((run_dir / "timers" / "trainer.json").read_text())
    assert summary["ledger"]["skipped"] == trainer["groups_env_error"] >= 1
    generator = json.loads((run_dir / "timers" / "generator-1.json").read_text())
    assert generator["episodes_agent_error"] >= 1 and generator["episode_turns"] > 0
