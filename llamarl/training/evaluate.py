"""Held-out accuracy: greedy completions (or episodes) of the held-out prompts, scored by the
task's scorer (its verifier, or `task.reward`), with the first few kept to show. An episode is
judged by its model's last turn; its first turn's accuracy is kept too (for `retry`: right at
the first try). Evaluations of parts of the held-out set (and of the named evaluation sets,
`llamarl.training.eval_sets`) combine with `merged`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from llamarl.engine.episodes import PlaysEpisodes, Sampling
from llamarl.engine.model import Policy
from llamarl.engine.rollouts import completion_texts
from llamarl.engine.sampling import sample
from llamarl.observe.progress import Listener, Progress
from llamarl.rewards.scorers import TextScorer
from llamarl.tasks import Example
from llamarl.training.eval_sets import SetSums, add_sums

BATCH_SIZE = 100
"""Held-out prompts decoded at once."""
SAMPLES = 3
"""Held-out prompts whose completions an evaluation shows (the first ones, the same each time)."""


@dataclass(frozen=True)
class Evaluation:
    accuracy: float
    samples: list[dict[str, Any]]
    """prompt, completion, answer and reward of the first SAMPLES held-out prompts (an
    episode's: its turns, turn by turn, and why it ended)."""
    first_turn_accuracy: float | None = None
    """Episodes only: the verifier on the model's first turn."""
    num_prompts: int = 0
    """Held-out prompts the accuracy is over (a part of the set may have none)."""
    sets: dict[str, SetSums] = field(default_factory=dict)
    """The named evaluation sets' sums (`llamarl.training.eval_sets`)."""


def merged(parts: Sequence[Evaluation]) -> Evaluation:
    """The evaluation that `parts` (of one set of prompts, in order) make together: accuracies
    weighted by their prompts, the first part's samples, the sets' sums added."""
    total = sum(p.num_prompts for p in parts)

    def mean(values: list[float]) -> float:
        weighted = sum(v * p.num_prompts for v, p in zip(values, parts, strict=True))
        return weighted / total if total else 0.0

    firsts = [p.first_turn_accuracy for p in parts if p.num_prompts]
    first = None if not firsts or None in firsts else mean([p.first_turn_accuracy or 0.0 for p in parts])
    sets: dict[str, SetSums] = {}
    for part in parts:
        sets = add_sums(sets, part.sets)
    samples = next((p.samples for p in parts if p.samples), [])
    return Evaluation(mean([p.accuracy for p in parts]), samples, first, total, sets)


def evaluate(
    policy: Policy,
    examples: Sequence[Example],
    score: TextScorer,
    max_new_tokens: int,
    min_new_tokens: int = 0,
    batch_size: int = BATCH_SIZE,
    listener: Listener | None = None,
) -> Evaluation:
    correct = 0.0
    samples: list[dict[str, Any]] = []
    progress = Progress("evaluation", len(examples), transient=True, listener=listener)
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        prompts = [policy.encode_example(e) for e in chunk]
        batch = sample(
            policy,
            prompts,
            num_samples=1,
            max_new_tokens=max_new_tokens,
            min_new_tokens=min_new_tokens,
            greedy=True,
        )
        texts = completion_texts(policy, batch)
        rewards = [score(e, [t], [[]])[0] for t, e in zip(texts, chunk, strict=True)]
        correct += sum(rewards)
        for text, example, reward in zip(texts, chunk, rewards, strict=True):
            if len(samples) < SAMPLES:
                samples.append(
                    {"prompt": example.prompt, "completion": text, "answer": example.answer, "reward": reward}
                )
        progress.update(len(chunk))
    progress.close(accuracy=round(correct / len(examples), 4))
    return Evaluation(correct / len(examples), samples, num_prompts=len(examples))


def evaluate_episodes(
    runner: PlaysEpisodes,
    examples: Sequence[Example],
    score: TextScorer,
    max_turn_tokens: int,
    batch_size: int = BATCH_SIZE,
    listener: Listener | None = None,
) -> Evaluation:
    correct, first_right = 0.0, 0.0
    samples: list[dict[str, Any]] = []
    progress = Progress("evaluation", len(examples), transient=True, listener=listener)
    greedy = Sampling(max_turn_tokens, greedy=True)
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        for episode in runner.run(chunk, 1, greedy, version=lambda: -1):
            texts = episode.model_texts() or [""]
            example, turns = episode.example, episode.record()["turns"]
            reward = score(example, [texts[-1]], [turns])[0]
            correct += reward
            first_right += score(example, [texts[0]], [turns[:1]])[0]
            if len(samples) < SAMPLES:
                samples.append(
                    episode.record()
                    | {
                        "prompt": episode.example.prompt,
                        "completion": texts[-1],
                        "answer": episode.example.answer,
                        "reward": reward,
                    }
                )
        progress.update(len(chunk))
    accuracy = correct / len(examples)
    progress.close(accuracy=round(accuracy, 4))
    return Evaluation(accuracy, samples, first_right / len(examples), len(examples))
