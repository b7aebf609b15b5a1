"""Agents calling tools in a model family's own format, through the endpoint over real HTTP with
the official `openai` client: for hermes, llama3_json and mistral (tests/chat_families.py: each
family's markers in a real tokenizer, a chat template written after the family's), a three-turn
agent offered two tools (one taking two strings, one an integer) gets the model's calls as OpenAI
`tool_calls`, two calls in one turn included; its tool results reach the model as the family's
template writes them; and every token trained on is one the model sampled, with its log-prob,
also where the template renders an earlier turn otherwise (drops its reasoning). A malformed call
is answered as text and counted.

The model's turns are scripted: the runner's `decode` is replaced by one that "samples" each
family's call text (a randomly initialised model cannot write a call in any format). Everything
else is the product's: the endpoint, the chat template, the parser, the record and the packing
into training rows.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch
from transformers import LlamaForCausalLM

from llamarl.agents.chat_forms import for_template
from llamarl.agents.runner import AgentRunner
from llamarl.config import EnvironmentConfig
from llamarl.config.endpoint import EndpointConfig
from llamarl.engine.episodes import Episode, Sampling
from llamarl.engine.model import Policy
from llamarl.engine.rollouts import pack_episodes, score_group, train_group
from llamarl.engine.sampling import SampleBatch, left_pad
from llamarl.errors import ConfigError
from llamarl.rewards import make_verifier
from llamarl.rewards.scorers import VerifierScorer
from llamarl.tasks import Example
from llamarl.training.sft import agent_demonstration
from tests import framework_agents, user_agents
from tests.chat_families import FAMILIES, FIND, LATER, THINKING_HERMES_CHAT_TEMPLATE, TOOLS, Family, family_tokenizer
from tests.integration.test_agent_endpoint import model_turns
from tests.tiny_llama import tiny_llama_config

each_family = pytest.mark.parametrize("family", FAMILIES.values(), ids=FAMILIES.keys())

ANSWER = "Both are done."
EXAMPLE = Example(0, "Find llamas on the wiki, and the date in 3 days.", "1", row={"a": 0})


class Script:
    """A decode that answers each context with its episode's next scripted turn (the turn
    after the one the longest context served before, that this one extends), ending in EOS,
    with log-probs of its own; it keeps every row it gave."""

    def __init__(self, policy: Policy, turns: list[str]) -> None:
        self.policy, self.turns = policy, turns
        self.served: dict[tuple[int, ...], int] = {}
        self.rows: list[list[int]] = []
        self.logprobs: list[list[float]] = []

    def _turn(self, context: list[int]) -> int:
        before = [t for c, t in self.served.items() if len(c) < len(context) and tuple(context[: len(c)]) == c]
        return max(before, default=-1) + 1

    def __call__(self, policy: Policy, contexts: list[list[int]], num_samples: int, **_: Any) -> SampleBatch:
        rows, logprobs = [], []
        for context in contexts:
            turn = self._turn(context)
            self.served[tuple(context)] = turn
            ids = [*self.policy.tokenizer(self.turns[turn], add_special_tokens=False).input_ids, policy.eos_id]
            for _ in range(num_samples):
                rows.append(ids)
                logprobs.append([-0.01 * (len(self.rows) + 1) - 0.001 * i for i in range(len(ids))])
                self.rows.append(ids)
                self.logprobs.append(logprobs[-1])
        prompt_ids, prompt_mask = left_pad([c for c in contexts for _ in range(num_samples)], policy.pad_id)
        width = max(len(r) for r in rows)
        completion = torch.full((len(rows), width), policy.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        values = torch.zeros((len(rows), width))
        for i, (row, lps) in enumerate(zip(rows, logprobs, strict=True)):
            completion[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
            values[i, : len(row)] = torch.tensor(lps)
        return SampleBatch(prompt_ids, prompt_mask, completion, mask, values)


def family_policy(family: Family) -> Policy:
    tokenizer = family.tokenizer
    llama = tiny_llama_config(tokenizer, 8192)
    return Policy(LlamaForCausalLM(llama), tokenizer, chat=True)


@pytest.fixture
def made() -> Iterator[list[AgentRunner]]:
    runners: list[AgentRunner] = []
    yield runners
    for each in runners:
        each.close()


def play(
    made: list[AgentRunner], family: Family, turns: list[str], agent: str = "tests.user_agents:tool_calling"
) -> tuple[AgentRunner, Script, Counter[str], Episode]:
    policy = family_policy(family)
    script = Script(policy, turns)
    counted: Counter[str] = Counter()

    def count(name: str, amount: float) -> None:
        counted[name] += int(amount)

    config = EnvironmentConfig(kind="agent", agent=agent, max_tokens=4000)
    run = AgentRunner(
        policy,
        config,
        EndpointConfig(max_request_bytes=100_000),
        "family",
        script,
        on_reject=lambda reason, detail: counted.update([f"refused {reason}: {detail}"]),
        count=count,
    )
    made.append(run)
    sampling = Sampling(200, generator=torch.Generator().manual_seed(0))
    (episode,) = run.run([EXAMPLE], 1, sampling, lambda: 5)
    return run, script, counted, episode


def _calls(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]


def _environment_runs(episode: Episode) -> list[list[int]]:
    runs: list[list[int]] = []
    previous = 0
    for token, version in zip(episode.tokens, episode.versions, strict=True):
        if version < 0:
            if previous >= 0:
                runs.append([])
            runs[-1].append(token)
        previous = version
    return runs


@each_family
def test_a_three_turn_agent_calls_tools_in_its_familys_format(made: list[AgentRunner], family: Family) -> None:
    turns = [family.write(FIND), family.write(LATER, FIND), ANSWER]
    run, script, counted, episode = play(made, family, turns)
    assert episode.end == "done" and episode.num_model_turns == 3, (episode.end, episode.error, counted)
    assert run.tool_format == family.name and not counted.get("agent_malformed_tool_calls")
    assert not [name for name in counted if name.startswith("refused")], counted
    (answers,) = [a for a in user_agents.SEEN.values() if a[0]["token_ids"] == script.rows[0]]
    messages = [a["message"] for a in answers]
    assert _calls(messages[0]) == [FIND]
    assert _calls(messages[1]) == [LATER, FIND], "two calls in one turn"
    assert messages[2] == {"role": "assistant", "content": ANSWER}
    assert [a["finish_reason"] for a in answers] == ["tool_calls", "tool_calls", "stop"]
    ids = [c["id"] for m in messages[:2] for c in m["tool_calls"]]
    assert len(set(ids)) == 3

    # Every model token is one the engine sampled, with its log-prob; the loss is on them only.
    assert model_turns(episode) == script.rows == [a["token_ids"] for a in answers]
    sampled_logprobs = [lp for lp, v in zip(episode.logprobs, episode.versions, strict=True) if v >= 0]
    assert sampled_logprobs == pytest.approx([lp for row in script.logprobs for lp in row])
    scored = score_group(
        pack_episodes([episode], [episode.example], [(0, 0)])[0],
        VerifierScorer(make_verifier("exact_int"), "exact_int"),
    )
    trained = train_group(scored)
    model = [int(v >= 0) for v in episode.versions]
    assert trained.completion_mask[0, : len(model)].tolist() == model

    # The tool results reach the model as the family's template writes them, call ids included
    # where the template writes them.
    decode = family.tokenizer.decode
    first, second = (decode(run_ids, skip_special_tokens=False) for run_ids in _environment_runs(episode))
    assert user_agents.run_tool(*FIND) in first
    assert user_agents.run_tool(*LATER) in second and user_agents.run_tool(*FIND) in second
    if family.renders_ids:
        assert ids[0] in first and ids[1] in second and ids[2] in second
    whole = decode(episode.prompt + episode.tokens, skip_special_tokens=False)
    assert "add_days" in decode(episode.prompt, skip_special_tokens=False), "the tools reached the template"
    assert whole.endswith(ANSWER + family.tokenizer.eos_token)


def _trained_runs(ids: list[int], labels: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for index, (token, label) in enumerate(zip(ids, labels, strict=True)):
        if label != -100:
            if not index or labels[index - 1] == -100:
                runs.append([])
            runs[-1].append(token)
    return runs


@each_family
def test_a_warm_start_trains_on_the_tokens_a_run_records(made: list[AgentRunner], family: Family) -> None:
    """The warm start on an agent's demonstrations (`{"messages", "tools"}`) is rendered as the
    endpoint renders the episode: when the model writes the demonstration's turns, the run
    records the same tokens (the prompt with the tools, the calls, the results as the template
    writes them), with the loss on the same ones."""
    policy = family_policy(family)
    demo = "tests.user_agents:tool_calling_demonstration"
    config = EnvironmentConfig(kind="agent", agent="tests.user_agents:tool_calling", demonstration=demo)
    ids, labels = agent_demonstration(policy, config)(EXAMPLE)
    decode = family.tokenizer.decode
    turns = [decode(run[:-1], skip_special_tokens=False) for run in _trained_runs(ids, labels)]
    assert "add_days" in turns[1] and "search" in turns[1], "the second turn holds both calls"

    run, script, counted, episode = play(made, family, turns)
    assert episode.end == "done" and episode.num_model_turns == 3, (episode.end, episode.error, counted)
    assert not counted.get("agent_malformed_tool_calls")
    recorded = episode.prompt + episode.tokens
    sampled = zip(episode.tokens, episode.versions, strict=True)
    trained = [-100] * len(episode.prompt) + [-100 if version < 0 else token for token, version in sampled]
    if not family.renders_ids:
        assert recorded == ids and trained == labels
        return
    # mistral's template writes each call's id, which the endpoint draws afresh: the same
    # tokens but for the ids.
    (answers,) = [a for a in user_agents.SEEN.values() if a[0]["token_ids"] == script.rows[0]]
    fresh = [c["id"] for a in answers[:2] for c in a["message"]["tool_calls"]]
    text = decode(recorded, skip_special_tokens=False)
    for number, drawn in enumerate(fresh, 1):
        text = text.replace(drawn, f"call0000{number}")
    assert text == decode(ids, skip_special_tokens=False)
    assert [label == -100 for label in trained] == [label == -100 for label in labels]


@each_family
def test_a_malformed_call_is_answered_as_text_and_counted(made: list[AgentRunner], family: Family) -> None:
    broken = family.turn(['{"name": "search", "arguments": {"query": "llamas", "site": '])
    run, script, counted, episode = play(made, family, [broken])
    assert episode.end == "done" and episode.num_model_turns == 1
    assert counted["agent_malformed_tool_calls"] == 1
    (answers,) = [a for a in user_agents.SEEN.values() if a[0]["token_ids"] == script.rows[0]]
    assert "tool_calls" not in answers[0]["message"] and answers[0]["finish_reason"] == "stop"


def test_a_template_that_drops_reasoning_trains_on_the_reasoning_sampled(made: list[AgentRunner]) -> None:
    """Qwen3-style hermes: the template drops an earlier turn's `<think>` reasoning when it renders
    the conversation again. The next turn is sampled after the tokens the model sampled, reasoning
    included, and those are the tokens trained on."""
    markers = ["<|im_start|>", "<|im_end|>"]
    family = replace(
        FAMILIES["hermes"], tokenizer=family_tokenizer(THINKING_HERMES_CHAT_TEMPLATE, markers, "<|im_end|>")
    )
    thought = "<think>Search first.</think>\n"
    run, script, counted, episode = play(made, family, [thought + family.write(FIND), ANSWER])
    assert episode.num_model_turns == 2 and not counted.get("agent_malformed_tool_calls")
    assert model_turns(episode) == script.rows
    (answers,) = [a for a in user_agents.SEEN.values() if a[0]["token_ids"] == script.rows[0]]
    assert answers[0]["message"]["content"] == thought.strip()
    second_context = next(c for c, turn in script.served.items() if turn == 1)
    read = family.tokenizer.decode(list(second_context), skip_special_tokens=False)
    assert thought in read, "the second turn was sampled after the reasoning the model wrote"
    conversation = [
        {"role": "user", "content": episode.example.prompt},
        for_template(answers[0]["message"]),
        {"role": "tool", "content": user_agents.run_tool(*FIND)},
    ]
    again = family.tokenizer.apply_chat_template(conversation, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert "Search first." not in again, (
        "rendered again, the template drops it: re-rendering would train on other tokens"
    )


@pytest.mark.parametrize("framework", ["agents_sdk", "langchain"])
def test_agent_frameworks_call_the_tools_the_model_called(made: list[AgentRunner], framework: str) -> None:
    """The OpenAI Agents SDK and LangChain's ChatOpenAI, unchanged, against the endpoint (hermes):
    every request accepted, the calls the model wrote run by the framework, each later request
    extending the record (no prefix mismatch), and the trained tokens the sampled ones."""
    family = FAMILIES["hermes"]
    turns = [family.write(FIND), family.write(LATER, FIND), ANSWER]
    run, script, counted, episode = play(made, family, turns, f"tests.framework_agents:{framework}")
    assert episode.end == "done" and episode.num_model_turns == 3, (episode.end, episode.error, counted)
    assert not [name for name in counted if name.startswith("refused")], counted
    assert counted["agent_prefix_mismatches"] == 0 and counted["agent_malformed_tool_calls"] == 0
    assert [FIND, LATER, FIND] in framework_agents.RAN.values()
    assert model_turns(episode) == script.rows


def test_a_template_that_ends_no_assistant_turn_is_one_config_line_at_the_warm_start() -> None:
    """A demonstrated turn is what the template writes up to the end of the turn (EOS); a
    template that writes no end there is the model's configuration, named in one line."""
    from tests.chat_families import HERMES_CHAT_TEMPLATE

    endless = HERMES_CHAT_TEMPLATE.replace('{{- "<|im_end|>\\n" }}', "")
    assert endless != HERMES_CHAT_TEMPLATE
    family = replace(
        FAMILIES["hermes"], tokenizer=family_tokenizer(endless, ["<|im_start|>", "<|im_end|>"], "<|im_end|>")
    )
    demo = "tests.user_agents:tool_calling_demonstration"
    config = EnvironmentConfig(kind="agent", agent="tests.user_agents:tool_calling", demonstration=demo)
    with pytest.raises(ConfigError) as refused:
        agent_demonstration(family_policy(family), config)(EXAMPLE)
    assert "model.chat_template" in str(refused.value) and "\n" not in str(refused.value)
