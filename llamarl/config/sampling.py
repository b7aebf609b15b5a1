"""The `sampling` section: which scored groups and completions the trainer learns from, after
DAPO (arXiv 2503.14476): dynamic sampling (skip groups with no signal, draw others in their
place) and overlong shaping (a soft length penalty, or truncated completions left out of the
loss). Both are off by default; both act the same in async and sync runs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from llamarl.config.base import _Section, yaml_off


class SamplingConfig(_Section):
    dynamic_sampling: bool = False
    """Skip every group whose rewards (after overlong shaping) are all equal: both group
    baselines give it zero advantage. Its ticket ends `skipped` (not trained, not stale) and
    gives its slot in the admission gate back, so generators draw a new prompt in its place
    until the step holds trainer.prompts_per_step groups with signal (up to max_draws_factor)."""
    max_draws_factor: int = Field(3, ge=2, le=100)
    """The cap on dynamic sampling's draws: a step draws at most this many times
    trainer.prompts_per_step groups. Once (max_draws_factor - 1) x prompts_per_step groups have
    been skipped since the last step, the step is filled with the next groups whether they
    carry signal or not (as without dynamic sampling), so a run whose groups all agree still
    moves on."""
    overlong: Literal["off", "penalty", "drop"] = "off"
    """Overlong shaping. penalty: a completion within overlong_band of
    generation.max_new_tokens has a penalty added to its reward, rising linearly to
    -overlong_penalty at max_new_tokens. drop: truncated completions (max_new_tokens tokens, no
    EOS) are left out of the loss (their rewards still count in their group's baseline)."""
    overlong_band: float = Field(0.2, gt=0, le=1)
    """The penalty's band as a fraction of generation.max_new_tokens: no penalty up to
    (1 - band) x max_new_tokens tokens, the whole penalty at max_new_tokens."""
    overlong_penalty: float = Field(1.0, gt=0, le=100)
    """The penalty at max_new_tokens tokens, in reward units."""

    @field_validator("overlong", mode="before")
    @classmethod
    def _off(cls, value: object) -> object:
        return yaml_off(value)
