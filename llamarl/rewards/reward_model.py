"""A Hugging Face reward model as a scorer in the reward role (`task.reward_model`).

Any local sequence-classification directory with one label (the kind TRL's RewardTrainer and
OpenRLHF write) scores each (prompt, completion) pair: through the tokenizer's chat template as
a user turn and the assistant's answer when it has one, as a text pair otherwise. A group is
scored in one padded batch; the model pools the last token that is not padding.

The training reward is `reward_model_weight` x the model's score, plus the verifier's (or
`task.reward`'s) reward unless `task.reward_model_only`. The held-out score is the verifier's
(or `task.reward`'s).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from transformers.utils import logging as hf_logging

from llamarl.errors import ConfigError
from llamarl.protocol import RolloutGroup
from llamarl.rewards.scorers import GroupScorer, Scores, group_texts, with_part


def check_reward_model_path(path: str) -> None:
    """ConfigError naming task.reward_model unless it is a local model directory."""
    if not (Path(path) / "config.json").is_file():
        raise ConfigError(
            f"task.reward_model {path}: not a local model directory (no config.json); point it at "
            "a saved sequence-classification model"
        )


class RewardModelScorer:
    def __init__(self, path: str, weight: float, base: GroupScorer | None) -> None:
        check_reward_model_path(path)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        hf_logging.disable_progress_bar()
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = AutoModelForSequenceClassification.from_pretrained(
            path, local_files_only=True, dtype=torch.float32
        )
        if self.model.config.num_labels != 1:
            raise ConfigError(
                f"task.reward_model {path}: a reward model has one label, this one has {self.model.config.num_labels}"
            )
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.tokenizer.padding_side = "right"
        self.model.eval()
        self.weight = weight
        self.base = base
        self.name = f"reward_model:{Path(path).name}" + (f"+{base.name}" if base else "")

    def model_scores(self, prompt: str, completions: list[str]) -> np.ndarray:
        """float32 (n,): the reward model's score of each completion of `prompt`."""
        tokenizer = self.tokenizer
        if tokenizer.chat_template:
            texts = [
                str(
                    tokenizer.apply_chat_template(
                        [
                            {"role": "user", "content": prompt},
                            {"role": "assistant", "content": completion},
                        ],
                        tokenize=False,
                    )
                )
                for completion in completions
            ]
            batch = tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")
        else:
            batch = tokenizer([prompt] * len(completions), completions, padding=True, return_tensors="pt")
        with torch.inference_mode():
            logits = self.model(**batch).logits
        return logits[:, 0].float().numpy()

    def score(self, group: RolloutGroup) -> Scores:
        part = self.weight * self.model_scores(group.prompt, group_texts(group))
        return with_part(self.base, group, "reward_model", part)
