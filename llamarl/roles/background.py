"""Work taken off a loop's critical path: a thread that handles only the newest item.

The trainer hands over staged weight versions (to checksum, expose and announce) and checkpoint
snapshots (to write and fsync) and goes on training. Items are handled in order; one still
waiting when a newer one arrives is given to `discard` instead (generators only want the newest
version, a resume only the newest checkpoint). An exception on the thread stops it and is raised
again on the owner's thread at its next `check()`, `submit()` or `flush()`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class LatestOnly(Generic[T]):
    def __init__(self, name: str, handle: Callable[[T], None], discard: Callable[[T], None] = lambda _: None) -> None:
        self.handle = handle
        self.discard = discard
        self.num_handled = 0
        self.num_discarded = 0
        self._pending: T | None = None
        self._busy = False
        self._closing = False
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, item: T) -> None:
        self.check()
        with self._cond:
            if self._pending is not None:
                self.discard(self._pending)
                self.num_discarded += 1
            self._pending = item
            self._cond.notify_all()

    def check(self) -> None:
        """Raise the thread's error, if it had one."""
        if self._error is not None:
            raise self._error

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything submitted is handled; False on timeout."""
        with self._cond:
            done = self._cond.wait_for(
                lambda: self._error is not None or (self._pending is None and not self._busy),
                timeout_s,
            )
        self.check()
        return done

    def _run(self) -> None:
        while self._error is None:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closing)
                if self._pending is None:
                    return
                item, self._pending, self._busy = self._pending, None, True
            try:
                self.handle(item)
                self.num_handled += 1
            except BaseException as err:  # raised again on the owner's thread
                self._error = err
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def close(self, timeout_s: float = 60.0) -> None:
        """Handle what is still waiting, then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
