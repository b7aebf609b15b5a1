"""Tools a model can call from inside an episode: the `Tool` interface, the calculator
(arithmetic without `eval`) and the Python runner (a sandboxed separate process).

How a model calls a tool, and what comes back, is `llamarl.tools.calls`."""

from llamarl.tools.base import Tool

__all__ = ["Tool"]
