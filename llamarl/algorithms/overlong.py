"""Overlong shaping (DAPO): what a completion's length does to its reward or to its loss.

A completion cut off at the length limit was never finished, so its reward says little about
its answer. `penalty` adds a soft length penalty to the reward: 0 up to (1 - band) x
max_new_tokens tokens, then linear down to -penalty at max_new_tokens. `drop` leaves truncated
completions (max_new_tokens tokens without EOS) out of the loss instead; their rewards still
enter their group's baseline. Lengths count the completion's real tokens, EOS included.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llamarl.config import SamplingConfig


def length_penalty(lengths: np.ndarray, max_new_tokens: int, band: float, penalty: float) -> np.ndarray:
    """(n,) float32: 0 below the band, -penalty x (how far into the band) within it."""
    width = band * max_new_tokens
    into = (lengths.astype(np.float64) - (max_new_tokens - width)) / width
    return (-penalty * np.clip(into, 0.0, 1.0)).astype(np.float32)


def truncated(tokens: np.ndarray, lengths: np.ndarray, max_new_tokens: int, eos_id: int) -> np.ndarray:
    """(n,) bool: completions of (n, L) `tokens` that reached `max_new_tokens` without ending in
    EOS."""
    last = tokens[np.arange(tokens.shape[0]), np.maximum(lengths - 1, 0)]
    return (lengths >= max_new_tokens) & (last != eos_id)


@dataclass(frozen=True)
class OverlongShaping:
    """Overlong shaping as configured (`sampling.overlong` penalty or drop)."""

    mode: str
    max_new_tokens: int
    eos_id: int
    band: float
    penalty: float

    def rewards(self, rewards: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The rewards the advantages are computed from."""
        if self.mode != "penalty":
            return rewards
        return rewards + length_penalty(lengths, self.max_new_tokens, self.band, self.penalty)

    def in_loss(self, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """(n,) bool: the completions the loss takes in."""
        if self.mode != "drop":
            return np.ones(lengths.shape, dtype=bool)
        return ~truncated(tokens, lengths, self.max_new_tokens, self.eos_id)


def overlong_shaping(sampling: SamplingConfig, max_new_tokens: int, eos_id: int) -> OverlongShaping | None:
    """The shaping `sampling` asks for, for completions of at most `max_new_tokens` tokens of a
    tokenizer whose EOS is `eos_id`; None when it is off."""
    if sampling.overlong == "off":
        return None
    return OverlongShaping(sampling.overlong, max_new_tokens, eos_id, sampling.overlong_band, sampling.overlong_penalty)
