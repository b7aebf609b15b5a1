"""The bus as an interface: what every implementation (ZeroMQ broker, in-process hub) promises.

Two kinds of topics, named in `llamarl.topics`: fan-out topics reach every subscriber, work topics
reach exactly one consumer. Payloads travel wrapped in envelopes (`llamarl.protocol`) that carry
the run, the sender and the policy version; every implementation encodes and validates them the
same way (`llamarl.protocol.validate_frames`), so a malformed message is refused and counted by
reason, never delivered, and never stops the bus. `tests/contract/` checks each implementation
against these promises.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from llamarl.protocol import Envelope


class Subscription(Protocol):
    """Messages of the fan-out topics one subscriber asked for, in the order each publisher sent
    them. A subscriber that falls far behind (its queue at the high-water mark) may miss fan-out
    messages: their state is also kept in Redis."""

    def recv(self, timeout_ms: int) -> tuple[str, Envelope] | None:
        """The next valid (topic, envelope); None when none came within `timeout_ms` (0: do not
        wait). Invalid messages are skipped and reported to the client's `on_reject`."""
        ...

    def close(self) -> None: ...


class WorkQueue(Protocol):
    """One consumer's share of a work topic: competing consumers split the messages, each
    message reaching exactly one of them, in the order each producer pushed them."""

    def recv(self, timeout_ms: int) -> Envelope | None:
        """The next valid work message; None when none came within `timeout_ms` (0: do not
        wait). Invalid messages are skipped and reported to the client's `on_reject`."""
        ...

    def close(self) -> None: ...


class Bus(Protocol):
    """One worker's (or one thread's) handle on the bus; not shared between threads."""

    def publish(self, topic: str, payload: Any, policy_version: int) -> None:
        """Send `payload` to every current subscriber of fan-out `topic`; never blocks.
        ValueError if `topic` is not a fan-out topic."""
        ...

    def push(self, topic: str, payload: Any, policy_version: int, timeout_s: float = 60.0) -> None:
        """Queue `payload` for exactly one consumer of work `topic`. Blocks while the topic's
        queue is full (backpressure) and raises TimeoutError, naming backpressure, after
        `timeout_s`; a pushed message is never dropped silently. ValueError if `topic` is not a
        work topic."""
        ...

    def subscribe(self, topics: Iterable[str]) -> Subscription:
        """A subscription to fan-out `topics`: it gets every message published on them from
        when it is ready (ZeroMQ: after its connection; a caller that must not miss the first
        messages waits for a first one) and none of other topics."""
        ...

    def consume(self, topic: str, credit: int = 2) -> WorkQueue:
        """A consumer of work `topic` competing with the others; it holds at most `credit`
        messages it has not received yet (those are lost if the consumer dies)."""
        ...

    def ping(self, timeout_s: float) -> bool:
        """True when the bus answers within `timeout_s` (ZeroMQ: the broker is up); a bus that
        does not answer keeps its sockets, which reconnect when it comes back."""
        ...

    def close(self) -> None:
        """Close every subscription and consumer of this client, then the client."""
        ...

    @property
    def busy_s(self) -> float:
        """Seconds spent encoding, sending, receiving and decoding (not waiting)."""
        ...
