"""The trainer's forward pass over prompt groups, without redundant work.

The n completions of a group share one prompt. It is computed once, with a KV cache that its n
completions then attend to (`cache.batch_repeat_interleave`), instead of n times. Groups are
bucketed by prompt length, so prompts are never padded and no attention mask is built; inside a
micro-batch, completions are right-padded only to the longest real completion in it (causal
attention keeps that padding out of every real token's result, and the loss masks it). Groups are
sorted by completion length before micro-batches are cut at `max_tokens`, so little padding is
left. Gradients flow through the shared prompt's keys and values, so the loss and gradients equal
the plain one-pass computation (`sampling.token_logprobs`; tested within 1e-5).

Sharing the prompt takes every block twice (the prompt, then the completions), and the prompt's
backward runs last. Sharded training (FSDP2) frees a block's whole gradients once its backward is
done, so there the prompt is repeated for each completion instead (`share_prompt=False`): one
pass, each block's gradients reduce-scattered and freed in turn, at the cost of computing the
prompt n times.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from llamarl.engine.kv_cache import cache_of, with_cache
from llamarl.engine.model import Policy
from llamarl.engine.sampling import ban_eos, completion_logprobs


@dataclass(frozen=True)
class TrainGroup:
    """One prompt and its n scored completions, as the trainer uses them."""

    prompt_ids: torch.Tensor
    """(P,) prompt token ids, unpadded."""
    completion_ids: torch.Tensor
    """(n, L) right-padded completion ids."""
    completion_mask: torch.Tensor
    """(n, L) 1 on the tokens in the loss: the model's (not an environment's, not padding)."""
    behaviour_logprobs: torch.Tensor
    """(n, L) log mu recorded by the generator (0 on padding)."""
    rewards: torch.Tensor
    """(n,) one reward per completion."""

    @property
    def width(self) -> int:
        """Up to the last token in the loss, at least 1: a group whose completions are all out
        of the loss (overlong shaping's drop) still takes a one-token pass, masked. An episode's
        environment tokens before that are in the pass but not in the loss."""
        in_loss = self.completion_mask.any(0).nonzero()
        return int(in_loss[-1]) + 1 if in_loss.numel() else 1


def micro_batches(groups: Sequence[TrainGroup], max_tokens: int) -> list[list[int]]:
    """Indices of `groups` cut into micro-batches: one prompt length each, similar completion
    lengths together, at most `max_tokens` prompt + completion tokens (at least one group)."""
    by_length: dict[int, list[int]] = {}
    for index, group in enumerate(groups):
        by_length.setdefault(int(group.prompt_ids.shape[0]), []).append(index)
    batches: list[list[int]] = []
    for length, members in sorted(by_length.items()):
        members.sort(key=lambda i: groups[i].width)
        current: list[int] = []
        tokens = 0
        for index in members:
            cost = groups[index].completion_ids.shape[0] * (length + groups[index].width)
            if current and tokens + cost > max_tokens:
                batches.append(current)
                current, tokens = [], 0
            current.append(index)
            tokens += cost
        batches.append(current)
    return batches


@dataclass(frozen=True)
class MicroBatch:
    """Groups of one prompt length stacked for one forward pass."""

    prompt_ids: torch.Tensor
    """(G, P)."""
    completion_ids: torch.Tensor
    """(G * n, W), W the longest real completion of these groups."""
    completion_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    num_samples: int

    def to(self, device: torch.device) -> MicroBatch:
        """The batch's tensors on `device` (itself when they are there already)."""
        move = {
            name: getattr(self, name).to(device)
            for name in ("prompt_ids", "completion_ids", "completion_mask", "behaviour_logprobs")
        }
        return dataclasses.replace(self, **move)


def stack(groups: Sequence[TrainGroup]) -> MicroBatch:
    num_samples = int(groups[0].completion_ids.shape[0])
    if any(g.completion_ids.shape[0] != num_samples for g in groups):
        raise ValueError("every group of a micro-batch needs the same number of samples")
    width = max(g.width for g in groups)

    def fit(tensor: torch.Tensor) -> torch.Tensor:
        """Cut or right-pad (with zeros) a group's (n, L) tensor to the batch's width."""
        return torch.nn.functional.pad(tensor[:, :width], (0, max(0, width - tensor.shape[1])))

    return MicroBatch(
        prompt_ids=torch.stack([g.prompt_ids for g in groups]),
        completion_ids=torch.cat([fit(g.completion_ids) for g in groups]),
        completion_mask=torch.cat([fit(g.completion_mask) for g in groups]),
        behaviour_logprobs=torch.cat([fit(g.behaviour_logprobs) for g in groups]),
        num_samples=num_samples,
    )


def _record_once(cache: Any) -> Any:
    """The prompt pass's cache: each layer's keys and values are kept on its first call; a call
    again (the block recomputed in backward, with activation checkpointing) sees no past and
    keeps nothing, as the first pass did."""
    keep, seen = cache.update, set()

    def update(
        keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if layer_idx in seen:
            return keys, values
        seen.add(layer_idx)
        return keep(keys, values, layer_idx, *args, **kwargs)

    cache.update = update
    return cache


def _read_only(cache: Any) -> Any:
    """The completions' cache (a copy sharing the prompt's keys and values): each layer gets
    the prompt's keys and values with its own appended, kept nowhere, so a recomputed block sees
    what its first pass saw."""
    cache = copy.copy(cache)

    def update(
        keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        layer = cache.layers[layer_idx]
        return torch.cat([layer.keys, keys], dim=-2), torch.cat([layer.values, values], dim=-2)

    cache.update = update
    return cache


def grouped_logprobs(
    policy: Policy,
    batch: MicroBatch,
    temperature: float = 1.0,
    min_new_tokens: int = 0,
    share_prompt: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi and entropy of every completion token (G * n, W): each prompt computed once and
    shared by its completions, or repeated before each (one pass through every block)."""
    width = batch.completion_ids.shape[1]
    if share_prompt:
        logits = _shared_prompt_logits(policy.model, batch)
    else:
        prompts = batch.prompt_ids.repeat_interleave(batch.num_samples, dim=0)
        ids = torch.cat([prompts, batch.completion_ids[:, : width - 1]], dim=1)
        logits = policy.model(input_ids=ids, use_cache=False, logits_to_keep=width).logits
    logits = ban_eos(logits.float() / temperature, policy.eos_id, min_new_tokens)
    return completion_logprobs(logits, batch.completion_ids, batch.completion_mask)


def _shared_prompt_logits(model: Any, batch: MicroBatch) -> torch.Tensor:
    """(G * n, W) logits from the prompts' pass, with a cache, and the completions' pass (none
    for one-token completions: never for FSDP ranks, whose passes must match one another's)."""
    prompt = model(
        input_ids=batch.prompt_ids, use_cache=True, logits_to_keep=1, **with_cache(_record_once(DynamicCache()))
    )
    logits = prompt.logits[:, -1:].repeat_interleave(batch.num_samples, dim=0)
    width = batch.completion_ids.shape[1]
    if width == 1:
        return logits
    cache = cache_of(prompt)
    cache.batch_repeat_interleave(batch.num_samples)
    rest = model(input_ids=batch.completion_ids[:, : width - 1], use_cache=True, **with_cache(_read_only(cache)))
    return torch.cat([logits, rest.logits], dim=1)
