"""Tool calls in a model family's own format: a sampled assistant turn's text becomes the OpenAI
message the endpoint answers with, `{"role": "assistant", "content", "tool_calls"}`, each call
`{"id", "type": "function", "function": {"name", "arguments": JSON text}}` with a fresh id.

`FORMATS` names the families:
- `hermes` (Hermes 2 Pro, Qwen2.5, Qwen3): content, then one or more
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.
- `mistral`: content, then `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.
- `llama3_json` (Llama 3.1-3.3): the whole turn is `{"name": ..., "parameters": {...}}` objects
  (`arguments` is read too) separated by `;`, optionally after `<|python_tag|>`.
- `llamarl`: our character models' `<tool>{"NAME": "INPUT"}</tool>`, as
  `llamarl.agents.messages.reply_message` reads it (its first call, one string input).

hermes and mistral are read by transformers' response parser (`tokenizer.parse_response`) with the
`response_template`s below; given the request's tools, it casts a quoted argument by the tool's
JSON schema (`"7"` becomes 7 for an integer parameter); a string argument holding `</tool_call>`
ends its hermes call there (the call is then malformed). llama3_json cannot be written as a
template: its calls have no markup around them, and the `;` between two calls can only be told
from a `;` inside a string argument (`{"code": "a = {}; b = 1"}`) by reading the JSON, which a
template's delimiter patterns do not; so it has its own parser, `json.JSONDecoder.raw_decode` call
after call, which keeps the JSON's own types and casts nothing.

A turn parses whole or is plain text: when any call in it is malformed (not JSON, not a name and
an arguments object, or a tool the request did not offer), the message is the turn's text as its
content, and the number of malformed calls comes back beside it (1 when the turn's call markup
does not parse at all); nothing is raised. The text must be the turn decoded with its special
tokens (`skip_special_tokens=False`) and without its EOS: `[TOOL_CALLS]` and `<|python_tag|>` are
special tokens, which a plain decode drops.

Speed, measured on a 211-character hermes reply with two calls (2-core CPU, transformers 5.25,
best of 5 x 2000): `tokenizer.parse_response` 0.13-0.15 ms, a regex and `json.loads` 0.01 ms (10-16x
faster); half of the parser's time is checking the template on each call (0.07 ms precompiled).
We take the parser all the same: 0.15 ms is noise beside the milliseconds to seconds a sampled
turn costs, and the parser brings the schema casts and a template per family instead of code.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable, Mapping
from typing import Any

from transformers import PreTrainedTokenizerBase

from llamarl.agents.messages import reply_message
from llamarl.tools.calls import CALL

Tools = list[dict[str, Any]]
"""The tools a request offers, in OpenAI form: {"type": "function", "function": {"name", ...}}."""

ToolFormat = Callable[[PreTrainedTokenizerBase, str, Tools], tuple[str | None, list[Any]]]
"""How a family's turn splits, (tokenizer, text, tools) -> (content, the calls found, each
{"name", "arguments"} when whole); raises ValueError, KeyError or RecursionError when the turn's
call markup does not parse."""

HERMES_RESPONSE_TEMPLATE: dict[str, Any] = {
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            # The leading \s* takes the newlines before and between calls, so they open no content.
            "open_pattern": r"\s*<tool_call>",
            "close": "</tool_call>",
            "repeats": True,
            "content": "json",
            # A call that is not JSON stays its text, so each call is counted on its own.
            "content_args": {"allow_non_json": True},
            "transform": {"type": "function", "function": "{content}"},
        },
        # Text after a call would replace the text before it unless the pieces are joined.
        "content": {"content": "text", "repeats": True, "join": "\n"},
    },
}

MISTRAL_RESPONSE_TEMPLATE: dict[str, Any] = {
    "start_anchor": ["[/INST]", "[/TOOL_RESULTS]"],
    "fields": {
        "tool_calls": {
            "open": "[TOOL_CALLS]",
            "content": "json",
            "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{arguments}"}},
            "transform_each": True,
        },
        "content": {"content": "text"},
    },
}

PYTHON_TAG = "<|python_tag|>"
_SEPARATOR = re.compile(r"\s*;\s*")


def _by_template(template: dict[str, Any]) -> ToolFormat:
    """Reads a turn with transformers' response parser and `template`."""

    def split(tokenizer: PreTrainedTokenizerBase, text: str, tools: Tools) -> tuple[str | None, list[Any]]:
        parsed = tokenizer.parse_response(text, schema=template, prefix="", tools=[*tools])
        content = (parsed.get("content") or "").strip() or None  # joined pieces may end in "\n"
        return content, [call["function"] for call in parsed.get("tool_calls", [])]

    return split


def _llama3_call(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    return {"name": value.get("name"), "arguments": value.get("parameters", value.get("arguments"))}


def _split_llama3(tokenizer: PreTrainedTokenizerBase, text: str, tools: Tools) -> tuple[str | None, list[Any]]:
    body = text.strip().removeprefix(PYTHON_TAG).lstrip()
    if not body.startswith("{"):
        return text, []
    decoder, calls, at = json.JSONDecoder(), [], 0
    while True:
        value, at = decoder.raw_decode(body, at)
        calls.append(_llama3_call(value))
        if at == len(body):
            return None, calls
        separator = _SEPARATOR.match(body, at)
        if separator is None:
            raise ValueError(f"text after a call at {at}, not `;` and the next call")
        at = separator.end()


def _split_llamarl(tokenizer: PreTrainedTokenizerBase, text: str, tools: Tools) -> tuple[str | None, list[Any]]:
    message = reply_message(text, tools, "")
    if "tool_calls" not in message:
        return text, [None] if CALL.search(text) else []
    (call,) = message["tool_calls"]
    function = call["function"]
    return message["content"], [{"name": function["name"], "arguments": json.loads(function["arguments"])}]


FORMATS: dict[str, ToolFormat] = {
    "hermes": _by_template(HERMES_RESPONSE_TEMPLATE),
    "mistral": _by_template(MISTRAL_RESPONSE_TEMPLATE),
    "llama3_json": _split_llama3,
    "llamarl": _split_llamarl,
}


MARKERS = (
    ("<tool_call>", "hermes"),
    ("[TOOL_CALLS]", "mistral"),
    (PYTHON_TAG, "llama3_json"),
    ("<|start_header_id|>ipython", "llama3_json"),
)
"""What a chat template writes for each family's calls or results, in the order they are looked
for (Llama 3.2's template writes no python tag, only the ipython role of tool results)."""


def format_of(configured: str, tokenizer: PreTrainedTokenizerBase, chat: bool) -> str:
    """The family `environment.tool_format` names; for auto, the first of MARKERS the model's
    chat template holds (llamarl when none does, or the model has no template)."""
    if configured != "auto":
        return configured
    template = tokenizer.chat_template if chat else None
    texts = template.values() if isinstance(template, dict) else [template or ""]
    return next((fmt for marker, fmt in MARKERS if any(marker in text for text in texts)), "llamarl")


def call_ids(fmt: str) -> Callable[[], str]:
    """Fresh tool call ids as the family's templates accept them: mistral's are nine letters and
    digits (its templates refuse others), the others `call_` and 24 hex digits, as OpenAI's."""
    if fmt == "mistral":
        return lambda: "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))
    return lambda: f"call_{secrets.token_hex(12)}"


def _call(found: Any, offered: set[str]) -> dict[str, Any] | None:
    """The OpenAI call (without its id) for a call found, or None when it is malformed."""
    if not isinstance(found, Mapping) or not isinstance(found.get("arguments"), dict):
        return None
    name = found.get("name")
    if not isinstance(name, str) or name not in offered:
        return None
    try:  # Python's JSON reads NaN and Infinity, which JSON text cannot hold
        arguments = json.dumps(found["arguments"], allow_nan=False)
    except ValueError:
        return None
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def parse_reply(
    tokenizer: PreTrainedTokenizerBase, fmt: str, text: str, tools: Tools, call_ids: Callable[[], str]
) -> tuple[dict[str, Any], int]:
    """The assistant message for a sampled turn's `text` in the family `fmt`'s format (a key of
    FORMATS), and how many malformed calls it held (then the message is the text, no calls)."""
    split = FORMATS[fmt]
    plain = {"role": "assistant", "content": text}
    try:
        content, found = split(tokenizer, text, tools)
    except (ValueError, KeyError, RecursionError):
        return plain, 1
    offered = {tool["function"]["name"] for tool in tools}
    calls = [_call(one, offered) for one in found]
    malformed = sum(call is None for call in calls)
    if malformed or not calls:
        return plain, malformed
    with_ids = [{"id": call_ids(), **call} for call in calls if call is not None]
    return {"role": "assistant", "content": content, "tool_calls": with_ids}, 0
