"""The pieces of an agent episode's record on the built model: a stop string cuts a turn where
the agent's text ends, a text continuation credits the choice it continues (the longest that
matches), a request that rewrites history restarts the record and is counted, and tool calls in
OpenAI form round-trip to the model's text, whatever schema the request's tools carry."""

from __future__ import annotations

import json

from llamarl.agents.messages import as_text, normal, reply_message
from llamarl.agents.record import AgentEpisode, Choice
from llamarl.agents.responses import sampled_choice
from llamarl.config import ModelConfig
from llamarl.engine.model import build_policy
from llamarl.engine.turns import TurnRenderer
from llamarl.tasks import Example

POLICY = build_policy(ModelConfig(extra_characters='<>/{}":acelorstu'), seed=0)
RENDERER = TurnRenderer(POLICY)


def ids(text: str) -> list[int]:
    return list(POLICY.tokenizer(text, add_special_tokens=False).input_ids)


def test_a_stop_string_cuts_the_turn_before_it() -> None:
    sampled = ids("12+34") + [POLICY.eos_id]
    choice, finish = sampled_choice(POLICY, sampled, [-0.5] * len(sampled), 2, ["+3"])
    assert (choice.text, choice.ids, finish) == ("12", ids("12"), "stop")
    assert choice.logprobs == [-0.5] * 2 and not choice.ended_with_eos
    whole, finish = sampled_choice(POLICY, sampled, [-0.5] * len(sampled), 2, [])
    assert (whole.text, whole.ids, finish) == ("12+34", sampled, "stop")


def test_a_text_continuation_credits_the_longest_choice_it_extends() -> None:
    episode = AgentEpisode(Example(0, "1+1=", "2"))
    episode.requests = 1
    first = episode.text_context(RENDERER, "1+1=")
    short = Choice(ids("1"), [-1.0], 4, "1", False)
    long = Choice(ids("12"), [-1.0, -2.0], 4, "12", False)
    episode.choices = [short, long]
    context = episode.text_context(RENDERER, "1+1=12 = ")
    assert context == first + ids("12") + RENDERER.text_ids(" = ")
    assert episode.versions == [4, 4, -1, -1, -1] and episode.mismatches == 0


def test_a_rewritten_history_restarts_the_record_and_is_counted() -> None:
    episode = AgentEpisode(Example(0, "1+1=", "2"))
    episode.chat_context(RENDERER, [{"role": "user", "content": "1+1="}])
    episode.choices = [Choice(ids("2"), [-1.0], 1, "2", True, {"role": "assistant", "content": "2"})]
    edited = [{"role": "user", "content": "1+2="}, {"role": "assistant", "content": "3"}]
    episode.chat_context(RENDERER, [*edited, {"role": "user", "content": "2+2="}])
    assert episode.mismatches == 1 and episode.tokens == [] and episode.turns == []
    assert episode.length() == len(episode.prompt) - len(POLICY.encode_prompt("1+1="))


def test_tool_calls_round_trip_and_odd_schemas_fall_back_to_input() -> None:
    schema = {"type": "object", "properties": {"expression": {"type": "string"}}}
    tool = {"type": "function", "function": {"name": "calculator", "parameters": schema}}
    text = '<tool>{"calculator": "12*3"}</tool>'
    message = reply_message(text, [tool], "call_0")
    (call,) = message["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"expression": "12*3"}
    assert as_text(message)["content"] == text and normal(message)[2] == (("calculator", "12*3"),)
    odd = {
        "type": "function",
        "function": {"name": "calculator", "parameters": {"properties": {"x": "string"}}},
    }
    (call,) = reply_message(text, [odd], "call_1")["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"input": "12*3"}
    assert reply_message(text, [], "call_2") == {"role": "assistant", "content": text}
    result = as_text({"role": "tool", "tool_call_id": "call_0", "content": "36"})
    assert result == {"role": "tool", "content": "<result>36</result>"}


def test_only_the_chat_templates_own_markup_becomes_control_tokens() -> None:
    policy = build_policy(ModelConfig(extra_characters='<>/{}":acelorstu'), seed=0)
    policy.tokenizer.chat_template = (
        "{% for m in messages %}{{ m.role[0] }}:{{ m.content }}<eos>{% endfor %}"
        "{% if add_generation_prompt %}a:{% endif %}"
    )
    policy.chat = True
    renderer = TurnRenderer(policy)
    eos = policy.eos_id
    plain = AgentEpisode(Example(0, "1+1=", "2"))
    assert plain.chat_context(renderer, [{"role": "user", "content": "1+1="}]) == ids("u:1+1=") + [eos] + ids("a:")
    typed = [{"role": "user", "content": "1<eos>"}, {"role": "assistant", "content": "<eos>2"}]
    episode = AgentEpisode(Example(0, "1+1=", "2"))
    context = episode.chat_context(renderer, [*typed, {"role": "user", "content": "3="}])
    spelled = RENDERER.text_ids
    turns = [*ids("u:"), *spelled("1<eos>"), eos, *ids("a:"), *spelled("<eos>2"), eos]
    assert context == [*turns, *ids("u:3="), eos, *ids("a:")]
    assert context.count(eos) == 3  # the template's, after each message
