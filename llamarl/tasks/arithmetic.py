"""Seeded multi-digit addition: `a+b=` -> `a+b`. The held-out pairs never appear in training."""

from __future__ import annotations

import random

from llamarl.tasks.base import Example


class ArithmeticTask:
    def __init__(self, num_digits: int, num_eval: int, seed: int) -> None:
        self.limit = 10**num_digits
        if num_eval * 4 > self.limit**2:
            raise ValueError(
                f"num_eval {num_eval} leaves too few training pairs for {num_digits} digits"
            )
        self.seed = seed
        rng = random.Random(f"eval-{seed}")
        held: set[tuple[int, int]] = set()
        while len(held) < num_eval:
            held.add((rng.randrange(self.limit), rng.randrange(self.limit)))
        self._eval_pairs = sorted(held)
        self._held = held

    @staticmethod
    def _example(index: int, a: int, b: int) -> Example:
        return Example(index=index, prompt=f"{a}+{b}=", answer=str(a + b))

    def train_item(self, index: int) -> Example:
        rng = random.Random(f"train-{self.seed}-{index}")
        while True:
            pair = (rng.randrange(self.limit), rng.randrange(self.limit))
            if pair not in self._held:
                return self._example(index, *pair)

    def eval_items(self) -> list[Example]:
        return [self._example(i, a, b) for i, (a, b) in enumerate(self._eval_pairs)]
