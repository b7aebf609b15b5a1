"""Calling user code with a time limit (`task.reward_timeout_s`).

A plain function in the main thread (the reward role's loop and the sync run's both run there)
is cut by SIGALRM, which interrupts Python code between two bytecodes. A watchdog thread sends
the signal at the deadline and again every `RESEND_S` until the call has ended, so user code
that catches exceptions broadly, or a library that cancels alarms or sets a SIGALRM handler of
its own for a while (math-verify does), still cannot outlast it. `RewardTimeout` is a
BaseException, so an `except Exception` in user code does not swallow it. Elsewhere a plain
function runs in a daemon thread that is given up on at the deadline (Python cannot stop a
thread: it runs on until it returns, and its result is dropped).

`async def` functions run on the process's one event loop (`EventLoop.shared`, in a daemon
thread), so module state bound to a loop (a client, a semaphore) serves every call; each call is awaited
under `asyncio.wait_for`, which cancels it at the deadline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import signal
import threading
from collections.abc import Awaitable, Callable, Sequence
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")
RESEND_S = 0.1
"""How often the watchdog signals again past the deadline until the call has ended."""


class RewardTimeout(BaseException):
    """A call ran past its deadline and was cut (or given up on)."""


class _Cut:
    """The main thread's SIGALRM handler while a call is timed: it raises only while the call
    is on and past its deadline."""

    def __init__(self) -> None:
        self.expired = False
        self.running = True

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.running and self.expired:
            raise RewardTimeout


def call_within(timeout_s: float, function: Callable[[], T]) -> T:
    """`function()`, or RewardTimeout once it has run `timeout_s`."""
    if threading.current_thread() is not threading.main_thread():
        return _in_thread(timeout_s, function)
    cut, ended = _Cut(), threading.Event()
    main = threading.main_thread().ident
    assert main is not None

    def watchdog() -> None:
        if ended.wait(timeout_s):
            return
        cut.expired = True
        while not ended.is_set():
            signal.pthread_kill(main, signal.SIGALRM)
            ended.wait(RESEND_S)

    previous = signal.signal(signal.SIGALRM, cut)
    thread = threading.Thread(target=watchdog, name="reward-deadline", daemon=True)
    thread.start()
    try:
        return function()
    finally:
        cut.running = False
        ended.set()
        thread.join()
        signal.signal(signal.SIGALRM, previous)


def _in_thread(timeout_s: float, function: Callable[[], T]) -> T:
    outcome: list[tuple[bool, Any]] = []

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


class EventLoop:
    """An event loop in a daemon thread for reward functions' coroutines: one a process
    (`shared`), so every scorer of the process (training, held-out, evaluation sets) awaits on
    the loop that module state of the user's was bound to."""

    _shared: EventLoop | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="reward-loop", daemon=True).start()

    @classmethod
    def shared(cls) -> EventLoop:
        with cls._lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def await_all(self, timeout_s: float, calls: Sequence[Callable[[], Awaitable[T]]]) -> list[T | BaseException]:
        """Each call's awaited result, all awaited at once, each cut after `timeout_s`; a call
        that raised (RewardTimeout for one cut) gives its exception in its place."""

        async def one(call: Callable[[], Awaitable[T]]) -> T:
            try:
                return await asyncio.wait_for(call(), timeout_s)
            except asyncio.TimeoutError:
                raise RewardTimeout from None

        futures = [asyncio.run_coroutine_threadsafe(one(call), self.loop) for call in calls]
        results: list[T | BaseException] = []
        for future in futures:
            try:  # the loop cuts each call; the margin covers a call that ignores cancelling
                results.append(future.result(timeout_s + 1.0))
            except concurrent.futures.TimeoutError:
                future.cancel()
                results.append(RewardTimeout())
            except BaseException as err:  # the call's own failure, handed back
                results.append(err)
        return results
