"""Noticing a bus that stopped answering: a role keeps working while the broker is away (its
sockets reconnect by themselves), warns once, and gives up with a clear error when the broker has
been away for longer than `broker.dead_after_s`."""

from __future__ import annotations

import structlog

from llamarl.bus import Bus
from llamarl.limits import Clock

log = structlog.get_logger(__name__)

PING_TIMEOUT_S = 1.0


class BusWatch:
    """Pings the bus at most every `every_s`; `check()` raises ConnectionError, naming the bus
    as `name`, once it has not answered for `dead_after_s`."""

    def __init__(self, bus: Bus, name: str, *, every_s: float, dead_after_s: float, clock: Clock) -> None:
        self.bus = bus
        self.name = name
        self.every_s = every_s
        self.dead_after_s = dead_after_s
        self.clock = clock
        self._last_ping = -float("inf")
        self._silent_since: float | None = None

    def check(self) -> None:
        now = self.clock()
        if now - self._last_ping < self.every_s:
            return
        self._last_ping = now
        if self.bus.ping(min(PING_TIMEOUT_S, self.every_s)):
            if self._silent_since is not None:
                log.info("bus answers again", bus=self.name, silent_s=round(now - self._silent_since, 1))
            self._silent_since = None
            return
        if self._silent_since is None:
            self._silent_since = now
            log.warning("bus not answering; waiting for it", bus=self.name, gives_up_after_s=self.dead_after_s)
        elif now - self._silent_since >= self.dead_after_s:
            raise ConnectionError(
                f"{self.name} did not answer for {now - self._silent_since:.0f} s "
                f"(broker.dead_after_s {self.dead_after_s:g}); start it again, or check "
                "broker.host and broker.port"
            )
