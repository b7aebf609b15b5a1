"""Seeded multi-digit addition (or multiplication, `operation="*"`). The held-out pairs never
appear in training.

Two formats. Plain: `a+b=` -> `a+b` (the answer alone). Worked (`show_work`): operands
zero-padded to `num_digits`, and the answer written out column by column from the right with
its carry, then the sum, zero-padded, after a final `=`:

    347+085=  ->  7+5+0=12 4+8+1=13 3+0+1=04 =0432

Every worked answer of one task has the same length, so completions are a fixed number of
tokens (`worked_length`), as a benchmark with equal work in every arm needs; the reward checks
only the number after the last `=` (verifier `final_int`).
"""

from __future__ import annotations

import random

from llamarl.tasks.base import Example


def worked_sum(a: int, b: int, num_digits: int) -> str:
    """The column-by-column working and the zero-padded sum, as the worked format writes it."""
    columns, carry = [], 0
    for place in range(num_digits):
        x, y = a // 10**place % 10, b // 10**place % 10
        total = x + y + carry
        columns.append(f"{x}+{y}+{carry}={total:02d}")
        carry = total // 10
    return " ".join(columns) + f" ={a + b:0{num_digits + 1}d}"


def worked_length(num_digits: int) -> int:
    """Characters (tokens of the char tokenizer) in every worked answer of `num_digits`."""
    return len(worked_sum(0, 0, num_digits))


class ArithmeticTask:
    def __init__(
        self,
        num_digits: int,
        num_eval: int,
        seed: int,
        show_work: bool = False,
        prompt_template: str | None = None,
        operation: str = "+",
    ) -> None:
        self.num_digits = num_digits
        self.operation = operation
        self.prompt_template = prompt_template
        self.limit = 10**num_digits
        self.show_work = show_work
        if num_eval * 4 > self.limit**2:
            raise ValueError(f"num_eval {num_eval} leaves too few training pairs for {num_digits} digits")
        self.seed = seed
        rng = random.Random(f"eval-{seed}")
        held: set[tuple[int, int]] = set()
        while len(held) < num_eval:
            held.add((rng.randrange(self.limit), rng.randrange(self.limit)))
        self._eval_pairs = sorted(held)
        self._held = held

    def _prompt(self, a: str, b: str) -> str:
        if self.prompt_template is None:
            return f"{a}{self.operation}{b}="
        return self.prompt_template.format(a=a, b=b)

    def _example(self, index: int, a: int, b: int) -> Example:
        answer = str(a * b if self.operation == "*" else a + b)
        row = {"a": a, "b": b, "answer": answer}
        if not self.show_work:
            prompt = self._prompt(str(a), str(b))
            return Example(index, prompt, answer, expression=f"{a}{self.operation}{b}", row=row)
        width = self.num_digits
        return Example(
            index=index,
            prompt=self._prompt(f"{a:0{width}d}", f"{b:0{width}d}"),
            answer=answer,
            solution=worked_sum(a, b, width),
            row=row,
        )

    def train_item(self, index: int) -> Example:
        rng = random.Random(f"train-{self.seed}-{index}")
        while True:
            pair = (rng.randrange(self.limit), rng.randrange(self.limit))
            if pair not in self._held:
                return self._example(index, *pair)

    def eval_items(self) -> list[Example]:
        return [self._example(i, a, b) for i, (a, b) in enumerate(self._eval_pairs)]
