"""Worked episodes for an agent's warm start (`environment.demonstration`): your function writes
a whole conversation for a prompt row in OpenAI form, prompt first, tool calls included, and it
is turned into the tokens the model reads and writes at run time, so the warm start teaches the
very tokens the endpoint will record.

The function returns the conversation's messages, or, as OpenAI's fine-tuning files hold a tool
conversation, `{"messages": [...], "tools": [...]}`: in a model family's tool format
(`environment.tool_format`) the tools then reach the chat template, which writes the model's
calls as the family's models write them (`llamarl.agents.chat_forms`); in llamarl's format the
calls are written into the text (`llamarl.agents.messages`) and the tools are not shown.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llamarl.agents.chat_forms import model_reads, template_tools
from llamarl.agents.play import row_of
from llamarl.errors import ConfigError
from llamarl.tasks import Example
from llamarl.user_code import load_named

Demonstrated = tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]] | None]
"""(the prompt's messages, the turns from the first assistant message on, the tools offered)."""


class AgentDemonstrations:
    """`start`, `demonstration` and `tools` of an environment, from the function `spec` names,
    its messages as the model reads them in `tool_format`."""

    def __init__(self, spec: str, tool_format: str = "llamarl") -> None:
        self.spec = spec
        self.tool_format = tool_format
        write = load_named(spec, "environment.demonstration")
        if not callable(write):
            raise ConfigError(
                f"environment.demonstration {spec}: not a function; write `def "
                f"{spec.partition(':')[2]}(row)` returning the conversation's messages"
            )
        self.write: Callable[[dict[str, Any]], Any] = write
        self.last: tuple[int, Demonstrated] | None = None

    def _written(self, example: Example) -> tuple[Any, Any]:
        """(messages, tools) as the function wrote them."""
        written = self.write(row_of(example))
        if isinstance(written, dict) and set(written) <= {"messages", "tools"}:
            return written.get("messages"), written.get("tools")
        return written, None

    def _split(self, example: Example) -> Demonstrated:
        if self.last is not None and self.last[0] == example.index:
            return self.last[1]
        messages, tools = self._written(example)
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
        ):
            raise ConfigError(
                f"environment.demonstration {self.spec}: returned {type(messages).__name__}, "
                "not a list of messages ({'role': ..., 'content': ...}) nor "
                "{'messages': [...], 'tools': [...]}"
            )
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise ConfigError(
                f"environment.demonstration {self.spec}: its tools are {type(tools).__name__}, "
                "not a list of tools in OpenAI form ({'type': 'function', 'function': {...}})"
            )
        texts = [model_reads(m, self.tool_format) for m in messages]
        first = next((i for i, m in enumerate(texts) if m["role"] == "assistant"), None)
        if not first:
            raise ConfigError(
                f"environment.demonstration {self.spec}: a demonstration is the prompt's "
                "messages, then at least one assistant message"
            )
        split: Demonstrated = (texts[:first], texts[first:], template_tools(tools, self.tool_format))
        self.last = (example.index, split)
        return split

    def start(self, example: Example) -> list[dict[str, Any]]:
        return self._split(example)[0]

    def demonstration(self, example: Example) -> list[dict[str, Any]]:
        return self._split(example)[1]

    def tools(self, example: Example) -> list[dict[str, Any]] | None:
        """The tools the chat template is handed for `example`'s conversation (None: none)."""
        return self._split(example)[2]
