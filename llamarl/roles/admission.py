"""The trainer's door: a scored group is checked before it may be buffered, so one poisoned or
malformed rollout (a bug, a bad generator, a hostile sender) cannot crash the trainer or reach its
weights. The wire schema already holds the types; this checks what the trainer relies on:

- shapes agree: n completions of L tokens in tokens, log-probs and versions; n rewards; lengths
  within [0, L];
- every prompt and completion token id is inside the model's vocabulary;
- every behaviour log-prob of a real token is finite and not above 0; every reward is finite;
- no real token claims a policy version the trainer has not published yet (or below 0); only
  an episode has tokens of version -1 (its environment's), and those carry no log-prob;
- an episode group's records parse (`llamarl.protocol.episodes`).

A refused group raises `ProtocolError` naming the reason; the trainer counts it and leaves its
ticket open, so the ticket's lease lapses and another generator redoes it, unless the reason is
its reward (`bad_reward`: the same scorer would give it again): that group is set aside, its
ticket ended `skipped`, never redone forever.
"""

from __future__ import annotations

import numpy as np

from llamarl.errors import ProtocolError
from llamarl.protocol import ScoredGroup
from llamarl.protocol.episodes import parse_episodes


def check_scored(scored: ScoredGroup, vocab_size: int, policy_version: int) -> None:
    group = scored.group
    tokens = group.completion_tokens.to_numpy()
    logprobs = group.behaviour_logprobs.to_numpy()
    versions = group.token_versions.to_numpy()
    lengths = group.completion_lengths.to_numpy()
    rewards = scored.rewards.to_numpy()
    prompt = group.prompt_tokens.to_numpy()
    if tokens.ndim != 2 or logprobs.shape != tokens.shape or versions.shape != tokens.shape:
        raise ProtocolError(
            "bad_shape", f"tokens {tokens.shape}, log-probs {logprobs.shape}, versions {versions.shape}"
        )
    num_samples, width = tokens.shape
    if lengths.shape != (num_samples,) or rewards.shape != (num_samples,) or prompt.ndim != 1:
        raise ProtocolError(
            "bad_shape", f"lengths {lengths.shape}, rewards {rewards.shape} for {num_samples} completions"
        )
    if prompt.size == 0 or lengths.min(initial=0) < 0 or lengths.max(initial=0) > width:
        raise ProtocolError("bad_length", f"prompt {prompt.size} tokens, lengths {lengths}")
    real = np.arange(width)[None, :] < lengths[:, None]
    for name, ids in (("prompt", prompt), ("completion", tokens[real])):
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ProtocolError("token_out_of_vocab", f"{name} token ids outside [0, {vocab_size})")
    chosen = logprobs[real]
    if not np.isfinite(chosen).all() or (chosen > 1e-4).any():
        raise ProtocolError("bad_logprob", "behaviour log-probs must be finite and <= 0")
    if not np.isfinite(rewards).all():
        raise ProtocolError("bad_reward", "rewards must be finite")
    made_by = versions[real]
    if made_by.size and (made_by.min() < -1 or made_by.max() > policy_version):
        raise ProtocolError(
            "bad_version", f"tokens of versions {made_by.min()}..{made_by.max()}, trainer at {policy_version}"
        )
    if (logprobs[real & (versions < 0)] != 0).any():
        raise ProtocolError("bad_logprob", "a token the model did not write has a log-prob")
    if group.episodes:
        parse_episodes(group.episodes, num_samples)
    elif made_by.size and made_by.min() < 0:
        raise ProtocolError("bad_version", "a single-turn completion has a token of version -1")
