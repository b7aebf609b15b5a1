"""OpenAI chat messages as the model reads them, by tool format (`environment.tool_format`).

llamarl's own format writes calls and results into the text (`llamarl.agents.messages.as_text`).
A model family's format (hermes, mistral, llama3_json) hands them to its chat template as they
are: the content as text, each call with its id and its arguments as a JSON object (templates
write `arguments | tojson`; arguments that are no JSON object stay their text), and a tool
message's `tool_call_id` and `name`. The template then writes the calls and results as the
family's models were trained on them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from llamarl.agents.messages import as_text, content_text


def _arguments(text: Any) -> Any:
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def for_template(message: Mapping[str, Any]) -> dict[str, Any]:
    """`message` as a family's chat template reads it."""
    read: dict[str, Any] = {"role": message["role"], "content": content_text(message.get("content"))}
    calls = message.get("tool_calls")
    if calls:
        read["tool_calls"] = [
            {
                "id": call.get("id"),
                "type": "function",
                "function": {
                    "name": call["function"]["name"],
                    "arguments": _arguments(call["function"].get("arguments")),
                },
            }
            for call in calls
        ]
    for key in ("tool_call_id", "name"):
        if message.get(key) is not None:
            read[key] = message[key]
    return read


def model_reads(message: Mapping[str, Any], tool_format: str) -> dict[str, Any]:
    """`message` as the model reads it in `tool_format`."""
    return dict(as_text(message)) if tool_format == "llamarl" else for_template(message)


def template_tools(tools: list[dict[str, Any]] | None, tool_format: str) -> list[dict[str, Any]] | None:
    """The tools handed to the chat template in `tool_format`: a family's template is given
    those offered; llamarl's format writes calls into the text and shows none (None: none)."""
    return (tools or None) if tool_format != "llamarl" else None
