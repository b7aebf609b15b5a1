"""An environment written with OpenEnv's own API (`examples/openenv_calculator.py`) trains end to
end through llamarl's adapter (`llamarl.agents.openenv`): a short sync run of
`configs/episodes/openenv_calculator.yaml` whose episodes are the environment's turns, ended by
the environment, rewarded by it."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from llamarl.config import parse_config
from llamarl.launch.sync_run import run_sync

REPO = Path(__file__).resolve().parents[2]


def test_an_openenv_environment_trains_through_the_adapter(tmp_path: Path) -> None:
    tree = yaml.safe_load((REPO / "configs" / "episodes" / "openenv_calculator.yaml").read_text())
    tree["run_dir"] = str(tmp_path / "run")
    tree["trainer"] |= {"num_steps": 2, "eval_every": 2, "sft_steps": 10}
    tree["task"]["num_eval"] = 4
    summary = run_sync(parse_config(tree))
    assert summary["steps"] == 2
    entries = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").open()]
    episodes = [episode for entry in entries for episode in entry["samples"]]
    assert episodes and all(e["end"] == "done" for e in episodes)
    for episode in episodes:  # the model's turns, each answered by the environment but the last
        roles = [turn["role"] for turn in episode["turns"]]
        assert roles[0] == "assistant" and roles[-1] == "assistant"
        replies = [t["content"] for t in episode["turns"] if t["role"] == "user"]
        assert all(r.startswith("<result>") for r in replies)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    trained = [m for m in metrics if "loss" in m]
    assert len(trained) == 2 and all(m["loss"] == m["loss"] for m in trained)
