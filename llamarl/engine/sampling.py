"""Batched sampling with a KV cache that records the behaviour log-prob of every sampled token.

Prompts are left-padded; position ids come from the attention mask (cumsum - 1) so a padded row
sees the same positions as an unpadded one, exactly as `token_logprobs` computes them again in the
trainer. Each token is drawn from softmax(logits / temperature), truncated to the top-p nucleus
and renormalised; the recorded log mu is the log-prob under that truncated, renormalised
distribution, i.e. the distribution that was really sampled. The trainer's pi is the tempered
distribution without truncation, so for a token inside the nucleus log mu = log pi - log(kept
mass) >= log pi; with top_p = 1 the two are equal. AIPO's ratio pi/mu is then <= 1 for truncated
steps, which down-weights them rather than blowing up.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llamarl.engine.kv_cache import cache_of, with_cache
from llamarl.engine.model import Policy
from llamarl.errors import EmptyContextError


@dataclass(frozen=True)
class SampleBatch:
    """Completions for B rows (prompt i repeated num_samples times, in order)."""

    prompt_ids: torch.Tensor
    """(B, P) left-padded prompt ids."""
    prompt_mask: torch.Tensor
    """(B, P) 1 on real prompt tokens."""
    completion_ids: torch.Tensor
    """(B, L) right-padded completion ids (EOS included when produced)."""
    completion_mask: torch.Tensor
    """(B, L) 1 on real completion tokens."""
    logprobs: torch.Tensor
    """(B, L) behaviour log-prob of each completion token (0 on padding)."""


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row) :] = torch.tensor(row)
            mask[i, width - len(row) :] = 1
    return ids, mask


def check_contexts(prompts: list[list[int]]) -> None:
    """EmptyContextError unless every context holds a token: alone, an empty one cannot be
    computed at all; beside others it would be sampled from an attention row of nothing."""
    empty = [i for i, row in enumerate(prompts) if not row]
    if empty or not prompts:
        raise EmptyContextError(f"contexts {empty[:8]} of {len(prompts)} hold no tokens: nothing to sample from")


def positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


def sampling_logprobs(logits: torch.Tensor, temperature: float, top_p: float, ban: int | None = None) -> torch.Tensor:
    """Log-probs of the distribution sampled from: tempered, top-p truncated, renormalised.
    `ban` is a token id excluded before that (EOS before `min_new_tokens`)."""
    logits = logits.float() / temperature
    if ban is not None:
        logits = logits.index_fill(-1, torch.tensor([ban], device=logits.device), float("-inf"))
    logp = torch.log_softmax(logits, dim=-1)
    if top_p >= 1.0:
        return logp
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    mass_before = sorted_logp.exp().cumsum(-1) - sorted_logp.exp()
    drop_sorted = mass_before >= top_p  # always keeps the most likely token
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)


def ban_eos(logits: torch.Tensor, eos_id: int, min_new_tokens: int) -> torch.Tensor:
    """(B, L, V) completion logits with EOS removed at the first `min_new_tokens` positions, as
    sampling removed it, so the trainer's pi is the distribution the generator drew from."""
    if min_new_tokens <= 0:
        return logits
    early = torch.arange(logits.shape[1], device=logits.device) < min_new_tokens
    banned = torch.zeros(logits.shape[1:], dtype=torch.bool, device=logits.device)
    banned[early, eos_id] = True
    return logits.masked_fill(banned, float("-inf"))


@torch.no_grad()
def sample(
    policy: Policy,
    prompts: list[list[int]],
    *,
    num_samples: int,
    max_new_tokens: int,
    min_new_tokens: int = 0,
    temperature: float = 1.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    greedy: bool = False,
) -> SampleBatch:
    """n samples of each prompt; `greedy` takes the argmax instead (evaluation).

    Each prompt is computed once and its keys/values are shared by its n samples. Without
    left padding (prompts of one length) no attention mask is built at all.
    """
    check_contexts(prompts)
    model, eos_id = policy.model, policy.eos_id
    device = model.device  # the batch is built there; the result comes back on the CPU
    group_ids, group_mask = (t.to(device) for t in left_pad(prompts, policy.pad_id))
    padded = not bool(group_mask.all())
    out = model(
        input_ids=group_ids,
        attention_mask=group_mask if padded else None,
        position_ids=positions(group_mask),
        use_cache=True,
    )
    cache = cache_of(out)
    cache.batch_repeat_interleave(num_samples)
    logits = out.logits[:, -1].repeat_interleave(num_samples, dim=0)
    prompt_ids = group_ids.repeat_interleave(num_samples, dim=0)
    prompt_mask = group_mask.repeat_interleave(num_samples, dim=0)
    batch = prompt_ids.shape[0]
    next_position = positions(prompt_mask)[:, -1] + 1
    mask = prompt_mask
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    tokens, logps, alive = [], [], []
    for step in range(max_new_tokens):
        ban = eos_id if step < min_new_tokens else None
        logp = sampling_logprobs(logits, temperature, top_p, ban)
        if greedy:
            token = logp.argmax(-1)
        else:
            token = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
        token_logp = logp.gather(-1, token[:, None]).squeeze(-1)
        alive.append(~finished)
        tokens.append(torch.where(finished, policy.pad_id, token))
        logps.append(torch.where(finished, 0.0, token_logp))
        finished = finished | (token == eos_id)
        if step + 1 == max_new_tokens or bool(finished.all()):
            break
        if padded:
            mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype, device=device)], 1)
        out = model(
            input_ids=tokens[-1][:, None],
            attention_mask=mask if padded else None,
            position_ids=next_position[:, None],
            use_cache=True,
            **with_cache(cache),
        )
        cache, logits = cache_of(out), out.logits[:, -1]
        next_position = next_position + 1
    return SampleBatch(
        prompt_ids=prompt_ids.cpu(),
        prompt_mask=prompt_mask.cpu(),
        completion_ids=torch.stack(tokens, dim=1).cpu(),
        completion_mask=torch.stack(alive, dim=1).long().cpu(),
        logprobs=torch.stack(logps, dim=1).float().cpu(),
    )


def token_logprobs(
    policy: Policy,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
    min_new_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi and entropy of each completion token under the tempered policy (differentiable),
    from one padded forward pass over prompt + completion: the plain computation that the
    trainer's shared-prompt path (`llamarl.engine.grouped`) must equal."""
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    mask = torch.cat([prompt_mask, completion_mask], dim=1)
    logits = policy.model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
    width = prompt_ids.shape[1]
    logits = logits[:, width - 1 : -1].float() / temperature
    logits = ban_eos(logits, policy.eos_id, min_new_tokens)
    return completion_logprobs(logits, completion_ids, completion_mask)


def completion_logprobs(
    logits: torch.Tensor, completion_ids: torch.Tensor, completion_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi of each completion token and the entropy of each position, from tempered (B, L, V)
    logits; both are 0 on padding (a banned token's -inf never turns into NaN)."""
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, completion_ids[..., None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all.masked_fill(torch.isinf(logp_all), 0.0)).sum(-1)
    real = completion_mask.bool()
    return torch.where(real, logp, 0.0), torch.where(real, entropy, 0.0)
