"""Named evaluation sets (`evaluation.sets`): each its own prompts, scorer, number of samples
and temperature, reported as greedy accuracy (the mean greedy reward), pass@k and mean@k.

An evaluation adds up sums (`SetSums`) so that chunks of a set evaluated in different processes
(`llamarl.roles.held_out`) combine exactly; `set_metrics` turns the sums into the metrics
record's `eval/<name>/greedy`, `eval/<name>/pass@<k>` and `eval/<name>/mean@<n>`. pass@k is the
unbiased estimate from n samples of which c are solved (reward at least the set's
`pass_threshold`), 1 - C(n-c, k) / C(n, k), averaged over prompts (Chen et al., 2021).
Sampling is seeded from the run's seed, the set's name and the prompt's position in the set,
so a chunk gives the same completions wherever it runs.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from llamarl.engine.model import Policy
from llamarl.engine.rollouts import completion_texts
from llamarl.engine.sampling import sample
from llamarl.rewards.scorers import TextScorer
from llamarl.tasks import Example

SET_PREFIX = "eval/"
"""Where the sets' metrics are in a metrics record: `eval/<name>/<metric>`."""
SetSums = dict[str, float]
"""A set's sums over the prompts evaluated: `prompts`, `greedy`, `mean@<n>`, `pass@<k>`."""


@dataclass(frozen=True)
class EvalSet:
    """One named evaluation set, ready to evaluate."""

    name: str
    examples: list[Example]
    score: TextScorer
    num_samples: int
    """n samples a prompt for pass@k and mean@n (0: greedy only)."""
    temperature: float
    pass_at: tuple[int, ...]
    """The k of each pass@k reported (each at most num_samples)."""
    pass_threshold: float
    seed: int


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased chance that at least one of k samples drawn from n (c of them solved) is
    solved: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@{k} from {c} solved of {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def evaluate_set(
    policy: Policy,
    eval_set: EvalSet,
    first: int,
    examples: Sequence[Example],
    max_new_tokens: int,
    min_new_tokens: int = 0,
) -> SetSums:
    """The sums of `examples` (positions first, first + 1, ... of the set), decoded as the
    held-out prompts are (EOS banned before `min_new_tokens`)."""
    prompts = [policy.encode_example(e) for e in examples]
    greedy = sample(
        policy,
        prompts,
        num_samples=1,
        max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens,
        greedy=True,
    )
    texts = completion_texts(policy, greedy)
    sums: SetSums = {"prompts": float(len(examples))}
    sums["greedy"] = sum(eval_set.score(e, [t], [[]])[0] for e, t in zip(examples, texts, strict=True))
    n = eval_set.num_samples
    if not n:
        return sums
    seed = eval_set.seed * 1_000_003 + zlib.crc32(eval_set.name.encode()) + first
    generator = torch.Generator(device=policy.model.device).manual_seed(seed)
    batch = sample(
        policy,
        prompts,
        num_samples=n,
        max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens,
        temperature=eval_set.temperature,
        generator=generator,
    )
    texts = completion_texts(policy, batch)
    sums[f"mean@{n}"] = 0.0
    for k in eval_set.pass_at:
        sums[f"pass@{k}"] = 0.0
    for g, example in enumerate(examples):
        rewards = eval_set.score(example, texts[g * n : (g + 1) * n], [[]] * n)
        sums[f"mean@{n}"] += sum(rewards) / n
        solved = sum(r >= eval_set.pass_threshold for r in rewards)
        for k in eval_set.pass_at:
            sums[f"pass@{k}"] += pass_at_k(n, solved, k)
    return sums


def add_sums(total: dict[str, SetSums], part: dict[str, SetSums]) -> dict[str, SetSums]:
    """`total` with `part`'s sums added, set by set."""
    out = {name: dict(sums) for name, sums in total.items()}
    for name, sums in part.items():
        into = out.setdefault(name, {})
        for key, value in sums.items():
            into[key] = into.get(key, 0.0) + value
    return out


def set_metrics(sums: dict[str, SetSums]) -> dict[str, float]:
    """The metrics record's fields for each set's sums: every sum over the set's prompts."""
    return {
        f"{SET_PREFIX}{name}/{key}": value / each["prompts"]
        for name, each in sums.items()
        if each.get("prompts")
        for key, value in each.items()
        if key != "prompts"
    }
