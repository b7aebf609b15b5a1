"""The running batch on a vLLM engine: what `llamarl.engine.continuous.RunningBatch` does for
the native engine, with vLLM's scheduler deciding which sequences run in each step.

A claimed prompt becomes one vLLM request of n samples; `step` runs one engine step and records
each new token with the version the engine holds, so with in-flight updates a sequence's later
tokens may be newer than its first. A group is finished once its n samples have all ended, and
`drop` aborts a group's request (the generator restarts a group that fell too far behind).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import Any

import torch

from llamarl.engine.continuous import FinishedGroup, Sampler
from llamarl.engine.sampling import check_contexts
from llamarl.engine.vllm_engine import VllmEngine, completions_batch, token_logprobs


@dataclass
class _Sample:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    ended: bool = False


@dataclass
class _Request:
    key: Hashable
    prompt: list[int]
    samples: list[_Sample]

    @property
    def running(self) -> int:
        return sum(not s.ended for s in self.samples)


class VllmBatch:
    """Groups being sampled by a vLLM engine; `admit` adds prompts, `step` runs one engine step."""

    def __init__(self, engine: VllmEngine, sampler: Sampler, pad_id: int) -> None:
        self.engine = engine
        self.sampler = sampler
        self.pad_id = pad_id
        self.requests: dict[str, _Request] = {}
        """vLLM request id -> the group it samples."""
        self.ids: dict[Hashable, str] = {}
        """group key -> its request id."""
        self._serial = count()

    def __len__(self) -> int:
        """Samples still being decoded."""
        return sum(r.running for r in self.requests.values())

    @property
    def num_groups(self) -> int:
        return len(self.requests)

    def free_groups(self, capacity: int) -> int:
        """How many more groups fit in `capacity` groups' samples (as RunningBatch counts)."""
        return max(0, capacity - -(-len(self) // self.sampler.num_samples))

    def oldest_version(self, key: Hashable) -> int | None:
        """The version of group `key`'s oldest sampled token (None before its first)."""
        request = self.requests[self.ids[key]]
        versions = [s.versions[0] for s in request.samples if s.versions]
        return min(versions) if versions else None

    def admit(self, prompts: Sequence[tuple[Hashable, list[int]]]) -> None:
        """Start n samples of each (key, prompt ids); keys must not be running already."""
        from vllm.inputs import TokensPrompt

        if not prompts:
            return
        check_contexts([p for _, p in prompts])
        for key, prompt in prompts:
            if key in self.ids:
                raise ValueError(f"group {key!r} is already running")
            request_id = f"{key}.{next(self._serial)}"
            params = self.engine.params(self.sampler, delta=True)
            self.engine.llm.llm_engine.add_request(request_id, TokensPrompt(prompt_token_ids=list(prompt)), params)
            samples = [_Sample() for _ in range(self.sampler.num_samples)]
            self.requests[request_id] = _Request(key, list(prompt), samples)
            self.ids[key] = request_id

    def drop(self, key: Hashable) -> int:
        """Stop group `key` and forget what it sampled (its prompt may be admitted again); how
        many tokens that was."""
        request_id = self.ids.pop(key)
        request = self.requests.pop(request_id)
        self.engine.llm.llm_engine.abort_request([request_id])
        return sum(len(sample.tokens) for sample in request.samples)

    def step(self, version: int) -> list[FinishedGroup]:
        """One engine step, its tokens recorded as `version`'s; the groups it ended."""
        if not self.requests:
            return []
        finished = []
        for output in self.engine.llm.llm_engine.step():
            request = self.requests.get(output.request_id)
            if request is None:  # aborted meanwhile
                continue
            for completion in output.outputs:
                self._extend(request.samples[completion.index], completion, version)
            if request.running == 0:
                finished.append(self._finish(output.request_id))
        return finished

    @staticmethod
    def _extend(sample: _Sample, completion: Any, version: int) -> None:
        tokens = list(completion.token_ids)
        sample.tokens += tokens
        sample.logprobs += token_logprobs(completion)
        sample.versions += [version] * len(tokens)
        sample.ended = completion.finish_reason is not None

    def _finish(self, request_id: str) -> FinishedGroup:
        request = self.requests.pop(request_id)
        del self.ids[request.key]
        samples = request.samples
        rows = [(s.tokens, s.logprobs) for s in samples]
        prompt = torch.tensor(request.prompt, dtype=torch.long).repeat(len(samples), 1)
        batch = completions_batch(prompt, torch.ones_like(prompt), rows, self.pad_id)
        versions = torch.full_like(batch.completion_ids, -1)
        for i, sample in enumerate(samples):
            versions[i, : len(sample.versions)] = torch.tensor(sample.versions)
        return FinishedGroup(request.key, batch, versions)
