"""How a model calls a tool and reads the result: JSON inside a tag.

A call is `<tool>{"NAME": "ARGUMENT"}</tool>` anywhere in the model's turn: a JSON object with
one key, the tool's name, whose value is the tool's input text (an expression, Python source).
The result comes back as the next message, `<result>TEXT</result>`. A turn without a call is the
model's answer. A malformed call (bad JSON, unknown tool, several keys) is answered with an
`error:` result, so the model can learn to fix it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from llamarl.tools.base import Tool

CALL = re.compile(r"<tool>(.*?)</tool>", re.DOTALL)
MAX_CALL_CHARS = 20_000


def find_call(text: str) -> str | None:
    """The inside of the turn's first `<tool>...</tool>`, or None for an answer."""
    found = CALL.search(text[:MAX_CALL_CHARS])
    return None if found is None else found.group(1)


def write_call(name: str, argument: str) -> str:
    """The text of a call, as a model is taught to write it."""
    return f"<tool>{json.dumps({name: argument})}</tool>"


def result_text(text: str) -> str:
    """The tool's text inside the result tag, which the text cannot close: its `</result`
    becomes `<\\/result` (control characters are escaped where every environment text is,
    in `llamarl.engine.turns`)."""
    inside = text.replace("</result", "<\\/result")
    return f"<result>{inside}</result>"


def run_call(body: str, tools: Mapping[str, Tool]) -> str:
    """The result message's text for the call `body` (the JSON inside the tag)."""
    try:
        request = json.loads(body)
    except ValueError:
        return result_text('error: the call is not JSON; write {"tool": "input"}')
    if not isinstance(request, dict) or len(request) != 1:
        return result_text('error: write one tool and its input, {"tool": "input"}')
    ((name, argument),) = request.items()
    tool = tools.get(name)
    if tool is None:
        return result_text(f"error: no tool {str(name)[:40]!r}; tools: {', '.join(sorted(tools))}")
    if not isinstance(argument, str):
        return result_text("error: the input must be a string")
    return result_text(tool.call(argument))
