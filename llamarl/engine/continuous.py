"""Continuous batching: one running batch of sequences that prompts join and finished completions
leave between decode steps, so no sequence waits for the longest one of its batch.

The running batch keeps one key/value cache, left-padded to its longest row: a prompt that joins
is computed once (its keys/values shared by its n samples, as in `sample`), then its rows are
padded to the batch's width, or the batch to theirs, and appended. A row that ends (EOS or
`max_new_tokens`) leaves at once; columns that only padding is left in are cut away. The
attention mask and each row's own position ids make a padded row compute what it would alone, so
the behaviour log-probs are those the trainer computes again (`token_logprobs`).

Every token records the policy version that sampled it: the caller may swap the weights between
two `step`s (in-flight weight updates), and the rows go on with the new weights from their cached
keys/values. A group is returned once all its n rows have ended.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from llamarl.engine.kv_cache import cache_of, with_cache
from llamarl.engine.model import Policy
from llamarl.engine.sampling import SampleBatch, check_contexts, left_pad, positions, sampling_logprobs
from llamarl.errors import ConfigError


@dataclass(frozen=True)
class Sampler:
    """How tokens are drawn (as `sample`'s keyword arguments)."""

    num_samples: int
    max_new_tokens: int
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    generator: torch.Generator | None = None
    greedy: bool = False


@dataclass
class _Row:
    key: Hashable
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)


@dataclass
class _Group:
    prompt: list[int]
    rows: list[_Row]
    running: int


@dataclass(frozen=True)
class FinishedGroup:
    key: Hashable
    batch: SampleBatch
    """The group's n rows (its prompt unpadded, completions right-padded)."""
    versions: torch.Tensor
    """(n, L) the version that sampled each completion token; -1 on padding."""


def _layers(cache: DynamicCache) -> list[DynamicLayer]:
    """The cache's layers, each plain keys and values (a sliding-window or recurrent layer cannot
    be padded and cut as rows come and go)."""
    layers = list(cache.layers)
    if not all(type(layer) is DynamicLayer for layer in layers):
        kinds = sorted({type(layer).__name__ for layer in layers})
        raise ConfigError(
            f"generation.batching: continuous needs full key/value caches; this model's are "
            f"{', '.join(kinds)}: set generation.batching: static"
        )
    return layers  # type: ignore[return-value]


def _tensors(layer: DynamicLayer) -> tuple[torch.Tensor, torch.Tensor]:
    """A filled layer's (keys, values), each (rows, heads, columns, head size)."""
    assert layer.keys is not None and layer.values is not None
    return layer.keys, layer.values


def _pad_left(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """`tensor` with zeros prepended along `dim` (0-based from the end) up to `width`."""
    missing = width - tensor.shape[-1 - dim]
    if missing == 0:
        return tensor
    pad = [0, 0] * dim + [missing, 0]
    return F.pad(tensor, pad)


class RunningBatch:
    """Sequences being decoded together; `admit` adds prompts, `step` decodes one token."""

    def __init__(self, policy: Policy, sampler: Sampler) -> None:
        self.policy = policy
        self.sampler = sampler
        self.cache: DynamicCache | None = None
        self.mask = torch.zeros((0, 0), dtype=torch.long)
        self.next_position = torch.zeros(0, dtype=torch.long)
        self.logits = torch.zeros(0)
        self.rows: list[_Row] = []
        self.groups: dict[Hashable, _Group] = {}

    def __len__(self) -> int:
        """Rows being decoded."""
        return len(self.rows)

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    def free_groups(self, capacity: int) -> int:
        """How many more groups fit in `capacity` groups' rows: a group's place is its n rows,
        free once as many rows have ended, in whichever groups."""
        return max(0, capacity - -(-len(self.rows) // self.sampler.num_samples))

    def oldest_version(self, key: Hashable) -> int | None:
        """The version of group `key`'s oldest sampled token (None before its first)."""
        versions = [v for row in self.groups[key].rows for v in row.versions[:1]]
        return min(versions) if versions else None

    @torch.no_grad()
    def admit(self, prompts: Sequence[tuple[Hashable, list[int]]]) -> None:
        """Start n rows for each (key, prompt ids); keys must not be running already."""
        if not prompts:
            return
        check_contexts([p for _, p in prompts])
        for key, _ in prompts:
            if key in self.groups:
                raise ValueError(f"group {key!r} is already running")
        model, n = self.policy.model, self.sampler.num_samples
        device = model.device
        ids, mask = (t.to(device) for t in left_pad([p for _, p in prompts], self.policy.pad_id))
        padded = not bool(mask.all())
        out = model(
            input_ids=ids,
            attention_mask=mask if padded else None,
            position_ids=positions(mask),
            use_cache=True,
            logits_to_keep=1,
        )
        cache = cache_of(out)
        cache.batch_repeat_interleave(n)
        mask = mask.repeat_interleave(n, dim=0)
        self._append(cache, mask, positions(mask)[:, -1] + 1, out.logits[:, -1].repeat_interleave(n, dim=0))
        for key, prompt in prompts:
            rows = [_Row(key) for _ in range(n)]
            self.rows.extend(rows)
            self.groups[key] = _Group(list(prompt), rows, n)

    def _append(
        self, cache: DynamicCache, mask: torch.Tensor, next_position: torch.Tensor, logits: torch.Tensor
    ) -> None:
        if self.cache is None:
            self.cache, self.mask, self.next_position, self.logits = (
                cache,
                mask,
                next_position,
                logits,
            )
            return
        width = max(self.mask.shape[1], mask.shape[1])
        for mine, theirs in zip(_layers(self.cache), _layers(cache), strict=True):
            mine.keys, mine.values = (
                torch.cat([_pad_left(a, width, 1), _pad_left(b, width, 1)])
                for a, b in zip(_tensors(mine), _tensors(theirs), strict=True)
            )
        self.mask = torch.cat([_pad_left(self.mask, width, 0), _pad_left(mask, width, 0)])
        self.next_position = torch.cat([self.next_position, next_position])
        self.logits = torch.cat([self.logits, logits])

    def drop(self, key: Hashable) -> int:
        """Stop group `key` and forget what it sampled (its prompt may be admitted again); how
        many tokens that was."""
        self._keep([i for i, row in enumerate(self.rows) if row.key != key])
        return sum(len(row.tokens) for row in self.groups.pop(key).rows)

    def _keep(self, kept: list[int]) -> None:
        """Only rows `kept` stay; columns left with padding alone are cut away."""
        if len(kept) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in kept]
        if not kept:
            self.cache = None
            self.mask = self.mask[:0, :0]
            return
        index = torch.tensor(kept, device=self.mask.device)
        self.mask, self.next_position = self.mask[index], self.next_position[index]
        self.logits = self.logits[index]
        start = int(self.mask.any(0).long().argmax())
        assert self.cache is not None
        for layer in _layers(self.cache):
            layer.keys, layer.values = (t[index, :, start:] for t in _tensors(layer))
        self.mask = self.mask[:, start:]

    @torch.no_grad()
    def step(self, version: int) -> list[FinishedGroup]:
        """Sample one token for every row (recorded as `version`'s); the groups whose rows have
        all ended, in the order they ended."""
        if not self.rows:
            return []
        sampler, eos = self.sampler, self.policy.eos_id
        logits = self.logits
        counts = torch.tensor([len(row.tokens) for row in self.rows], device=logits.device)
        if sampler.min_new_tokens > 0:
            early = counts < sampler.min_new_tokens
            logits = logits.clone()
            logits[early, eos] = float("-inf")
        logp = sampling_logprobs(logits, sampler.temperature, sampler.top_p)
        if sampler.greedy:
            token = logp.argmax(-1)
        else:
            token = torch.multinomial(logp.exp(), 1, generator=sampler.generator).squeeze(-1)
        token_logp = logp.gather(-1, token[:, None]).squeeze(-1)
        ended = (token == eos) | (counts + 1 >= sampler.max_new_tokens)
        finished = []
        for row, t, lp, end in zip(self.rows, token.tolist(), token_logp.tolist(), ended.tolist(), strict=True):
            row.tokens.append(t)
            row.logprobs.append(lp)
            row.versions.append(version)
            if end:
                group = self.groups[row.key]
                group.running -= 1
                if group.running == 0:
                    finished.append(self._finish(row.key, group))
        kept = [i for i, end in enumerate(ended.tolist()) if not end]
        self._keep(kept)
        if kept:
            self._decode(token[kept])
        return finished

    def _decode(self, tokens: torch.Tensor) -> None:
        """One forward pass of the rows' newest tokens, extending their cache."""
        device = self.mask.device
        ones = torch.ones((len(tokens), 1), dtype=self.mask.dtype, device=device)
        self.mask = torch.cat([self.mask, ones], 1)
        padded = not bool(self.mask.all())
        out = self.policy.model(
            input_ids=tokens[:, None],
            attention_mask=self.mask if padded else None,
            position_ids=self.next_position[:, None],
            use_cache=True,
            **with_cache(self.cache),
        )
        self.cache, self.logits = cache_of(out), out.logits[:, -1]
        self.next_position = self.next_position + 1

    def _finish(self, key: Hashable, group: _Group) -> FinishedGroup:
        del self.groups[key]
        rows, pad = group.rows, self.policy.pad_id
        width = max(len(row.tokens) for row in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        logprobs = torch.zeros((len(rows), width))
        versions = torch.full((len(rows), width), -1, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            size = len(row.tokens)
            ids[i, :size] = torch.tensor(row.tokens)
            logprobs[i, :size] = torch.tensor(row.logprobs)
            versions[i, :size] = torch.tensor(row.versions)
            mask[i, :size] = 1
        prompt = torch.tensor(group.prompt, dtype=torch.long).repeat(len(rows), 1)
        batch = SampleBatch(
            prompt_ids=prompt,
            prompt_mask=torch.ones_like(prompt),
            completion_ids=ids,
            completion_mask=mask,
            logprobs=logprobs,
        )
        return FinishedGroup(key, batch, versions)
