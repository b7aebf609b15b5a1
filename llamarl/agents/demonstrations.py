"""Worked episodes for an agent's warm start (`environment.demonstration`): your function writes
a whole conversation for a prompt row in OpenAI form, prompt first, tool calls included, and it
is turned into the text the model reads and writes at run time (`llamarl.agents.messages`), so
the warm start teaches the very tokens the endpoint will record."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llamarl.agents.messages import as_text
from llamarl.agents.play import row_of
from llamarl.envs.base import Message
from llamarl.errors import ConfigError
from llamarl.tasks import Example
from llamarl.user_code import load_named


class AgentDemonstrations:
    """`start` and `demonstration` of an environment, from the function `spec` names."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        write = load_named(spec, "environment.demonstration")
        if not callable(write):
            raise ConfigError(
                f"environment.demonstration {spec}: not a function; write `def "
                f"{spec.partition(':')[2]}(row)` returning the conversation's messages"
            )
        self.write: Callable[[dict[str, Any]], Any] = write
        self.last: tuple[int, list[Message], list[Message]] | None = None

    def _split(self, example: Example) -> tuple[list[Message], list[Message]]:
        """(the prompt's messages, the turns from the first assistant message on)."""
        if self.last is not None and self.last[0] == example.index:
            return self.last[1], self.last[2]
        messages = self.write(row_of(example))
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
        ):
            raise ConfigError(
                f"environment.demonstration {self.spec}: returned {type(messages).__name__}, "
                "not a list of messages ({'role': ..., 'content': ...})"
            )
        texts = [as_text(m) for m in messages]
        first = next((i for i, m in enumerate(texts) if m["role"] == "assistant"), None)
        if not first:
            raise ConfigError(
                f"environment.demonstration {self.spec}: a demonstration is the prompt's "
                "messages, then at least one assistant message"
            )
        self.last = (example.index, texts[:first], texts[first:])
        return texts[:first], texts[first:]

    def start(self, example: Example) -> list[Message]:
        return self._split(example)[0]

    def demonstration(self, example: Example) -> list[Message]:
        return self._split(example)[1]
