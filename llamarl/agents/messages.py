"""OpenAI chat messages in the form the model reads and writes them.

The model calls a tool as llamarl's models do (`llamarl.tools.calls`): `<tool>{"NAME": "INPUT"}
</tool>` in its turn, and reads the result as `<result>TEXT</result>`. So a request's tool
message is the model's result text, and an assistant message with `tool_calls` is the text a
model writes for them. The other way, a sampled turn becomes the message the endpoint answers
with: its first well-formed call (to a tool the request offers) as a `tool_calls` entry, whose
`arguments` are a JSON object holding the input under the tool's one string parameter (`input`
when its schema names none), and the text before it as the content.

A message is compared with what the endpoint answered in its normal form (`normal`): role,
content text, and each call's name and input.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from llamarl.envs.base import Message
from llamarl.tools.calls import CALL, result_text, write_call

DEFAULT_PARAMETER = "input"

Normal = tuple[str, str, tuple[tuple[str, str], ...]]
"""(role, content, ((tool name, input), ...)): a message as compared for a verified prefix."""


def content_text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))


def call_input(arguments: str) -> str:
    """The input a call's `arguments` carry: the value of a one-key JSON object of a string,
    else the arguments in one normal JSON text (keys sorted, no spaces: a client that writes
    them again in its own spacing sends the same call), or their text when they are no JSON."""
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return arguments
    if isinstance(value, dict) and len(value) == 1:
        (inside,) = value.values()
        if isinstance(inside, str):
            return inside
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def normal(message: Mapping[str, Any]) -> Normal:
    calls = tuple(
        (str(call["function"]["name"]), call_input(str(call["function"]["arguments"])))
        for call in message.get("tool_calls") or ()
    )
    return str(message["role"]), content_text(message.get("content")), calls


def as_text(message: Mapping[str, Any]) -> Message:
    """The message as the model reads it: {"role", "content"} with its calls or result written
    in the model's form."""
    role, content, calls = normal(message)
    if role == "tool":
        return {"role": role, "content": result_text(content)}
    return {"role": role, "content": content + "".join(write_call(n, i) for n, i in calls)}


def parameter_of(tools: Sequence[Mapping[str, Any]], name: str) -> str | None:
    """The one string parameter of the offered function `name` (DEFAULT_PARAMETER when its
    schema names no single one); None when the request does not offer it."""
    for tool in tools:
        function = tool.get("function") or {}
        if function.get("name") != name:
            continue
        properties = (function.get("parameters") or {}).get("properties")
        if not isinstance(properties, Mapping):
            return DEFAULT_PARAMETER
        strings = [
            name
            for name, schema in properties.items()
            if isinstance(schema, Mapping) and schema.get("type") == "string"
        ]
        return strings[0] if len(strings) == 1 else DEFAULT_PARAMETER
    return None


def reply_message(text: str, tools: Sequence[Mapping[str, Any]], call_id: str) -> dict[str, Any]:
    """The assistant message for a sampled turn's text: with a `tool_calls` entry when it holds a
    well-formed call of an offered tool, else its text as the content."""
    found = CALL.search(text) if tools else None
    if found is not None:
        try:
            request = json.loads(found.group(1))
        except ValueError:
            request = None
        if isinstance(request, dict) and len(request) == 1:
            ((name, argument),) = request.items()
            parameter = parameter_of(tools, str(name))
            if parameter is not None and isinstance(argument, str):
                call = {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps({parameter: argument})},
                }
                before = text[: found.start()]
                return {"role": "assistant", "content": before or None, "tool_calls": [call]}
    return {"role": "assistant", "content": text}
