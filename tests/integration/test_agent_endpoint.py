"""The OpenAI-compatible endpoint with the official `openai` client over real HTTP: agents'
episodes recorded as the token ids the engine sampled, the loss on the model's tokens only, keys
that are forged or stale refused, bad bodies refused and counted, and agents that raise, hang,
block, flood or send two requests at once ended with their reason while the others finish."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from llamarl.agents.runner import AgentRunner
from llamarl.config import EnvironmentConfig, ModelConfig
from llamarl.config.endpoint import EndpointConfig
from llamarl.engine.episodes import Episode, Sampling
from llamarl.engine.model import build_policy
from llamarl.engine.rollouts import pack_episodes, score_group, train_group
from llamarl.engine.sampling import SampleBatch, sample
from llamarl.engine.turns import TurnRenderer
from llamarl.rewards import make_verifier
from llamarl.rewards.scorers import VerifierScorer
from llamarl.roles.admission import check_scored
from llamarl.tasks import Example
from tests import user_agents

EXTRA = '<>/{}":acelorstu'


class Recorder:
    """The engine's sampler, keeping every row it sampled (cut at the row's own end)."""

    def __init__(self) -> None:
        self.rows: list[list[int]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> SampleBatch:
        batch = sample(*args, **kwargs)
        for ids, mask in zip(batch.completion_ids, batch.completion_mask, strict=True):
            self.rows.append(ids[: int(mask.sum())].tolist())
        return batch


@pytest.fixture
def rejected() -> Counter[str]:
    return Counter()


def runner(agent: str, rejected: Counter[str], decode: Any = sample, **fields: Any) -> AgentRunner:
    policy = build_policy(ModelConfig(extra_characters=EXTRA), seed=0)
    config = EnvironmentConfig(kind="agent", agent=f"tests.user_agents:{agent}", **fields)
    endpoint = EndpointConfig(max_request_bytes=100_000)

    def count(reason: str, detail: str) -> None:
        rejected.update([reason])

    def add(name: str, amount: float) -> None:
        if amount:
            rejected[name] += int(amount)

    return AgentRunner(policy, config, endpoint, "built", decode, on_reject=count, count=add)


@pytest.fixture
def made() -> Iterator[list[AgentRunner]]:
    runners: list[AgentRunner] = []
    user_agents.RELEASE.clear()
    yield runners
    user_agents.RELEASE.set()
    for each in runners:
        each.close()


def examples(count: int) -> list[Example]:
    return [Example(i, f"{10 + i}*3=", str((10 + i) * 3), row={"a": i}) for i in range(count)]


def play(run: AgentRunner, count: int, num_samples: int) -> list[Episode]:
    sampling = Sampling(6, generator=torch.Generator().manual_seed(0))
    return run.run(examples(count), num_samples, sampling, lambda: 3)


def model_turns(episode: Episode) -> list[list[int]]:
    """The episode's model tokens, turn by turn (runs of version >= 0)."""
    turns: list[list[int]] = []
    previous = -1
    for token, version in zip(episode.tokens, episode.versions, strict=True):
        if version >= 0:
            if previous < 0:
                turns.append([])
            turns[-1].append(token)
        previous = version
    return turns


def test_a_three_turn_agent_records_the_tokens_the_engine_sampled(
    made: list[AgentRunner], rejected: Counter[str]
) -> None:
    engine = Recorder()
    made.append(run := runner("three_turns", rejected, engine))
    episodes = play(run, count=2, num_samples=2)
    seen = list(user_agents.SEEN.values())
    assert len(seen) == 4 and not rejected
    engine_rows = sorted(engine.rows)
    recorded = sorted(turn for e in episodes for turn in model_turns(e))
    answered = sorted(s["token_ids"] for answers in seen for s in answers)
    assert recorded == answered == engine_rows and len(recorded) == 12
    reply = TurnRenderer(run.policy).text_ids("+1 ")
    for episode in episodes:
        assert episode.end == "done" and episode.num_model_turns == 3
        answers = next(a for a in seen if [s["token_ids"] for s in a] == model_turns(episode))
        logprobs = [lp for s in answers for lp in s["logprobs"]]
        assert [lp for lp, v in zip(episode.logprobs, episode.versions, strict=True) if v >= 0] == logprobs
        assert {s["policy_version"] for s in answers} == {3}
        env = [t for t, v in zip(episode.tokens, episode.versions, strict=True) if v < 0]
        assert env == reply * 2  # the two replies between the three turns, nothing else
        assert episode.reward == float(episode.example.row["a"] % 2)
    groups = pack_episodes(episodes, examples(2), [(0, 0), (1, 0)])
    for group, pair in zip(groups, [episodes[:2], episodes[2:]], strict=True):
        trained = train_group(score_group(group, VerifierScorer(make_verifier("exact_int"), "exact_int")))
        for row, episode in enumerate(pair):
            model = [int(v >= 0) for v in episode.versions]
            assert trained.completion_mask[row, : len(model)].tolist() == model


def test_text_completions_extend_the_recorded_chain(made: list[AgentRunner], rejected: Counter[str]) -> None:
    made.append(run := runner("text_turns", rejected))
    (episode,) = play(run, count=1, num_samples=1)
    (answers,) = [a for a in user_agents.SEEN.values() if len(a) == 2 and a[0]["logprobs"] == []]
    renderer = TurnRenderer(run.policy)
    first, second = (a["token_ids"] for a in answers)
    between = renderer.text_ids("= ")
    assert episode.prompt == list(run.policy.tokenizer("10*3=").input_ids)
    assert episode.tokens == first + between + second
    assert episode.versions == [3] * len(first) + [-1] * len(between) + [3] * len(second)


def test_forged_and_stale_keys_and_bad_bodies_are_refused_and_counted(
    made: list[AgentRunner], rejected: Counter[str]
) -> None:
    made.append(first := runner("three_turns", rejected))
    play(first, count=1, num_samples=1)
    stale = list(user_agents.FINISHED_KEYS)
    made.append(run := runner("forger", rejected))
    (forging,) = play(run, count=1, num_samples=1)
    assert forging.end == "done" and forging.num_model_turns == 1
    (key,) = [k for k in user_agents.OUTCOMES if k not in stale]
    assert user_agents.OUTCOMES[key] == ["AuthenticationError"] * (1 + len(stale))
    assert rejected["episode_key"] == 1 + len(stale)
    made.append(raw := runner("raw_requests", rejected))
    (episode,) = play(raw, count=1, num_samples=1)
    assert episode.end == "done" and episode.num_model_turns == 1
    (statuses,) = [v for v in user_agents.OUTCOMES.values() if v[0].isdigit()]
    assert statuses == ["400", "400", "413"]
    assert rejected["bad_request"] == 2 and rejected["request_too_large"] == 1


def test_agents_that_raise_hang_block_or_flood_are_ended_and_the_rest_finish(
    made: list[AgentRunner], rejected: Counter[str]
) -> None:
    made.append(run := runner("misbehaves", rejected, episode_timeout_s=3, max_requests=4))
    episodes = play(run, count=6, num_samples=1)
    ends = [(e.end, (e.error or "")[:10]) for e in episodes]
    assert ends == [
        ("agent_error", "ValueError"),
        ("agent_timeout", "timeout"),
        ("agent_timeout", "timeout"),
        ("max_requests", ""),
        ("done", ""),
        ("done", ""),
    ]
    assert all(e.num_model_turns >= 1 for e in episodes)
    assert rejected["max_requests"] == 1 and rejected["episode_busy"] == 1
    groups = pack_episodes(episodes, examples(6), [(i, 0) for i in range(6)])
    for group in groups:  # every one of them is a sample the trainer takes
        scored = score_group(group, VerifierScorer(make_verifier("exact_int"), "exact_int"))
        check_scored(scored, len(run.policy.tokenizer), policy_version=3)


def test_requests_the_model_cannot_serve_are_refused_and_end_nothing_else(
    made: list[AgentRunner], rejected: Counter[str]
) -> None:
    made.append(run := runner("odd_requests", rejected))
    (episode,) = play(run, count=1, num_samples=1)
    # The episode ended at the refusal; its agent hears of it a moment later.
    deadline = time.monotonic() + 10
    while not [v for v in user_agents.OUTCOMES.values() if len(v) == 4]:
        assert time.monotonic() < deadline, user_agents.OUTCOMES
        time.sleep(0.01)
    (outcomes,) = [v for v in user_agents.OUTCOMES.values() if len(v) == 4]
    assert outcomes == ["400", "400", "200", "400"]
    assert episode.end == "max_tokens" and episode.num_model_turns == 1
    assert rejected["bad_request"] == 2 and rejected["agent_sampling_overridden"] == 1


def test_special_tokens_an_agent_types_into_a_first_request_are_text(
    made: list[AgentRunner], rejected: Counter[str]
) -> None:
    made.append(run := runner("types_specials", rejected))
    episodes = play(run, count=3, num_samples=1)
    assert [e.end for e in episodes] == ["done"] * 3 and not rejected
    spelled = TurnRenderer(run.policy).text_ids
    chat, text, history = (e.prompt for e in episodes)
    assert chat == spelled("1<eos>2=") == text
    assert history == spelled("1<eos>1<eos>2=")
    for episode in episodes:  # `<eos>` is the five characters, nowhere the end of a sequence
        assert run.policy.eos_id not in episode.prompt


def test_a_streamed_episode_records_what_the_same_episode_unstreamed_does(
    made: list[AgentRunner], rejected: Counter[str]
) -> None:
    """Greedy, the same agent streaming its answers (server-sent events, put together by the
    `openai` client's stream) and not: the same tokens recorded, the streamed chunks carrying the
    sampled ids and the usage."""
    recorded = []
    for agent in ("three_turns", "three_turns_streamed"):
        made.append(run := runner(agent, rejected))
        sampling = Sampling(6, generator=torch.Generator().manual_seed(0), greedy=True)
        (episode,) = run.run(examples(1), 1, sampling, lambda: 3)
        assert episode.end == "done" and episode.num_model_turns == 3, (episode.end, episode.error)
        recorded.append(episode)
    plain, streamed = recorded
    assert streamed.prompt == plain.prompt and streamed.tokens == plain.tokens
    assert streamed.versions == plain.versions and streamed.logprobs == pytest.approx(plain.logprobs)
    (answers,) = [a for a in user_agents.SEEN.values() if "usage" in a[0]]
    assert [a["token_ids"] for a in answers] == model_turns(streamed)
    assert all(a["usage"].completion_tokens == len(a["token_ids"]) for a in answers)
    assert not rejected
