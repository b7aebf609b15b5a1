"""Calling user code with a time limit (`task.reward_timeout_s`).

A plain function is cut by SIGALRM when it runs in the main thread (the reward role's loop and
the sync run's both do), which interrupts Python code between two bytecodes; elsewhere it runs
in a daemon thread that is given up on at the deadline (Python cannot stop a thread: it runs on
until it returns, and its result is dropped). An `async def` function is awaited under
`asyncio.wait_for`, which cancels it.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Awaitable, Callable, Sequence
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")


class RewardTimeout(Exception):
    """A call ran past its deadline and was cut (or given up on)."""


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise RewardTimeout


def call_within(timeout_s: float, function: Callable[[], T]) -> T:
    """`function()`, or RewardTimeout once it has run `timeout_s`."""
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            return function()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append((True, function()))
        except BaseException as err:  # handed back to the caller below
            outcome.append((False, err))

    thread = threading.Thread(target=target, name="reward-call", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not outcome:
        raise RewardTimeout
    succeeded, value = outcome[0]
    if not succeeded:
        raise value
    return value


def await_all_within(
    timeout_s: float, calls: Sequence[Callable[[], Awaitable[T]]]
) -> list[T | BaseException]:
    """Each call's awaited result, all awaited at once, each cut after `timeout_s`; a call that
    raised (RewardTimeout for one cut) gives its exception in its place."""

    async def one(call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await asyncio.wait_for(call(), timeout_s)
        except asyncio.TimeoutError:
            raise RewardTimeout from None

    async def every() -> list[T | BaseException]:
        return await asyncio.gather(*(one(call) for call in calls), return_exceptions=True)

    return asyncio.run(every())
