"""The run config's `evaluation` section: named evaluation sets besides the task's held-out
prompts, each with its own file, scorer, number of samples and temperature."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llamarl.config.base import FieldConflict, _Section


class EvalSetConfig(_Section):
    """One evaluation set: its prompts are read like the task's (`task.prompt_field`,
    `task.answer_field`, `task.prompt_template`, chat rows) from its own file."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,40}$")
    """Names the set's metrics: `eval/<name>/greedy`, `eval/<name>/pass@<k>`,
    `eval/<name>/mean@<n>`."""
    path: str = Field(min_length=1)
    """The set's data file or directory (the formats `task.path` takes)."""
    verifier: Literal["exact_int", "final_int", "gsm8k", "math", "format"] | None = None
    """Scores the set's completions; null: the task's (`task.reward`, else `task.verifier`)."""
    reward: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    """A reward function of your own for this set, as `task.reward` (in place of verifier)."""
    num_samples: int = Field(0, ge=0, le=1024)
    """n completions sampled a prompt for pass@k and mean@n (0: greedy accuracy only)."""
    temperature: float = Field(1.0, gt=0, le=10)
    """Sampling temperature of those n completions."""
    pass_at: list[int] | None = None
    """The k of each pass@k reported (each 1..num_samples); null: [num_samples]."""
    pass_threshold: float = 1.0
    """A sampled completion counts as solved for pass@k when its reward is at least this."""
    max_prompts: int | None = Field(None, ge=1, le=1_000_000)
    """Evaluate the file's first this many rows only (null: all)."""

    @model_validator(mode="after")
    def _fields_agree(self) -> EvalSetConfig:
        if self.verifier is not None and self.reward is not None:
            raise FieldConflict(("verifier", "reward"), "a set is scored by one of them")
        if self.pass_at is not None:
            if not self.num_samples:
                raise FieldConflict(("pass_at", "num_samples"), "pass@k needs num_samples")
            wrong = [k for k in self.pass_at if not 1 <= k <= self.num_samples]
            if wrong:
                raise FieldConflict(
                    ("pass_at", "num_samples"),
                    f"pass@{wrong[0]} needs 1 <= k <= num_samples ({self.num_samples})",
                )
        return self

    @property
    def ks(self) -> tuple[int, ...]:
        """The k of each pass@k reported."""
        if not self.num_samples:
            return ()
        return tuple(self.pass_at or [self.num_samples])


class EvaluationConfig(_Section):
    sets: list[EvalSetConfig] = Field(default_factory=list, max_length=32)
    """Named evaluation sets, evaluated with the held-out prompts (every `trainer.eval_every`
    steps, before RL and after the last step) and by `llamarl eval`."""

    @model_validator(mode="after")
    def _names_unique(self) -> EvaluationConfig:
        names = [s.name for s in self.sets]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise FieldConflict(("sets",), f"set name {twice[0]!r} is used twice")
        return self
