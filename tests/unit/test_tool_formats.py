"""Tool calls in each family's own format (`llamarl.agents.tool_formats`): a sampled turn with
calls becomes OpenAI `tool_calls` with JSON arguments and a fresh id each, a malformed call
(bad JSON, an unknown tool, nested too deep) is counted and the turn stays text, a plain answer
has no calls, and the family's chat template renders the parsed calls and their results.

Each family gets a real tokenizer and a chat template written after the family's own
(tests/chat_families.py)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest

from llamarl.agents.tool_formats import PYTHON_TAG, parse_reply
from tests.chat_families import (
    FAMILIES,
    FIND,
    LATER,
    TOOLS,
    Family,
)

each_family = pytest.mark.parametrize("family", FAMILIES.values(), ids=FAMILIES.keys())


def ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def parse(family: Family, text: str, call_ids: Callable[[], str] | None = None) -> tuple[dict[str, Any], int]:
    return parse_reply(family.tokenizer, family.name, text, TOOLS, call_ids or ids())


def called(message: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]]


@each_family
def test_each_tool_parses_into_a_call_with_json_arguments(family: Family) -> None:
    message, malformed = parse(family, family.write(FIND))
    assert malformed == 0 and message["content"] is None
    assert called(message) == [("call_0", "search", {"query": "llamas", "site": "wiki"})]
    assert message["tool_calls"][0]["type"] == "function"
    message, malformed = parse(family, family.write(LATER))
    assert malformed == 0 and called(message) == [("call_0", "add_days", {"days": 3})]


@each_family
def test_parallel_calls_in_one_turn_each_get_a_fresh_id(family: Family) -> None:
    message, malformed = parse(family, family.write(FIND, LATER))
    assert malformed == 0
    assert called(message) == [("call_0", *FIND), ("call_1", *LATER)]


@each_family
def test_a_quoted_integer_is_cast_by_the_tools_schema_where_the_parser_casts(family: Family) -> None:
    message, malformed = parse(family, family.write(("add_days", {"days": "3"})))
    days = json.loads(message["tool_calls"][0]["function"]["arguments"])["days"]
    assert malformed == 0 and days == (3 if family.casts else "3")


@each_family
def test_malformed_calls_are_counted_and_the_turn_stays_text(family: Family) -> None:
    call_ids = ids()
    bad_json = family.turn([family.call(*FIND)[:-1]])
    unknown = family.write(("delete_files", {"path": "/"}))
    one_bad_of_two = family.write(FIND, ("delete_files", {"path": "/"}))
    not_an_object = family.write(("search", ["llamas"]))
    too_deep = family.turn(['{"name": ' + "[" * 100_000])
    not_json_text = family.write(("add_days", {"days": float("nan")}))  # Python reads NaN; JSON has none
    for text in (bad_json, unknown, one_bad_of_two, not_an_object, too_deep, not_json_text):
        assert parse(family, text, call_ids) == ({"role": "assistant", "content": text}, 1)
    both_unknown = family.write(("rm", {}), ("rm", {}))
    assert parse(family, both_unknown, call_ids) == ({"role": "assistant", "content": both_unknown}, 2)
    assert call_ids() == "call_0"  # no id spent on a turn that stays text


@each_family
def test_a_plain_answer_has_no_tool_calls(family: Family) -> None:
    text = "The llama lives in the Andes; it eats grass."
    assert parse(family, text) == ({"role": "assistant", "content": text}, 0)


@each_family
def test_no_tool_offered_makes_every_call_malformed(family: Family) -> None:
    text = family.write(FIND)
    assert parse_reply(family.tokenizer, family.name, text, [], ids()) == ({"role": "assistant", "content": text}, 1)


@pytest.mark.parametrize("family", [FAMILIES["hermes"], FAMILIES["mistral"]], ids=["hermes", "mistral"])
def test_the_text_before_the_calls_is_the_content(family: Family) -> None:
    text = "Let me look that up.\n" + family.write(FIND, LATER)
    message, malformed = parse(family, text)
    assert malformed == 0 and message["content"] == "Let me look that up."
    assert [name for _, name, _ in called(message)] == ["search", "add_days"]


def test_hermes_keeps_the_text_around_its_calls_and_counts_each_bad_call() -> None:
    family = FAMILIES["hermes"]
    around = "Let me look that up.\n" + family.write(FIND) + "\nThen I will answer.\n"
    message, malformed = parse(family, around)
    assert malformed == 0 and message["content"] == "Let me look that up.\nThen I will answer."
    trailing = "Let me look that up.\n" + family.write(FIND) + "\n"
    assert parse(family, trailing)[0]["content"] == "Let me look that up."
    two_bad = family.turn([family.call(*FIND)[:-1], family.call(*LATER)[:-1]])
    assert parse(family, two_bad) == ({"role": "assistant", "content": two_bad}, 2)


def test_llama3_reads_the_python_tag_and_a_separator_inside_a_string() -> None:
    family = FAMILIES["llama3_json"]
    tagged, malformed = parse(family, PYTHON_TAG + family.write(FIND, LATER))
    assert malformed == 0 and called(tagged) == [("call_0", *FIND), ("call_1", *LATER)]
    tricky = ("search", {"query": 'a}; {"name": "add_days"', "site": "x; y"})
    message, malformed = parse(family, family.write(tricky))
    assert malformed == 0 and called(message) == [("call_0", *tricky)]
    also_arguments = json.dumps({"name": "search", "arguments": FIND[1]})
    assert called(parse(family, also_arguments)[0]) == [("call_0", *FIND)]


@pytest.mark.parametrize("name", ["mistral", "llama3_json"])
def test_a_marker_is_a_special_token_kept_only_by_a_decode_with_special_tokens(name: str) -> None:
    family = FAMILIES[name]
    text = family.write(FIND)
    if name == "llama3_json":
        text = PYTHON_TAG + text
    sampled = family.tokenizer(text, add_special_tokens=False).input_ids
    kept = family.tokenizer.decode(sampled, skip_special_tokens=False)
    assert kept == text and called(parse(family, kept)[0]) == [("call_0", *FIND)]
    dropped = family.tokenizer.decode(sampled, skip_special_tokens=True)
    assert len(dropped) < len(text)


@each_family
def test_the_template_renders_the_parsed_calls_and_their_results(family: Family) -> None:
    sampled = family.write(FIND, LATER)
    message, _ = parse(family, sampled)
    calls = message["tool_calls"]
    results = ["Llamas are South American camelids.", "2025-06-04"]
    conversation = [
        {"role": "user", "content": "What are llamas, and what date is it in 3 days?"},
        message,
        *({"role": "tool", "tool_call_id": c["id"], "content": r} for c, r in zip(calls, results, strict=True)),
    ]
    rendered = family.tokenizer.apply_chat_template(
        conversation, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert isinstance(rendered, str) and '"add_days"' in rendered.split("llamas, and")[0]
    assert all(result in rendered for result in results)
    assert all(c["function"]["arguments"] in rendered for c in calls)
    if family.renders_ids:
        assert all(f'"call_id": "{c["id"]}"' in rendered for c in calls)
    else:
        assert sampled in rendered  # as the model wrote them


def test_the_llamarl_format_is_reply_message_with_fresh_ids() -> None:
    tokenizer = FAMILIES["hermes"].tokenizer
    schema = {"type": "object", "properties": {"expression": {"type": "string"}}}
    calculator = [{"type": "function", "function": {"name": "calculator", "parameters": schema}}]
    call_ids = ids()
    text = 'Let me compute: <tool>{"calculator": "12*3"}</tool>'
    message, malformed = parse_reply(tokenizer, "llamarl", text, calculator, call_ids)
    assert malformed == 0 and message["content"] == "Let me compute: "
    assert called(message) == [("call_0", "calculator", {"expression": "12*3"})]
    for bad in ('<tool>{"calculator": 12}</tool>', '<tool>{"python": "1"}</tool>', "<tool>12*3</tool>"):
        assert parse_reply(tokenizer, "llamarl", bad, calculator, call_ids) == (
            {"role": "assistant", "content": bad},
            1,
        )
    assert parse_reply(tokenizer, "llamarl", "36", calculator, call_ids) == ({"role": "assistant", "content": "36"}, 0)
