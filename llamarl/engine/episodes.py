"""Multi-turn episodes, many at once: the model's turns are sampled in batches across every
episode still running, and the environment's steps run side by side between them.

An episode's tokens after the prompt are its turns in order: the model's (each with its
behaviour log-prob and the policy version that sampled it) and the environment's replies
(version -1, log-prob 0: the trainer gives them no loss). The first turn of a prompt's n
episodes shares the prompt's keys and values, as single-turn sampling does; later turns are
sampled from each episode's whole context. `before_turn` runs before every batch of turns (the
generator takes up a newly announced version there), so later turns may carry a newer version
than earlier ones. An episode ends when the environment says done (`done`), after
environment.max_turns model turns (`max_turns`), at environment.max_tokens (`max_tokens`: the
environment still judges the turn that reached it), or when its environment raises or answers
with anything but an EnvStep of messages and a reward finite as float32 (`env_error`), or overruns
environment.step_timeout_s (`env_timeout`); the reason is recorded with it. A prompt of no tokens
(first messages that render to nothing) never reaches the sampler: its episodes end `env_error`
(`empty_context`) before their first turn, with the example's own prompt to pack them under.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import torch

from llamarl.config import EnvironmentConfig
from llamarl.engine.bounded import Outcome, bounded_calls
from llamarl.engine.model import Policy
from llamarl.engine.sampling import SampleBatch, sample
from llamarl.engine.turns import TurnRenderer
from llamarl.envs.base import Environment, EnvStep, Message
from llamarl.envs.registry import EnvFactory
from llamarl.protocol import trainable_reward
from llamarl.tasks import Example


@dataclass
class Episode:
    example: Example
    env: Environment | None
    prompt: list[int]
    history: list[Message]
    """Every message so far, the first ones included (for the chat template)."""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    """The turns after the prompt: role, content and (for the model's) the policy version."""
    num_model_turns: int = 0
    ended_with_eos: bool = False
    """Whether the model's last turn ended with EOS (or was cut at a token limit)."""
    reward: float | None = None
    end: str | None = None
    error: str | None = None

    def add(self, ids: list[int], logprobs: list[float], version: int) -> None:
        self.tokens += ids
        self.logprobs += logprobs
        self.versions += [version] * len(ids)

    def model_texts(self) -> list[str]:
        return [t["content"] for t in self.turns if t["role"] == "assistant"]

    def record(self) -> dict[str, Any]:
        """What samples.jsonl and the wire keep of it, turn by turn."""
        return {"turns": self.turns, "reward": self.reward, "end": self.end, "error": self.error}


@dataclass(frozen=True)
class Sampling:
    max_turn_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    generator: torch.Generator | None = None
    greedy: bool = False


class Decode(Protocol):
    """What samples a batch of token-id contexts: `llamarl.engine.sampling.sample`, or a vLLM
    engine's `sample`."""

    def __call__(
        self,
        policy: Policy,
        prompts: list[list[int]],
        *,
        num_samples: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        generator: torch.Generator | None,
        greedy: bool,
    ) -> SampleBatch: ...


class PlaysEpisodes(Protocol):
    """What plays a batch of episodes: an `EpisodeRunner` on an environment class, or an
    agent runner (`llamarl.agents.runner`)."""

    def run(
        self,
        examples: Sequence[Example],
        num_samples: int,
        sampling: Sampling,
        version: Callable[[], int],
        before_turn: Callable[[], None] | None = None,
    ) -> list[Episode]:
        """n episodes of each example, in example order, every one ended."""
        ...


class EpisodeRunner:
    def __init__(
        self,
        policy: Policy,
        factory: EnvFactory,
        config: EnvironmentConfig,
        decode: Decode = sample,
    ) -> None:
        self.policy = policy
        self.decode = decode
        """Samples the model's turns from token ids (never re-tokenized text)."""
        self.factory = factory
        self.config = config
        self.renderer = TurnRenderer(policy)

    def _begin(self, examples: Sequence[Example], num_samples: int) -> list[Episode]:
        envs = bounded_calls([self.factory.new for _ in range(len(examples) * num_samples)], self.config.step_timeout_s)
        rows = [e for e in examples for _ in range(num_samples)]
        starts = bounded_calls(
            [partial(_start, o, e) for o, e in zip(envs, rows, strict=True)], self.config.step_timeout_s
        )
        episodes = []
        for g, example in enumerate(examples):
            group = range(g * num_samples, (g + 1) * num_samples)
            first = next((starts[i].value for i in group if starts[i].error is None), None)
            prompt = self.renderer.prompt(first or [{"role": "user", "content": example.prompt}])
            # A prompt of no tokens cannot be sampled from; the group is packed under its example's.
            empty = None if prompt else "empty_context: the first messages render to no tokens"
            packed = prompt or self.policy.encode_example(example)
            for i in group:
                episode = Episode(example, envs[i].value, packed, list(first or []))
                if empty or starts[i].error is not None or starts[i].value != first:
                    episode.end, episode.error = "env_error", empty or starts[i].error or "start differs"
                episodes.append(episode)
        return episodes

    def run(
        self,
        examples: Sequence[Example],
        num_samples: int,
        sampling: Sampling,
        version: Callable[[], int],
        before_turn: Callable[[], None] | None = None,
    ) -> list[Episode]:
        """n episodes of each example, in example order, every one ended."""
        episodes = self._begin(examples, num_samples)
        # The first turns share each prompt's keys and values when every episode has begun.
        share = num_samples if all(e.end is None for e in episodes) else 1
        while active := [e for e in episodes if e.end is None]:
            if before_turn is not None:
                before_turn()
            self._model_turn(active, sampling, version(), share)
            share = 1
            self._env_turn([e for e in active if e.end is None])
        return episodes

    def _model_turn(self, active: list[Episode], sampling: Sampling, policy_version: int, share: int) -> None:
        """Sample one turn of every active episode (`share` episodes of one prompt in a row
        share its keys and values: the first turn of a group)."""
        budgets = [min(sampling.max_turn_tokens, self.config.max_tokens - len(e.tokens)) for e in active]
        contexts = [e.prompt + e.tokens for e in active[::share]]
        batch = self.decode(
            self.policy,
            contexts,
            num_samples=share,
            max_new_tokens=max(budgets),
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            generator=sampling.generator,
            greedy=sampling.greedy,
        )
        eos = self.policy.eos_id
        for row, (episode, budget) in enumerate(zip(active, budgets, strict=True)):
            length = min(int(batch.completion_mask[row].sum()), budget)
            ids = batch.completion_ids[row, :length].tolist()
            episode.add(ids, batch.logprobs[row, :length].tolist(), policy_version)
            episode.num_model_turns += 1
            spoken = [t for t in ids if t != eos]
            text = str(self.policy.tokenizer.decode(spoken, skip_special_tokens=True))
            turn: dict[str, Any] = {"role": "assistant", "content": text}
            if policy_version >= 0:  # evaluation samples with the trainer's own weights
                turn["policy_version"] = policy_version
            episode.turns.append(turn)
            episode.ended_with_eos = bool(ids) and ids[-1] == eos

    def _env_turn(self, active: list[Episode]) -> None:
        steps = bounded_calls(
            [partial(_step, e) for e in active],
            self.config.step_timeout_s,
        )
        for episode, outcome in zip(active, steps, strict=True):
            self._take(episode, outcome)

    def _take(self, episode: Episode, outcome: Outcome) -> None:
        if outcome.error is not None:
            episode.end = "env_timeout" if outcome.error == "timeout" else "env_error"
            episode.error = outcome.error
            return
        step: EnvStep = outcome.value
        if step.reward is not None:
            episode.reward = float(step.reward)
        if step.done:
            episode.end = "done"
            return
        if episode.num_model_turns >= self.config.max_turns:
            episode.end = "max_turns"
            return
        if len(episode.tokens) >= self.config.max_tokens:  # judged above, but no room left
            episode.end = "max_tokens"
            return
        history = episode.history + [{"role": "assistant", "content": episode.turns[-1]["content"]}]
        try:
            reply = self.renderer.reply(episode.history, episode.ended_with_eos, step.messages)
        except Exception as err:  # the chat template refused the environment's messages
            episode.end, episode.error = "env_error", f"rendering: {type(err).__name__}: {err}"
            return
        if len(episode.tokens) + len(reply) >= self.config.max_tokens:
            episode.end = "max_tokens"
            return
        episode.add(reply, [0.0] * len(reply), -1)
        episode.history = history + list(step.messages)
        episode.turns += [{"role": m["role"], "content": m["content"]} for m in step.messages]


def _messages(value: Any) -> list[Message]:
    """`value` if it is a list of {"role": str, "content": str}; TypeError otherwise."""
    if not isinstance(value, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
    ):
        raise TypeError("messages must be a list of {'role': str, 'content': str}")
    return value


def _start(made: Outcome, example: Example) -> list[Message]:
    """The first messages of an environment made as `made` (whose failure is re-raised)."""
    if made.error is not None:
        raise RuntimeError(made.error)
    return _messages(made.value.start(example))


def _step(episode: Episode) -> EnvStep:
    """The environment's step, checked: an EnvStep with messages and a reward finite as float32,
    or None (anything else is the environment's error, ending its episode)."""
    assert episode.env is not None
    step = episode.env.step(episode.turns[-1]["content"])
    if not isinstance(step, EnvStep):
        raise TypeError(f"step() returned {type(step).__name__}, not an EnvStep")
    _messages(step.messages)
    if step.reward is not None and (not isinstance(step.reward, int | float) or not trainable_reward(step.reward)):
        raise TypeError("the reward must be a finite number within float32's range, or None")
    return step
