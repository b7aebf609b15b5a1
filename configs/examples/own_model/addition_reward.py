"""The example's reward: 1.0 when the last number of the answer is the row's `sum`, else 0.0.
Named in config.yaml as `addition_reward:reward`; llamarl imports it where the reward workers
run, so this folder must be on PYTHONPATH. It also scores the held-out prompts and the
evaluation set, so their accuracies are its mean."""

import re

NUMBER = re.compile(r"-?\d+")


def reward(completion: str, row: dict) -> float:
    """`row` is the data row the prompt came from, every field: {"a", "b", "sum"}."""
    numbers = NUMBER.findall(completion)
    return float(bool(numbers) and int(numbers[-1]) == row["sum"])
