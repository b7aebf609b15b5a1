"""The interface every tool implements: a name the model calls it by and one call, text in and
text out. A tool never raises for bad input from the model: what went wrong is its result."""

from __future__ import annotations

from typing import Protocol


class Tool(Protocol):
    name: str
    """What the model writes to call it (`{"calculator": "12*34"}`)."""

    def call(self, argument: str) -> str:
        """The result the model reads back: an answer, or one line saying what went wrong."""
        ...
