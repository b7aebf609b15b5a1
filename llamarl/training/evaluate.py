"""Held-out accuracy: greedy completions of the held-out prompts, scored by the task verifier,
with the first few completions kept to show."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llamarl.engine.model import Policy
from llamarl.engine.rollouts import completion_texts
from llamarl.engine.sampling import sample
from llamarl.observe.progress import Listener, Progress
from llamarl.rewards.verifiers import Verifier
from llamarl.tasks import Example

SAMPLES = 3
"""Held-out prompts whose completions an evaluation shows (the first ones, the same each time)."""


@dataclass(frozen=True)
class Evaluation:
    accuracy: float
    samples: list[dict[str, Any]]
    """prompt, completion, answer and reward of the first SAMPLES held-out prompts."""


def evaluate(
    policy: Policy,
    examples: Sequence[Example],
    verifier: Verifier,
    max_new_tokens: int,
    min_new_tokens: int = 0,
    batch_size: int = 100,
    listener: Listener | None = None,
) -> Evaluation:
    correct = 0.0
    samples: list[dict[str, Any]] = []
    progress = Progress("evaluation", len(examples), transient=True, listener=listener)
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        prompts = [policy.encode_prompt(e.prompt) for e in chunk]
        batch = sample(
            policy, prompts, num_samples=1, max_new_tokens=max_new_tokens,
            min_new_tokens=min_new_tokens, greedy=True,
        )  # fmt: skip
        texts = completion_texts(policy, batch)
        rewards = [verifier(t, e.answer) for t, e in zip(texts, chunk, strict=True)]
        correct += sum(rewards)
        for text, example, reward in zip(texts, chunk, rewards, strict=True):
            if len(samples) < SAMPLES:
                samples.append({"prompt": example.prompt, "completion": text,
                                "answer": example.answer, "reward": reward})  # fmt: skip
        progress.update(len(chunk))
    progress.close(accuracy=round(correct / len(examples), 4))
    return Evaluation(correct / len(examples), samples)
