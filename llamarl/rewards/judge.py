"""A generative judge as a scorer in the reward role (`task.judge`).

A local causal LM is prompted once per completion with `task.judge.template`, filled with the
group's prompt, the completion, the reference answer and the data row's fields (the first three
win over a row field of the same name), wrapped in its tokenizer's chat template as a user turn
when `chat_template` is set. A group's prompts are decoded greedily in one left-padded batch;
the first number of each answer, clipped to 0..max_score and divided by it, times `weight` is
the judge's part of the reward (component `judge`), added to another scorer's unless
`task.judge.only`.

The judge never takes a reward worker down: an answer with no number scores 0 and is counted
(`judge_unparsed`); a template field the row lacks, or a failed generation, scores 0 and is
counted (`judge_error`) and logged. What can be told before a run (the model directory, a
template that needs a row where there is none) is a ConfigError naming the field.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import structlog
import torch
from huggingface_hub import try_to_load_from_cache
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from llamarl.config import JudgeConfig, template_fields
from llamarl.errors import ConfigError
from llamarl.protocol import RolloutGroup
from llamarl.rewards.scorers import GroupScorer, Scores, group_texts, with_part

log = structlog.get_logger(__name__)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
GROUP_FIELDS = frozenset({"prompt", "completion", "answer"})
"""What the template is always offered; a data row's fields come on top when there is one."""


def grade(answer: str, max_score: float) -> float | None:
    """The first number in the judge's `answer`, clipped to 0..max_score and divided by it (so
    0..1); None when the answer holds no number."""
    found = NUMBER.search(answer)
    if found is None:
        return None
    return min(max(float(found.group()), 0.0), max_score) / max_score


def check_judge(config: JudgeConfig) -> None:
    """ConfigError naming task.judge.model unless it is a local model directory or a model in
    the local Hugging Face cache."""
    if (Path(config.model) / "config.json").is_file() or _cached(config.model):
        return
    raise ConfigError(
        f"task.judge.model {config.model}: not a local model directory (no config.json) nor a "
        "model in the local Hugging Face cache; point it at a saved causal LM"
    )


def _cached(model: str) -> bool:
    try:
        found = try_to_load_from_cache(model, "config.json")
    except ValueError:  # not a hub id at all (an absolute path, say)
        return False
    return isinstance(found, str)


def _load(model: str) -> tuple[Any, Any]:
    """(tokenizer, model in eval mode, float32) from `model`, local files only."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
        causal_lm = AutoModelForCausalLM.from_pretrained(model, local_files_only=True, dtype=torch.float32)
    except (OSError, ValueError, KeyError) as err:  # refused as config, in one line
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"task.judge.model {model}: not a loadable causal LM ({first})") from None
    return tokenizer, causal_lm.eval()


class JudgeScorer:
    def __init__(
        self,
        config: JudgeConfig,
        base: GroupScorer | None,
        row_of: Callable[[int], dict[str, Any]] | None = None,
        on_problem: Callable[[str, str], None] | None = None,
    ) -> None:
        check_judge(config)
        unknown = template_fields(config.template) - GROUP_FIELDS
        if row_of is None and unknown:
            raise ConfigError(
                "task.judge.template: "
                + ", ".join("{" + name + "}" for name in sorted(unknown))
                + " needs a data row, and this scorer has none; use {prompt}, {completion}, "
                "{answer}"
            )
        self.tokenizer, self.model = _load(config.model)
        if config.chat_template and not self.tokenizer.chat_template:
            raise ConfigError(f"task.judge.chat_template: the tokenizer of {config.model} has none")
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"
        self.config = config
        self.base = None if config.only else base
        self.row_of = row_of
        self.on_problem = on_problem or (lambda reason, detail: None)
        self.name = f"judge:{Path(config.model).name}" + (f"+{self.base.name}" if self.base else "")

    def judge_prompts(self, group: RolloutGroup, texts: list[str]) -> list[str] | None:
        """The template filled for each of `group`'s completions `texts`; None (counted) when
        the row lacks one of its fields or a field does not fit its format."""
        row = self.row_of(group.prompt_index) if self.row_of is not None else {}
        try:
            return [
                self.config.template.format_map(
                    {**row, "prompt": group.prompt, "completion": text, "answer": group.answer}
                )
                for text in texts
            ]
        except KeyError as err:
            self._failed(f"template field {err} is not in the row of prompt {group.prompt_index}")
        except (AttributeError, IndexError, ValueError) as err:
            self._failed(f"template raised {type(err).__name__}: {err}")
        return None

    def answers(self, prompts: list[str]) -> list[str]:
        """The judge's greedy answer to each prompt, decoded in one left-padded batch."""
        tokenizer = self.tokenizer
        batch = tokenizer(
            self.model_texts(prompts),
            padding=True,
            return_tensors="pt",
            add_special_tokens=not self.config.chat_template,
        )
        with torch.inference_mode():
            output = self.model.generate(
                **batch,
                do_sample=False,
                max_new_tokens=self.config.max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
        new_tokens = output[:, batch["input_ids"].shape[1] :]
        return [str(text) for text in tokenizer.batch_decode(new_tokens, skip_special_tokens=True)]

    def model_texts(self, prompts: list[str]) -> list[str]:
        """What the judge reads: each prompt as a user turn of its chat template (with the
        assistant's turn opened) when `chat_template` is set, else the prompt itself."""
        if not self.config.chat_template:
            return prompts
        return [
            str(
                self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": prompt}],
                    tokenize=False,
                    add_generation_prompt=True,
                )
            )
            for prompt in prompts
        ]

    def judge_scores(self, group: RolloutGroup) -> np.ndarray:
        """float32 (n,): the judge's 0..1 score of each completion of `group` (0 where it failed
        or its answer held no number, each counted)."""
        texts = group_texts(group)
        scores = np.zeros(len(texts), dtype=np.float32)
        prompts = self.judge_prompts(group, texts)
        if prompts is None:
            return scores
        try:
            answers = self.answers(prompts)
        except Exception as err:  # a judge that fails scores 0; the worker keeps running
            self._failed(f"generation raised {type(err).__name__}: {err}")
            return scores
        for index, answer in enumerate(answers):
            value = grade(answer, self.config.max_score)
            if value is None:
                self.on_problem("judge_unparsed", f"{self.name}: no number in {answer[:100]!r}")
            else:
                scores[index] = value
        return scores

    def score(self, group: RolloutGroup) -> Scores:
        part = self.config.weight * self.judge_scores(group)
        return with_part(self.base, group, "judge", part)

    def _failed(self, detail: str) -> None:
        log.warning("judge failed", judge=self.name, error=detail[:200])
        self.on_problem("judge_error", f"{self.name}: {detail[:200]}")
