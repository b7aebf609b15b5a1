"""A Hugging Face reward model as the reward role's scorer: a real (tiny, random) sequence-
classification model saved to disk, loaded from its directory and run on rollout groups."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import LlamaForSequenceClassification

from llamarl.bus import MemoryHub
from llamarl.config import parse_config
from llamarl.engine.tokenizer import build_char_tokenizer
from llamarl.errors import ConfigError
from llamarl.launch.local import preflight
from llamarl.protocol import TypedArray
from llamarl.rewards.reward_model import RewardModelScorer
from llamarl.roles import build
from llamarl.store import MemoryStore
from llamarl.topics import ROLLOUTS, SCORED
from tests.factories import rollout_group
from tests.memory_runtime import memory_runtime
from tests.tiny_llama import tiny_llama_config

COMPLETIONS = ["46", "47 is my answer", "forty-six, I think"]


def save_reward_model(directory: Path, num_labels: int = 1, chat_template: str | None = None) -> Path:
    tokenizer = build_char_tokenizer()
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    config = tiny_llama_config(tokenizer, 128, num_labels=num_labels)
    torch.manual_seed(0)
    LlamaForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def group_of(completions: list[str]):  # noqa: ANN201 - a RolloutGroup
    group = rollout_group(num_samples=len(completions))
    data = np.frombuffer("\0".join(completions).encode(), dtype=np.uint8)
    return type(group)(**{**group.__dict__, "completions": TypedArray.from_numpy(data)})


@pytest.mark.parametrize("chat_template", [None, "{% for m in messages %}{{ m['content'] }}|{% endfor %}"])
def test_a_group_scored_in_one_padded_batch_matches_each_completion_scored_alone(
    tmp_path: Path, chat_template: str | None
) -> None:
    scorer = RewardModelScorer(str(save_reward_model(tmp_path, chat_template=chat_template)), weight=1.0, base=None)
    batched = scorer.model_scores("12+34=", COMPLETIONS)
    alone = [scorer.model_scores("12+34=", [c])[0] for c in COMPLETIONS]
    np.testing.assert_allclose(batched, alone, rtol=1e-5, atol=1e-6)
    assert len(set(np.round(batched, 6))) == len(COMPLETIONS), "scores depend on the completion"


def test_the_reward_role_adds_the_weighted_model_score_to_the_verifier(tmp_path: Path) -> None:
    model_dir = save_reward_model(tmp_path / "rm")
    config = parse_config(
        {
            "run_id": "rm",
            "run_dir": str(tmp_path / "run"),
            "task": {"verifier": "exact_int", "reward_model": str(model_dir), "reward_model_weight": 2.5},
        }
    )
    hub = MemoryHub("rm")
    runtime = memory_runtime("reward", config, "reward-0", MemoryStore(), hub)
    role = build.reward(runtime)
    sink = hub.client("trainer").consume(SCORED)
    hub.client("generator").push(ROLLOUTS, group_of(COMPLETIONS), policy_version=0)
    assert role.score_waiting(timeout_ms=5000) == 1
    envelope = sink.recv(5000)
    assert envelope is not None
    model_scores = RewardModelScorer(str(model_dir), 1.0, None).model_scores("12+34=", COMPLETIONS)
    expected = 2.5 * model_scores + np.array([1.0, 0.0, 0.0])
    np.testing.assert_allclose(envelope.payload.rewards.to_numpy(), expected, rtol=1e-5)
    assert envelope.payload.scorer == "reward_model:rm+exact_int"


def test_bad_reward_models_are_refused_before_a_run_and_when_loaded(tmp_path: Path) -> None:
    missing = parse_config({"task": {"reward_model": str(tmp_path / "nothing")}})
    with pytest.raises(ConfigError, match="task.reward_model .*nothing: not a local model directory"):
        preflight(missing, "sync")
    two_labels = save_reward_model(tmp_path / "classifier", num_labels=2)
    with pytest.raises(ConfigError, match="a reward model has one label, this one has 2"):
        RewardModelScorer(str(two_labels), 1.0, None)
    with pytest.raises(ConfigError, match="reward_model_only needs a reward_model"):
        parse_config({"task": {"reward_model_only": True}})
