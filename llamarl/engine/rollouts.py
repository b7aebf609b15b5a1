"""Moving rollouts between tensors and messages: pack samples into RolloutGroup messages, score
them into ScoredGroup messages, and turn scored groups back into the learner's tensors.

The sync mode uses exactly these functions too, so it exercises the same path as the workers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from llamarl.algorithms.overlong import OverlongShaping
from llamarl.engine.episodes import Episode
from llamarl.engine.grouped import TrainGroup
from llamarl.engine.model import Policy
from llamarl.engine.sampling import SampleBatch
from llamarl.protocol import RolloutGroup, ScoredGroup, TypedArray
from llamarl.protocol.episodes import parse_episodes
from llamarl.rewards.scorers import GroupScorer
from llamarl.tasks import Example


def completion_texts(policy: Policy, batch: SampleBatch) -> list[str]:
    """Each completion's text, without EOS and padding (one batched decode)."""
    eos = policy.eos_id
    rows = [
        [t for t, m in zip(ids, mask, strict=True) if m and t != eos]
        for ids, mask in zip(batch.completion_ids.tolist(), batch.completion_mask.tolist(), strict=True)
    ]
    return [str(t) for t in policy.tokenizer.batch_decode(rows, skip_special_tokens=True)]


def _array(tensor: torch.Tensor, dtype: type) -> TypedArray:
    return TypedArray.from_numpy(tensor.detach().cpu().numpy().astype(dtype))


def _texts(texts: Sequence[str]) -> TypedArray:
    """Completion texts as they travel: UTF-8, joined by NUL."""
    return TypedArray.from_numpy(np.frombuffer("\0".join(texts).encode(), dtype=np.uint8))


def _group(example: Example, ticket_id: int, attempt: int, **arrays: Any) -> RolloutGroup:
    """The group of ticket `ticket_id`'s attempt, with its example's fields and `arrays`."""
    return RolloutGroup(
        rollout_id=f"{ticket_id}.{attempt}",
        ticket_id=ticket_id,
        attempt=attempt,
        prompt_index=example.index,
        prompt=example.prompt,
        answer=example.answer,
        **arrays,
    )


def pack_groups(
    policy: Policy,
    batch: SampleBatch,
    examples: Sequence[Example],
    tickets: Sequence[tuple[int, int]],
    policy_version: int | torch.Tensor,
) -> list[RolloutGroup]:
    """One RolloutGroup per prompt; `tickets` holds (ticket_id, attempt) per example;
    `policy_version` is the version of every token, or each token's (a tensor shaped like the
    batch's completions)."""
    n = batch.completion_ids.shape[0] // len(examples)
    texts = completion_texts(policy, batch)
    groups = []
    for g, (example, (ticket_id, attempt)) in enumerate(zip(examples, tickets, strict=True)):
        rows = slice(g * n, (g + 1) * n)
        mask = batch.completion_mask[rows]
        prompt = batch.prompt_ids[g * n][batch.prompt_mask[g * n].bool()]
        sampled_by = policy_version[rows] if isinstance(policy_version, torch.Tensor) else policy_version
        versions = torch.where(mask.bool(), sampled_by, -1)
        groups.append(
            _group(
                example,
                ticket_id,
                attempt,
                prompt_tokens=_array(prompt, np.int32),
                completion_tokens=_array(batch.completion_ids[rows], np.int32),
                completion_lengths=_array(mask.sum(-1), np.int32),
                behaviour_logprobs=_array(batch.logprobs[rows], np.float32),
                token_versions=_array(versions, np.int32),
                completions=_texts(texts[rows]),
            )
        )
    return groups


def score_group(group: RolloutGroup, scorer: GroupScorer) -> ScoredGroup:
    """The group with its rewards: the scorer's, or for an episode the reward its environment
    gave, where it gave one."""
    scores = scorer.score(group)
    rewards, name = scores.rewards, scorer.name
    if group.episodes:
        given = [record["reward"] for record in episode_records(group)]
        rewards = np.array([s if g is None else g for s, g in zip(rewards, given, strict=True)], dtype=np.float32)
        name = "environment" if None not in given else f"environment+{name}"
    return ScoredGroup(
        group=group,
        rewards=TypedArray.from_numpy(rewards),
        scorer=name,
        components=scores.components,
    )


def component_means(batch: Sequence[ScoredGroup]) -> dict[str, float]:
    """`reward/<name>`: the mean over `batch`'s groups of each named part of their rewards (a
    group without the part counts as 0)."""
    names = sorted({name for scored in batch for name in scored.components})
    return {f"reward/{name}": sum(s.components.get(name, 0.0) for s in batch) / len(batch) for name in names}


def pack_episodes(
    episodes: Sequence[Episode],
    examples: Sequence[Example],
    tickets: Sequence[tuple[int, int]],
) -> list[RolloutGroup]:
    """One RolloutGroup per prompt from its n episodes (in order): their tokens after the
    prompt right-padded, the environment's with version -1 and log-prob 0."""
    n = len(episodes) // len(examples)
    width = max(1, max(len(e.tokens) for e in episodes))
    groups = []
    for g, (example, (ticket_id, attempt)) in enumerate(zip(examples, tickets, strict=True)):
        rows = episodes[g * n : (g + 1) * n]
        tokens = np.zeros((n, width), dtype=np.int32)
        logprobs = np.zeros((n, width), dtype=np.float32)
        versions = np.full((n, width), -1, dtype=np.int32)
        for i, episode in enumerate(rows):
            size = len(episode.tokens)
            tokens[i, :size], logprobs[i, :size] = episode.tokens, episode.logprobs
            versions[i, :size] = episode.versions
        finals = [(e.model_texts() or [""])[-1] for e in rows]
        lengths = np.array([len(e.tokens) for e in rows], dtype=np.int32)
        groups.append(
            _group(
                example,
                ticket_id,
                attempt,
                prompt_tokens=TypedArray.from_numpy(np.array(rows[0].prompt, dtype=np.int32)),
                completion_tokens=TypedArray.from_numpy(tokens),
                completion_lengths=TypedArray.from_numpy(lengths),
                behaviour_logprobs=TypedArray.from_numpy(logprobs),
                token_versions=TypedArray.from_numpy(versions),
                completions=_texts(finals),
                episodes=json.dumps([e.record() for e in rows]),
            )
        )
    return groups


def episode_records(group: RolloutGroup) -> list[dict[str, Any]]:
    """The group's episode records (turns, reward, end); ProtocolError when malformed."""
    return parse_episodes(group.episodes, group.completion_lengths.shape[0])


def oldest_version(group: RolloutGroup) -> int:
    versions = group.token_versions.to_numpy()
    real = versions[versions >= 0]
    return int(real.min()) if real.size else -1


def shaped_rewards(scored: ScoredGroup, overlong: OverlongShaping | None = None) -> np.ndarray:
    """The group's rewards after overlong shaping: those its advantages are computed from."""
    rewards = scored.rewards.to_numpy().copy()
    if overlong is None:
        return rewards
    return overlong.rewards(rewards, scored.group.completion_lengths.to_numpy())


def train_group(scored: ScoredGroup, overlong: OverlongShaping | None = None) -> TrainGroup:
    """The tensors the learner needs from one scored group (prompt kept unpadded), shaped by
    `overlong` (a completion it leaves out of the loss has no real tokens)."""
    group = scored.group
    tokens = torch.from_numpy(group.completion_tokens.to_numpy().astype(np.int64))
    lengths = torch.from_numpy(group.completion_lengths.to_numpy().astype(np.int64))
    real = torch.arange(tokens.shape[1])[None, :] < lengths[:, None]
    # The loss covers the model's tokens only: an environment's (version -1) are context.
    mask = (real & torch.from_numpy(group.token_versions.to_numpy() >= 0)).long()
    if overlong is not None:
        kept = overlong.in_loss(tokens.numpy(), lengths.numpy())
        mask = mask * torch.from_numpy(kept)[:, None]
    behaviour = torch.from_numpy(group.behaviour_logprobs.to_numpy().copy())
    return TrainGroup(
        prompt_ids=torch.from_numpy(group.prompt_tokens.to_numpy().astype(np.int64)),
        completion_ids=torch.where(real, tokens, 0),
        completion_mask=mask,
        behaviour_logprobs=torch.where(mask.bool(), behaviour, 0.0),
        rewards=torch.from_numpy(shaped_rewards(scored, overlong)),
    )
