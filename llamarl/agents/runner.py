"""Agent episodes, many at once (`environment.kind: agent`): each episode's agent function runs
against the endpoint with the episode's key, and the requests of all of them are sampled in
batches by the engine, on the caller's thread (which owns the model).

A batch is sampled when every running episode has a request waiting, or when requests are
waiting and nothing more has arrived for `generation.openai.batch_wait_ms` (an agent busy with a
tool need not hold the others up, and requests still streaming in join the batch).
`before_turn` runs before each batch (the generator takes up a newly announced
version there), so an episode's later turns may be newer than its first; every token keeps the
version that sampled it.

An episode ends when its agent returns (`done`, with the reward it returned or None for the
reward workers to score its last turn), raises or returns anything else, a reward past
float32's range included (`agent_error`),
overruns `environment.episode_timeout_s` (`agent_timeout`), asks for more than
`environment.max_requests` requests (`max_requests`), or asks for a turn once its
`environment.max_tokens` are spent (`max_tokens`). An ended episode's key is revoked at once;
its agent is not waited for. An agent server (`environment.agent_url`, `llamarl.agents.remote`)
that loses an episode has it handed out again under a new key (`agent_episodes_reissued`), up to
`environment.max_reissues` times, then it ends `agent_error`. Requests that break a rule are
answered with a 4xx and counted: a second request while one of the same episode waits (429),
the chat template refusing the messages (400), messages or a prompt that render to no tokens
(400, `empty_context`: there is nothing to sample from, and the sampler refuses such a context
too).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import InvalidStateError
from dataclasses import dataclass
from functools import partial
from typing import Any

from llamarl.agents.endpoint import Endpoint, Waiting
from llamarl.agents.limits import RequestLimits, positions
from llamarl.agents.play import Agent, AgentThreads, agent_function, row_of
from llamarl.agents.record import AgentEpisode, Choice
from llamarl.agents.remote import remote_agent
from llamarl.agents.responses import error_body, response_body, sampled_choice
from llamarl.agents.server import ServerThread
from llamarl.agents.tool_formats import format_of
from llamarl.agents.wire import ChatRequest, Request
from llamarl.config import EnvironmentConfig
from llamarl.config.endpoint import EndpointConfig
from llamarl.engine.episodes import Decode, Episode, Sampling
from llamarl.engine.model import Policy
from llamarl.engine.sampling import SampleBatch, sample
from llamarl.engine.turns import TurnRenderer
from llamarl.limits import RejectHook
from llamarl.tasks import Example

Count = Callable[[str, float], None]
REISSUE_PAUSE_S = 0.5
"""The pause before a lost episode is handed out again, times how often it was."""


@dataclass(frozen=True)
class Ended:
    """An agent that returned or raised, or was lost (its episode is handed out again)."""

    episode: AgentEpisode
    reward: float | None
    error: str | None
    lost: bool = False


def context_of(episode: AgentEpisode, renderer: TurnRenderer, body: Request, tool_format: str) -> list[int]:
    """The token ids `body` is sampled from, recorded in `episode`."""
    if isinstance(body, ChatRequest):
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        return episode.chat_context(renderer, messages, body.offered_tools(), tool_format)
    return episode.text_context(renderer, body.prompt)


def _ignore(*_: object) -> None:
    """Counts nobody reads (an evaluation's)."""


class AgentRunner:
    def __init__(
        self,
        policy: Policy,
        config: EnvironmentConfig,
        endpoint: EndpointConfig,
        model_name: str,
        decode: Decode = sample,
        on_reject: RejectHook = _ignore,
        count: Count = _ignore,
    ) -> None:
        self.policy = policy
        self.config = config
        self.agent: Agent = (
            agent_function(config.agent)
            if config.agent
            else remote_agent(config.agent_url or "", config.episode_timeout_s)
        )
        self.decode = decode
        self.threads = AgentThreads()
        self.renderer = TurnRenderer(policy)
        self.tool_format = format_of(config.tool_format, policy.tokenizer, policy.chat)
        self.inbox: queue.Queue[Waiting | Ended] = queue.Queue()
        self.on_reject = on_reject
        self.count = count
        self.version = -1
        self.wait_s = endpoint.batch_wait_ms / 1000
        self.limits = RequestLimits(endpoint.max_choices, len(policy.tokenizer), positions(policy))
        self.endpoint = Endpoint(
            model_name,
            lambda: self.version,
            endpoint,
            self.inbox,
            on_reject,
            config.episode_timeout_s,
        )
        self.server = ServerThread(self.endpoint.app(), endpoint.host, endpoint.port)
        self.server.start()

    def close(self) -> None:
        self.server.stop()

    def run(
        self,
        examples: Sequence[Example],
        num_samples: int,
        sampling: Sampling,
        version: Callable[[], int],
        before_turn: Callable[[], None] | None = None,
    ) -> list[Episode]:
        """n episodes of each example, in example order, every one ended."""
        self.version = version()
        episodes = [AgentEpisode(e) for e in examples for _ in range(num_samples)]
        running = {e.episode_id: e for e in episodes}
        for episode in episodes:
            self._start(episode)
        waiting: list[Waiting] = []
        while running:
            self._gather(running, waiting, sampling, episodes)
            self._expire(running, waiting)
            if waiting:
                if before_turn is not None:
                    before_turn()
                self.version = version()
                self._sample(waiting, sampling)
                waiting = []
        self._answer_late()
        self.count("agent_prefix_mismatches", sum(e.mismatches for e in episodes))
        played = [e.to_episode() for e in episodes]
        for start in range(0, len(played), num_samples):
            self._one_prompt(played[start : start + num_samples])
        return played

    def _start(self, episode: AgentEpisode) -> None:
        """Open `episode`'s key and start its agent."""
        self.endpoint.open(episode)
        self.threads.start(
            self.agent,
            row_of(episode.example),
            self.server.base_url,
            episode.key,
            self.config.episode_timeout_s,
            partial(self._ended, episode),
        )

    def _answer_late(self) -> None:
        """Refuse what reached the inbox after its episode ended (410), and forget the rest."""
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, Waiting):
                self._refuse(item, 410, "episode_over", "the episode has ended")

    def _one_prompt(self, group: list[Episode]) -> None:
        """The group's episodes under one prompt, as a rollout group has: the longest prefix
        their recorded prompts share (an episode whose agent asked nothing starts from the
        example's prompt); the rest of each one's is the environment's tokens. Prompts that
        share no token cannot form a group: its episodes end agent_error, with nothing to train
        (the group is set aside and its prompt drawn anew)."""
        for episode in group:
            if not episode.prompt and not episode.tokens:
                episode.prompt = self.policy.encode_example(episode.example)
        shared = 0
        first = group[0].prompt
        while shared < len(first) and all(len(e.prompt) > shared and e.prompt[shared] == first[shared] for e in group):
            shared += 1
        if shared == 0:
            for episode in group:
                episode.prompt = self.policy.encode_example(episode.example)
                episode.tokens, episode.logprobs, episode.versions = [], [], []
                episode.end, episode.error = "agent_error", "the group's prompts share no token"
            return
        for episode in group:
            own = episode.prompt[shared:]
            episode.prompt = episode.prompt[:shared]
            episode.tokens = own + episode.tokens
            episode.logprobs = [0.0] * len(own) + episode.logprobs
            episode.versions = [-1] * len(own) + episode.versions

    def _ended(self, episode: AgentEpisode, reward: float | None, error: str | None, lost: bool) -> None:
        self.inbox.put(Ended(episode, reward, error, lost))

    def _gather(
        self, running: dict[str, AgentEpisode], waiting: list[Waiting], sampling: Sampling, episodes: list[AgentEpisode]
    ) -> None:
        """Take what arrives until a batch is ready (see the module's doc) or an episode's time
        may be up."""
        heard = time.monotonic()
        while running:
            if waiting and len(waiting) == len(running):
                return
            now = time.monotonic()
            next_end = min(e.started for e in running.values()) + self.config.episode_timeout_s
            until = next_end if not waiting else min(next_end, heard + self.wait_s)
            try:
                item = self.inbox.get(timeout=max(0.0, until - now))
            except queue.Empty:
                return
            heard = time.monotonic()
            if isinstance(item, Ended):
                self._finish(item, running, waiting, episodes)
            else:
                self._admit(item, running, waiting, sampling)

    def _end(
        self,
        episode: AgentEpisode,
        reason: str,
        running: dict[str, AgentEpisode],
        waiting: list[Waiting],
        error: str | None = None,
    ) -> None:
        episode.close(reason, error)
        self.endpoint.close(episode)
        running.pop(episode.episode_id, None)
        for item in [w for w in waiting if w.episode is episode]:
            waiting.remove(item)
            self._refuse(item, 410, "episode_over", f"the episode has ended ({reason})")

    def _finish(
        self, ended: Ended, running: dict[str, AgentEpisode], waiting: list[Waiting], episodes: list[AgentEpisode]
    ) -> None:
        episode = ended.episode
        if episode.episode_id not in running:  # ended already, by a limit
            return
        if ended.lost and episode.reissues < self.config.max_reissues:
            return self._reissue(episode, running, waiting, episodes)
        if ended.error is None:
            episode.reward = ended.reward
        self._end(episode, "done" if ended.error is None else "agent_error", running, waiting, ended.error)

    def _reissue(
        self,
        episode: AgentEpisode,
        running: dict[str, AgentEpisode],
        waiting: list[Waiting],
        episodes: list[AgentEpisode],
    ) -> None:
        """Hand a lost agent's episode out again: the same prompt under a new key, after a pause
        that grows with each time; the old key is revoked and its record dropped."""
        self._end(episode, "agent_lost", running, waiting)
        fresh = AgentEpisode(episode.example, reissues=episode.reissues + 1)
        episodes[episodes.index(episode)] = fresh
        running[fresh.episode_id] = fresh
        self.count("agent_episodes_reissued", 1)
        pause = threading.Timer(
            min(REISSUE_PAUSE_S * fresh.reissues, self.config.episode_timeout_s / 4), self._start, [fresh]
        )
        pause.daemon = True
        pause.start()

    def _refuse(self, item: Waiting, status: int, reason: str, message: str) -> None:
        self.on_reject(reason, message)
        answer(item, status, error_body(status, message))

    def _admit(
        self,
        item: Waiting,
        running: dict[str, AgentEpisode],
        waiting: list[Waiting],
        sampling: Sampling,
    ) -> None:
        """Wait `item` for the next batch, or refuse it (ending its episode where a limit says
        so); its episode's record is left as it was when it is refused."""
        episode, body = item.episode, item.body
        if episode.episode_id not in running:
            return self._refuse(item, 401, "episode_key", "the API key is no live episode's")
        if any(w.episode is episode for w in waiting):
            return self._refuse(item, 429, "episode_busy", "one request at a time an episode")
        if episode.requests >= self.config.max_requests:
            self._refuse(item, 429, "max_requests", f"over {self.config.max_requests} requests")
            return self._end(episode, "max_requests", running, waiting)
        problem = self.limits.problem(body)
        if problem is not None:
            return self._refuse(item, 400, "bad_request", problem)
        saved = episode.saved()
        try:
            item.context = context_of(episode, self.renderer, body, self.tool_format)
        except Exception as err:  # the chat template refused the agent's messages
            episode.restore(saved)
            detail = f"{type(err).__name__}: {err}"[:200]
            return self._refuse(item, 400, "bad_messages", f"cannot render the messages: {detail}")
        if not item.context:  # an empty message, or only an image part, on a model without a chat template
            episode.restore(saved)
            return self._refuse(item, 400, "empty_context", "the request renders to no tokens: nothing to sample from")
        budget = min(self.config.max_tokens - episode.length(), self.limits.positions - len(item.context))
        if budget <= 0:
            episode.restore(saved)
            self._refuse(item, 400, "max_tokens", "the episode's token budget is spent")
            return self._end(episode, "max_tokens", running, waiting)
        episode.requests += 1
        if not sampling.greedy and self.limits.overrides(body, sampling):
            self.count("agent_sampling_overridden", 1)
        item.budget = min(body.limit() or sampling.max_turn_tokens, sampling.max_turn_tokens, budget)
        waiting.append(item)

    def _expire(self, running: dict[str, AgentEpisode], waiting: list[Waiting]) -> None:
        now = time.monotonic()
        for episode in list(running.values()):
            if now - episode.started >= self.config.episode_timeout_s:
                self._end(episode, "agent_timeout", running, waiting, "timeout")

    def _sample(self, waiting: list[Waiting], sampling: Sampling) -> None:
        """Sample every waiting request at the run's settings (greedy in an evaluation). Requests
        with the same context share its keys and values (a prompt's n episodes' first turns),
        so one batch takes the contexts that as many requests share, each asking as many
        choices."""
        shared: dict[tuple[int, ...], list[Waiting]] = {}
        for item in waiting:
            shared.setdefault((item.body.n, *item.context), []).append(item)
        batches: dict[tuple[int, int], list[list[Waiting]]] = {}
        for key, items in shared.items():
            batches.setdefault((key[0], len(items)), []).append(items)
        for (n, copies), groups in batches.items():
            batch = self.decode(
                self.policy,
                [items[0].context for items in groups],
                num_samples=n * copies,
                max_new_tokens=max(w.budget for items in groups for w in items),
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                generator=sampling.generator,
                greedy=sampling.greedy,
            )
            for g, items in enumerate(groups):
                for j, item in enumerate(items):
                    first = (g * copies + j) * n
                    self._respond(item, [self._row(batch, row, item) for row in range(first, first + n)])

    def _row(self, batch: SampleBatch, row: int, item: Waiting) -> tuple[Choice, str]:
        length = min(int(batch.completion_mask[row].sum()), item.budget)
        ids = batch.completion_ids[row, :length].tolist()
        logprobs = batch.logprobs[row, :length].tolist()
        return sampled_choice(self.policy, ids, logprobs, self.version, item.body.stops())

    def _respond(self, item: Waiting, sampled: list[tuple[Choice, str]]) -> None:
        episode = item.episode
        ident = f"{episode.episode_id}-{episode.requests}"
        try:
            episode.choices, body, malformed = response_body(
                self.policy, item.body, ident, self.endpoint.model, item.context, sampled, self.tool_format
            )
        except Exception as err:  # a body we failed to answer: that request's error alone
            message = f"cannot answer: {type(err).__name__}: {err}"[:200]
            return self._refuse(item, 500, "endpoint_error", message)
        self.count("agent_malformed_tool_calls", malformed)
        answer(item, 200, body)


def answer(item: Waiting, status: int, body: dict[str, Any]) -> None:
    """Answer `item` unless its client has gone (its handler cancelled the wait)."""
    try:
        item.answer.set_result((status, body))
    except InvalidStateError:
        pass
