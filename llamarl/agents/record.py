"""One agent episode as the endpoint records it: the token ids the model was given and sampled,
request by request, never re-tokenizing what the model wrote.

The first request's context is rendered once (a chat request's messages by the chat template,
a text request's prompt by the tokenizer, a list of ids as they are); the agent's text is text
on every path (`<eos>` it typed is never the end-of-sequence token, `llamarl.engine.turns`). A later request extends the
recorded chain when it is the earlier one plus one of its sampled choices and new messages (chat:
the same messages, then the assistant message the endpoint answered with; text: the same prompt,
then the choice's text, or the same ids then the choice's ids): the choice's tokens are recorded
with their behaviour log-probs and version, and only the new messages are rendered (the
environment's tokens: version -1, no loss). A request that does not extend the chain is counted
(`mismatches`) and starts the record again from its own context, so the episode's sample is the
conversation's last consistent chain. The same request again samples afresh from the same place.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llamarl.agents.chat_forms import model_reads, template_tools
from llamarl.agents.messages import Normal, normal
from llamarl.engine.episodes import Episode
from llamarl.engine.turns import TurnRenderer
from llamarl.envs.base import Message
from llamarl.tasks import Example


@dataclass(frozen=True)
class Choice:
    """A sampled turn the agent may go on from."""

    ids: list[int]
    logprobs: list[float]
    version: int
    text: str
    """Its text (without EOS; cut before a stop string)."""
    ended_with_eos: bool
    message: dict[str, Any] | None = None
    """The assistant message the endpoint answered with (chat requests)."""


@dataclass
class AgentEpisode:
    example: Example
    episode_id: str = field(default_factory=lambda: secrets.token_hex(8))
    secret: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    started: float = field(default_factory=time.monotonic)
    reissues: int = 0
    """How often its prompt was handed out before, its agent lost each time."""
    prompt: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    seen: list[Normal] | None = None
    """The last chat request's messages (None before the first request or after a text one)."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """The same messages as the model reads them (for rendering the next reply)."""
    tools: list[dict[str, Any]] | None = None
    """The tools the last chat request handed the template (a family's own tool format)."""
    prompt_text: str | None = None
    """The last text request's prompt (a text prompt)."""
    choices: list[Choice] = field(default_factory=list)
    requests: int = 0
    mismatches: int = 0
    num_model_turns: int = 0
    ended_with_eos: bool = False
    started_at: int | None = None
    """The length of its first request's context (what `length` counts from)."""
    reward: float | None = None
    end: str | None = None
    error: str | None = None

    @property
    def key(self) -> str:
        """The API key that carries the episode: its id, then its secret."""
        return f"{self.episode_id}.{self.secret}"

    def context(self) -> list[int]:
        return self.prompt + self.tokens

    def length(self) -> int:
        """How far its context has grown beyond its first request's (environment.max_tokens
        bounds it, restarts or not)."""
        return len(self.context()) - (self.started_at or 0)

    def saved(self) -> dict[str, Any]:
        """Its state, to put back (`restore`) when a request turns out to be refused: every
        update below replaces a list instead of changing it."""
        return dict(vars(self))

    def restore(self, saved: dict[str, Any]) -> None:
        vars(self).update(saved)

    def _restart(self, ids: list[int]) -> list[int]:
        if self.started_at is None:
            self.started_at = len(ids)
        else:
            self.mismatches += 1
        self.prompt, self.tokens, self.logprobs, self.versions = list(ids), [], [], []
        self.turns, self.choices, self.num_model_turns = [], [], 0
        return self.context()

    def _take(self, choice: Choice) -> None:
        self.tokens = self.tokens + choice.ids
        self.logprobs = self.logprobs + choice.logprobs
        self.versions = self.versions + [choice.version] * len(choice.ids)
        turn: dict[str, Any] = {"role": "assistant", "content": choice.text}
        if choice.version >= 0:
            turn["policy_version"] = choice.version
        self.turns = [*self.turns, turn]
        self.num_model_turns += 1
        self.ended_with_eos = choice.ended_with_eos
        self.choices = []

    def close(self, reason: str, error: str | None) -> None:
        """End the episode; a turn sampled last and not yet answered by the agent (its answer,
        or a turn it was cut off after) is recorded as its first choice."""
        if self.choices:
            self._take(self.choices[0])
        self.end, self.error = reason, error

    def _add_environment(self, ids: list[int], turns: Sequence[Mapping[str, Any]]) -> None:
        self.tokens = self.tokens + ids
        self.logprobs = self.logprobs + [0.0] * len(ids)
        self.versions = self.versions + [-1] * len(ids)
        self.turns = self.turns + [{"role": m["role"], "content": m["content"]} for m in turns]

    def chat_context(
        self,
        renderer: TurnRenderer,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        tool_format: str = "llamarl",
    ) -> list[int]:
        """The token ids to sample a chat request's next turn from (recording as above), the
        messages read in `tool_format` (`llamarl.agents.chat_forms`); a family's own format also
        hands the template the `tools` offered, which a later request must offer alike to extend
        the chain."""
        seen = [normal(m) for m in messages]
        texts = [model_reads(m, tool_format) for m in messages]
        offered = template_tools(tools, tool_format)
        known = self.seen if offered == self.tools else None
        self.prompt_text, self.tools = None, offered
        if known is not None and seen[: len(known)] == known:
            if len(seen) == len(known):
                return self.context()
            chosen = next(
                (c for c in self.choices if c.message and normal(c.message) == seen[len(known)]),
                None,
            )
            if chosen is not None:
                before, new = self.history, texts[len(known) + 1 :]
                self._take(chosen)
                if new:
                    reply = renderer.reply(before, chosen.ended_with_eos, new, offered)
                    self._add_environment(reply, new)
                self.seen, self.history = seen, texts
                return self.context()
        self.seen, self.history = seen, texts
        return self._restart(renderer.prompt(texts, offered))

    def text_context(self, renderer: TurnRenderer, prompt: str | list[int]) -> list[int]:
        """The token ids to sample a text request's next turn from (recording as above)."""
        self.seen = None
        if isinstance(prompt, list):
            self.prompt_text = None
            if prompt == self.context():
                return self.context()
            for choice in sorted(self.choices, key=lambda c: -len(c.ids)):
                chain = self.context() + choice.ids
                if prompt[: len(chain)] == chain:
                    self._take(choice)
                    rest = prompt[len(chain) :]
                    self._add_environment(rest, [_text_turn(renderer, rest)] if rest else [])
                    return self.context()
            return self._restart(prompt)
        known, self.prompt_text = self.prompt_text, prompt
        if known is not None:
            if prompt == known:
                return self.context()
            for choice in sorted(self.choices, key=lambda c: -len(c.text)):
                if prompt.startswith(known + choice.text):
                    self._take(choice)
                    after = prompt[len(known) + len(choice.text) :]
                    turn = {"role": "user", "content": after}
                    self._add_environment(renderer.text_ids(after) if after else [], [turn])
                    return self.context()
        return self._restart(renderer.first_text_ids(prompt))

    def to_episode(self) -> Episode:
        """The episode as every environment's are packed and scored."""
        return Episode(
            example=self.example,
            env=None,
            prompt=self.prompt,
            history=[],
            tokens=self.tokens,
            logprobs=self.logprobs,
            versions=self.versions,
            turns=self.turns,
            num_model_turns=self.num_model_turns,
            ended_with_eos=self.ended_with_eos,
            reward=self.reward,
            end=self.end,
            error=self.error,
        )


def _text_turn(renderer: TurnRenderer, ids: list[int]) -> Message:
    return {"role": "user", "content": str(renderer.tokenizer.decode(ids))}
