"""Held-out accuracy: greedy completions of the held-out prompts, scored by the task verifier."""

from __future__ import annotations

from collections.abc import Sequence

from llamarl.engine.model import Policy
from llamarl.engine.sampling import sample
from llamarl.rewards.verifiers import Verifier
from llamarl.rollouts import completion_texts
from llamarl.tasks import Example


def accuracy(
    policy: Policy,
    examples: Sequence[Example],
    verifier: Verifier,
    max_new_tokens: int,
    min_new_tokens: int = 0,
    batch_size: int = 100,
) -> float:
    correct = 0.0
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        prompts = [policy.encode_prompt(e.prompt) for e in chunk]
        batch = sample(
            policy, prompts, num_samples=1, max_new_tokens=max_new_tokens,
            min_new_tokens=min_new_tokens, greedy=True,
        )  # fmt: skip
        texts = completion_texts(policy, batch)
        correct += sum(verifier(t, e.answer) for t, e in zip(texts, chunk, strict=True))
    return correct / len(examples)
