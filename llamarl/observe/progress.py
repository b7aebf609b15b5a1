"""Progress of a long phase (warm start, synchronous steps, evaluation): a tqdm bar on a
terminal; elsewhere (log files, CI) a log line `progress` every `interval_s` and one at the end,
so a phase always ends reporting N/N."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import structlog
from tqdm import tqdm

from llamarl.limits import Clock

log = structlog.get_logger(__name__)

INTERVAL_S = 10.0

Listener = Callable[[str, int, int], None]
"""Told (label, done, total) at every update: a worker's heartbeat status follows its phase."""


class Progress:
    def __init__(
        self,
        label: str,
        total: int,
        *,
        stream: TextIO | None = None,
        interval_s: float = INTERVAL_S,
        clock: Clock = time.monotonic,
        transient: bool = False,
        listener: Listener | None = None,
    ) -> None:
        """`transient`: the terminal bar is cleared when done (a phase inside another's)."""
        self.listener = listener
        self.label = label
        self.total = total
        self.done = 0
        self.interval_s = interval_s
        self.clock = clock
        self._last = clock()
        stream = sys.stderr if stream is None else stream
        self.bar = tqdm(total=total, desc=label, file=stream, leave=not transient) if stream.isatty() else None

    def update(self, amount: int = 1, **status: Any) -> None:
        self.done += amount
        if self.listener is not None:
            self.listener(self.label, self.done, self.total)
        if self.bar is not None:
            self.bar.update(amount)
            if status:
                self.bar.set_postfix(status, refresh=False)
        elif self.clock() - self._last >= self.interval_s:
            self._last = self.clock()
            log.info("progress", phase=self.label, done=self.done, total=self.total, **status)

    def close(self, **status: Any) -> None:
        if self.bar is not None:
            self.bar.close()
        else:
            log.info("progress", phase=self.label, done=self.done, total=self.total, **status)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
