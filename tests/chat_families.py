"""Chat families for tests of tool calls in a model family's own format: each family's
tokenizer (the character tokenizer plus the family's markers as special tokens, its end of turn
as EOS) and a chat template written after the family's own (tools, assistant `tool_calls`,
`tool` messages with their `tool_call_id`), how the family writes a call, and two tools: one
taking two strings, one an integer."""

from __future__ import annotations

import json
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerFast

from llamarl.agents.tool_formats import PYTHON_TAG
from llamarl.engine.tokenizer import build_char_tokenizer

SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search one site.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "site": {"type": "string"}},
            "required": ["query", "site"],
        },
    },
}
ADD_DAYS = {
    "type": "function",
    "function": {
        "name": "add_days",
        "description": "The date so many days from today.",
        "parameters": {"type": "object", "properties": {"days": {"type": "integer"}}, "required": ["days"]},
    },
}
TOOLS = [SEARCH, ADD_DAYS]
FIND = ("search", {"query": "llamas", "site": "wiki"})
LATER = ("add_days", {"days": 3})

HERMES_CHAT_TEMPLATE = r"""
{%- if tools %}
{{- "<|im_start|>system\nYou may call functions, whose signatures are in <tools></tools>:\n<tools>" }}
{%- for tool in tools %}{{ "\n" + tool | tojson }}{% endfor %}
{{- '\n</tools>\nCall one as <tool_call>\n{"name": <name>, "arguments": <object>}\n</tool_call><|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == "assistant" %}
{{- "<|im_start|>assistant" }}
{%- if message.content %}{{ "\n" + message.content }}{% endif %}
{%- for call in message.tool_calls or [] %}
{%- set arguments = call.function.arguments %}
{%- if arguments is not string %}{% set arguments = arguments | tojson %}{% endif %}
{{- '\n<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' + arguments + '}\n</tool_call>' }}
{%- endfor %}
{{- "<|im_end|>\n" }}
{%- elif message.role == "tool" %}
{%- if loop.first or messages[loop.index0 - 1].role != "tool" %}{{ "<|im_start|>user" }}{% endif %}
{{- "\n<tool_response>\n" + message.content + "\n</tool_response>" }}
{%- if loop.last or messages[loop.index0 + 1].role != "tool" %}{{ "<|im_end|>\n" }}{% endif %}
{%- else %}
{{- "<|im_start|>" + message.role + "\n" + message.content + "<|im_end|>\n" }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ "<|im_start|>assistant\n" }}{% endif %}"""

LLAMA3_CHAT_TEMPLATE = r"""
{{- "<|begin_of_text|>" }}
{%- for message in messages %}
{%- if message.role == "user" and tools and loop.first %}
{{- "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, answer with a JSON " }}
{{- 'function call, {"name": function name, "parameters": its arguments}.\n\n' }}
{%- for tool in tools %}{{ tool | tojson + "\n\n" }}{% endfor %}
{{- message.content + "<|eot_id|>" }}
{%- elif message.role == "assistant" and message.tool_calls %}
{{- "<|start_header_id|>assistant<|end_header_id|>\n\n" }}
{%- for call in message.tool_calls %}
{%- set arguments = call.function.arguments %}
{%- if arguments is not string %}{% set arguments = arguments | tojson %}{% endif %}
{{- '{"name": "' + call.function.name + '", "parameters": ' + arguments + '}' }}
{%- if not loop.last %}{{ "; " }}{% endif %}
{%- endfor %}
{{- "<|eot_id|>" }}
{%- elif message.role == "tool" %}
{{- "<|start_header_id|>ipython<|end_header_id|>\n\n" + message.content + "<|eot_id|>" }}
{%- else %}
{{- "<|start_header_id|>" + message.role + "<|end_header_id|>\n\n" + message.content + "<|eot_id|>" }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ "<|start_header_id|>assistant<|end_header_id|>\n\n" }}{% endif %}"""

MISTRAL_CHAT_TEMPLATE = r"""
{%- for message in messages %}
{%- if message.role == "user" %}
{%- if tools and loop.first %}{{ "[AVAILABLE_TOOLS]" + tools | tojson + "[/AVAILABLE_TOOLS]" }}{% endif %}
{{- "[INST]" + message.content + "[/INST]" }}
{%- elif message.role == "assistant" and message.tool_calls %}
{{- message.content or "" }}[TOOL_CALLS][
{%- for call in message.tool_calls %}
{%- set arguments = call.function.arguments %}
{%- if arguments is not string %}{% set arguments = arguments | tojson %}{% endif %}
{{- '{"name": "' + call.function.name + '", "arguments": ' + arguments + ', "id": "' + call.id + '"}' }}
{%- if not loop.last %}{{ ", " }}{% endif %}
{%- endfor %}
{{- "]" + eos_token }}
{%- elif message.role == "assistant" %}
{{- message.content + eos_token }}
{%- elif message.role == "tool" %}
{{- '[TOOL_RESULTS]{"content": ' + message.content | tojson + ', "call_id": "' + message.tool_call_id + '"}' }}
{{- "[/TOOL_RESULTS]" }}
{%- endif %}
{%- endfor %}"""


def family_tokenizer(template: str, markers: list[str], eos: str | None = None) -> PreTrainedTokenizerFast:
    """The character tokenizer with `markers` as special tokens and `eos`, one of them, as its
    end of sequence (the family's end of turn; else the character tokenizer's own)."""
    tokenizer = build_char_tokenizer(string.printable)
    tokenizer.add_tokens(markers, special_tokens=True)
    tokenizer.chat_template = template
    if eos is not None:
        tokenizer.eos_token = eos
    return tokenizer


@dataclass(frozen=True)
class Family:
    name: str
    tokenizer: PreTrainedTokenizerFast
    call: Callable[[str, Any], str]
    """One call's JSON text, as the family writes it."""
    turn: Callable[[list[str]], str]
    """A turn of calls, from their JSON texts."""
    casts: bool
    """Whether a quoted argument is cast by the tool's schema (transformers' parser)."""
    renders_ids: bool
    """Whether the family's template writes the call ids."""

    def write(self, *calls: tuple[str, Any]) -> str:
        return self.turn([self.call(name, arguments) for name, arguments in calls])


def _hermes_turn(calls: list[str]) -> str:
    return "\n".join(f"<tool_call>\n{call}\n</tool_call>" for call in calls)


LLAMA3_MARKERS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", PYTHON_TAG]
MISTRAL_MARKERS = [
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[INST]",
    "[/INST]",
    "[TOOL_CALLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
]

FAMILIES = {
    "hermes": Family(
        "hermes",
        family_tokenizer(HERMES_CHAT_TEMPLATE, ["<|im_start|>", "<|im_end|>"], "<|im_end|>"),
        lambda name, arguments: json.dumps({"name": name, "arguments": arguments}),
        _hermes_turn,
        casts=True,
        renders_ids=False,
    ),
    "llama3_json": Family(
        "llama3_json",
        family_tokenizer(LLAMA3_CHAT_TEMPLATE, LLAMA3_MARKERS, "<|eot_id|>"),
        lambda name, arguments: json.dumps({"name": name, "parameters": arguments}),
        "; ".join,
        casts=False,
        renders_ids=False,
    ),
    "mistral": Family(
        "mistral",
        family_tokenizer(MISTRAL_CHAT_TEMPLATE, MISTRAL_MARKERS),
        lambda name, arguments: json.dumps({"name": name, "arguments": arguments}),
        lambda calls: f"[TOOL_CALLS][{', '.join(calls)}]",
        casts=True,
        renders_ids=True,
    ),
}

THINKING_HERMES_CHAT_TEMPLATE = HERMES_CHAT_TEMPLATE.replace(
    '{%- if message.content %}{{ "\\n" + message.content }}{% endif %}',
    "{%- set content = message.content or '' %}"
    "{%- if not loop.last and '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}"
    '{%- if content %}{{ "\\n" + content }}{% endif %}',
)
"""Hermes as Qwen3 writes it: an assistant turn's reasoning (up to `</think>`) is dropped once
the turn is no longer the last message, so a conversation rendered again differs from what the
model read and wrote."""
assert THINKING_HERMES_CHAT_TEMPLATE != HERMES_CHAT_TEMPLATE
