"""Calls into code we do not control (an environment's `start` and `step`), run side by side
with one deadline: each returns its value, its exception, or a timeout. A call that overruns is
left running on a daemon thread, so it can neither stall the caller nor keep the process from
exiting."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Outcome:
    value: Any = None
    error: str | None = None
    """`timeout`, or the exception's type and message."""


def bounded_calls(calls: Sequence[Callable[[], Any]], timeout_s: float) -> list[Outcome]:
    """Run `calls` concurrently; each one's outcome, none waited on past `timeout_s`."""
    outcomes: list[Outcome] = [Outcome(error="timeout")] * len(calls)
    finished = [threading.Event() for _ in calls]

    def run(index: int, call: Callable[[], Any]) -> None:
        try:
            outcomes[index] = Outcome(value=call())
        except Exception as err:  # the environment's own failure, reported as its outcome
            outcomes[index] = Outcome(error=f"{type(err).__name__}: {err}"[:200])
        finished[index].set()

    for index, call in enumerate(calls):
        threading.Thread(target=run, args=(index, call), daemon=True).start()
    deadline = time.monotonic() + timeout_s
    for event in finished:
        event.wait(max(0.0, deadline - time.monotonic()))
    return [o if e.is_set() else Outcome(error="timeout") for o, e in zip(outcomes, finished, strict=True)]
