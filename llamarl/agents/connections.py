"""The endpoint's connections, held to `generation.openai`'s limits below the HTTP app: uvicorn's
h11 protocol with an idle timeout from a connection's opening (uvicorn starts one only after an
answer); a header timeout from a request's first byte, or from its answer for the unread rest
of a refused request's body (which uvicorn reads and drops); and a cap on open connections that
closes the one longest without a request in progress for a new one. So a connection that sends
nothing, or a request's headers or a refused body a byte at a time, is closed within its
timeout, and a crowd of idle connections cannot keep a new request out. Bodies are the app's to
time (`Endpoint.read`), and requests in flight are bounded there, all episodes together and one
episode's alone."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import ClassVar

from uvicorn.protocols.http.h11_impl import H11Protocol

from llamarl.config.endpoint import EndpointConfig
from llamarl.limits import RejectHook


@dataclass(frozen=True)
class Guard:
    limits: EndpointConfig
    on_reject: RejectHook


class GuardedH11(H11Protocol):
    guard: ClassVar[Guard]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.idle_since = self.loop.time()
        self.header_deadline: asyncio.TimerHandle | None = None
        if len(self.connections) > self.guard.limits.max_connections:
            self._make_room()
        # Idle from the start: uvicorn times a connection out only after an answer.
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def data_received(self, data: bytes) -> None:
        if self.header_deadline is None and self.between_requests():
            self.header_deadline = self.loop.call_later(self.guard.limits.header_timeout_s, self._headers_late)
        super().data_received(data)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request's headers arrived
            self._end_header_deadline()

    def on_response_complete(self) -> None:
        self.idle_since = self.loop.time()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_header_deadline()
        super().connection_lost(exc)

    def _end_header_deadline(self) -> None:
        if self.header_deadline is not None:
            self.header_deadline.cancel()
            self.header_deadline = None

    def _headers_late(self) -> None:
        self.header_deadline = None
        self.guard.on_reject("header_timeout", f"a request's headers took over {self.guard.limits.header_timeout_s} s")
        self.transport.close()

    def _make_room(self) -> None:
        """Close the open connection longest without a request in progress (this new one when
        every other has one)."""
        open_ = [c for c in self.connections if isinstance(c, GuardedH11) and not c.transport.is_closing()]
        if len(open_) <= self.guard.limits.max_connections:
            return  # the rest are closing
        oldest = min((c for c in open_ if c.between_requests()), key=lambda c: c.idle_since)
        self.guard.on_reject("connection_evicted", f"over {self.guard.limits.max_connections} connections")
        oldest.transport.close()


def guarded(limits: EndpointConfig, on_reject: RejectHook) -> type[GuardedH11]:
    """The protocol class for one endpoint's server, bound to its limits and refusal counter."""
    return type("GuardedH11", (GuardedH11,), {"guard": Guard(limits, on_reject)})
