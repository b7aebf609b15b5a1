"""Moving rollouts between tensors and messages: pack samples into RolloutGroup messages, score
them into ScoredGroup messages, and collate scored groups back into one padded training batch.

The sync mode uses exactly these functions too, so it exercises the same path as the workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from llamarl.engine.model import Policy
from llamarl.engine.sampling import SampleBatch, left_pad
from llamarl.protocol import RolloutGroup, ScoredGroup, TypedArray
from llamarl.rewards.verifiers import Verifier
from llamarl.tasks import Example


@dataclass(frozen=True)
class TrainBatch:
    """G groups of n completions, flattened to B = G * n rows."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    rewards: torch.Tensor
    """(G, n)."""
    token_versions: torch.Tensor
    """(B, L) policy version of each token (-1 on padding)."""


def completion_texts(policy: Policy, batch: SampleBatch) -> list[str]:
    texts: list[str] = []
    for ids, mask in zip(batch.completion_ids, batch.completion_mask, strict=True):
        kept = [int(t) for t, m in zip(ids, mask, strict=True) if m and int(t) != policy.eos_id]
        texts.append(str(policy.tokenizer.decode(kept, skip_special_tokens=True)))
    return texts


def _array(tensor: torch.Tensor, dtype: type) -> TypedArray:
    return TypedArray.from_numpy(tensor.detach().cpu().numpy().astype(dtype))


def pack_groups(
    policy: Policy,
    batch: SampleBatch,
    examples: Sequence[Example],
    tickets: Sequence[tuple[int, int]],
    policy_version: int,
) -> list[RolloutGroup]:
    """One RolloutGroup per prompt; `tickets` holds (ticket_id, attempt) per example."""
    n = batch.completion_ids.shape[0] // len(examples)
    texts = completion_texts(policy, batch)
    groups = []
    for g, (example, (ticket_id, attempt)) in enumerate(zip(examples, tickets, strict=True)):
        rows = slice(g * n, (g + 1) * n)
        mask = batch.completion_mask[rows]
        prompt = batch.prompt_ids[g * n][batch.prompt_mask[g * n].bool()]
        versions = torch.where(mask.bool(), policy_version, -1)
        joined = "\0".join(texts[rows]).encode()
        groups.append(
            RolloutGroup(
                rollout_id=f"{ticket_id}.{attempt}",
                ticket_id=ticket_id,
                attempt=attempt,
                prompt_index=example.index,
                prompt=example.prompt,
                answer=example.answer,
                prompt_tokens=_array(prompt, np.int32),
                completion_tokens=_array(batch.completion_ids[rows], np.int32),
                completion_lengths=_array(mask.sum(-1), np.int32),
                behaviour_logprobs=_array(batch.logprobs[rows], np.float32),
                token_versions=_array(versions, np.int32),
                completions=TypedArray.from_numpy(np.frombuffer(joined, dtype=np.uint8)),
            )
        )
    return groups


def score_group(group: RolloutGroup, verifier: Verifier, scorer: str) -> ScoredGroup:
    texts = group.completions.data.decode("utf-8", "replace").split("\0")
    rewards = np.array([verifier(text, group.answer) for text in texts], dtype=np.float32)
    return ScoredGroup(group=group, rewards=TypedArray.from_numpy(rewards), scorer=scorer)


def oldest_version(group: RolloutGroup) -> int:
    versions = group.token_versions.to_numpy()
    real = versions[versions >= 0]
    return int(real.min()) if real.size else -1


def collate(scored: Sequence[ScoredGroup], pad_id: int) -> TrainBatch:
    """Re-pad groups of different prompt and completion lengths into one batch."""
    prompts: list[list[int]] = []
    completions: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    logps: list[np.ndarray] = []
    versions: list[np.ndarray] = []
    for item in scored:
        group = item.group
        tokens = group.completion_tokens.to_numpy()
        prompts += [group.prompt_tokens.to_numpy().tolist()] * tokens.shape[0]
        completions += list(tokens)
        lengths += list(group.completion_lengths.to_numpy())
        logps += list(group.behaviour_logprobs.to_numpy())
        versions += list(group.token_versions.to_numpy())
    prompt_ids, prompt_mask = left_pad(prompts, pad_id)
    width = max(len(row) for row in completions)
    rows = len(completions)
    completion_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((rows, width), dtype=torch.long)
    behaviour = torch.zeros((rows, width))
    token_versions = torch.full((rows, width), -1, dtype=torch.long)
    for i in range(rows):
        length = int(lengths[i])
        completion_ids[i, :length] = torch.from_numpy(completions[i][:length].astype(np.int64))
        completion_mask[i, :length] = 1
        behaviour[i, :length] = torch.from_numpy(logps[i][:length].copy())
        token_versions[i, :length] = torch.from_numpy(versions[i][:length].astype(np.int64))
    rewards = torch.stack([torch.from_numpy(item.rewards.to_numpy().copy()) for item in scored])
    return TrainBatch(
        prompt_ids, prompt_mask, completion_ids, completion_mask, behaviour, rewards, token_versions
    )
