"""A model of the user's own is never warm-started unless the config asks, and `llamarl run`'s
start-up summary says what will run: the warm start or none, the layout, what the run keeps and
what it evaluates."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llamarl.config import ModelConfig, parse_config
from llamarl.engine.model import build_policy, save_policy
from llamarl.errors import ConfigError
from llamarl.launch.startup import startup_summary
from llamarl.tasks import make_prompt_set
from llamarl.training.sft import starting_policy

SMALL = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32}


def test_the_default_config_with_a_model_path_runs_no_warm_start(tmp_path: Path) -> None:
    saved = build_policy(ModelConfig(**SMALL), seed=1)
    save_policy(saved, tmp_path / "mine")
    config = parse_config({"model": {"path": str(tmp_path / "mine")}, "task": {"num_digits": 1, "num_eval": 4}})
    assert config.trainer.sft_steps == 0
    policy = starting_policy(config, make_prompt_set(config.task, config.seed))
    for name, weight in saved.model.state_dict().items():
        assert torch.equal(policy.model.state_dict()[name], weight), f"{name} was trained"
    summary = startup_summary(config, "colocated")
    assert "(no warm start), async, layout colocated" in summary.splitlines()[0]
    assert "--resume, the Redis ledger" in summary


def test_only_the_built_model_is_warm_started_by_default_and_a_set_value_wins(
    tmp_path: Path,
) -> None:
    built = parse_config({})
    assert built.trainer.sft_steps == 300
    assert "warm start: 300 supervised steps first" in startup_summary(built, "split")
    assert parse_config({"trainer": {"sft_steps": 0}}).trainer.sft_steps == 0
    asked = parse_config({"model": {"path": str(tmp_path)}, "trainer": {"sft_steps": 5}})
    assert asked.trainer.sft_steps == 5
    overridden = parse_config({"model": {"path": str(tmp_path)}}, environ={"LLAMARL__TRAINER__SFT_STEPS": "7"})
    assert overridden.trainer.sft_steps == 7


def test_the_summary_names_every_evaluation_set_and_what_one_process_keeps() -> None:
    config = parse_config(
        {
            "task": {"reward": "my_rewards:score"},
            "evaluation": {
                "sets": [
                    {"name": "adds", "path": "adds.jsonl", "num_samples": 4, "pass_at": [1, 4]},
                    {
                        "name": "hard",
                        "path": "hard.jsonl",
                        "verifier": "final_int",
                        "max_prompts": 50,
                    },
                ]
            },
        }
    )
    lines = startup_summary(config, "one_process").splitlines()
    assert "layout one_process (every role in this process, taking turns)" in lines[0]
    assert lines[1].startswith("  keeps: a checkpoint every 20 steps (the last 2), --resume, the Redis ledger")
    assert "greedy, my_rewards:score" in lines[2]
    assert lines[3] == (
        "    set adds: adds.jsonl, greedy, pass@1, pass@4 and mean@4 at temperature 1, my_rewards:score"
    )
    assert lines[4] == "    set hard: the first 50 rows of hard.jsonl, greedy, final_int"


def test_evaluation_sets_are_refused_in_an_episode_run() -> None:
    with pytest.raises(ConfigError, match="evaluation.sets, environment.kind: evaluation sets are"):
        parse_config(
            {
                "environment": {"kind": "calculator", "tools": ["calculator"]},
                "model": {"extra_characters": '<>/{}":abcdeilmnortuclator'},
                "evaluation": {"sets": [{"name": "x", "path": "x.jsonl"}]},
            }
        )
