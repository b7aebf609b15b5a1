"""The bus in one process: `MemoryHub` plays the broker, `MemoryBus` clients implement `Bus`.

For fast tests and the synchronous baseline. Messages are encoded to the same `[topic, envelope]`
frames as on ZeroMQ and validated by `validate_frames` where the broker would (on entry, refused
ones counted by reason) and where a client would (on receipt), so the memory bus accepts and
refuses exactly what the real one does. Simplified: consumers take work straight from the hub's
queue (no credits in flight), and one condition variable serves every waiter.

Thread-safe: any number of clients on any threads. Work queues hold at most `max_queue` messages
per topic; a push beyond that blocks (backpressure) and raises TimeoutError after its timeout. A
subscription holds at most `hwm` messages; newer fan-out messages for a full one are dropped and
counted (`dropped.fanout`), like ZeroMQ's XPUB at its high-water mark.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from llamarl.errors import ProtocolError
from llamarl.limits import RejectHook
from llamarl.protocol import Envelope, encode, make_envelope, validate_frames
from llamarl.topics import FANOUT_TOPICS, WORK_TOPICS

ALL_TOPICS = FANOUT_TOPICS | WORK_TOPICS
Frames = list[bytes]


class MemoryHub:
    """The in-process broker: validates, fans out, and queues work for competing consumers."""

    def __init__(
        self,
        run_id: str,
        *,
        max_queue: int = 1000,
        hwm: int = 1000,
        max_message_bytes: int = 64 * 1024 * 1024,
        on_reject: RejectHook | None = None,
    ) -> None:
        self.run_id = run_id
        self.max_queue = max_queue
        self.hwm = hwm
        self.max_message_bytes = max_message_bytes
        self.on_reject = on_reject
        self.counters: Counter[str] = Counter()
        """Counted like the broker's STATS: `fanout`, `work`, `rejected`, `rejected.<reason>`."""
        self._lock = threading.Condition()
        self._queues: dict[str, deque[Frames]] = {topic: deque() for topic in WORK_TOPICS}
        self._subscriptions: list[MemorySubscription] = []

    def client(
        self,
        sender: str,
        *,
        on_reject: RejectHook | None = None,
        max_message_bytes: int | None = None,
    ) -> MemoryBus:
        """A `Bus` client of this hub for `sender` (a worker id); it refuses received messages
        over `max_message_bytes` (default: the hub's limit), reporting them to `on_reject`."""
        return MemoryBus(self, sender, on_reject, max_message_bytes or self.max_message_bytes)

    def stats(self) -> dict[str, int]:
        """The counters and `queued.<topic>`, as `query_broker_stats` returns them."""
        with self._lock:
            return dict(self.counters) | {f"queued.{t}": len(q) for t, q in self._queues.items()}

    def _reject(self, err: ProtocolError) -> None:
        self.counters[f"rejected.{err.reason}"] += 1
        self.counters["rejected"] += 1
        if self.on_reject is not None:
            self.on_reject(err.reason, str(err))

    def _admit(self, frames: Frames, topics: Mapping[str, frozenset[str]]) -> str | None:
        """The topic of a valid message, else None (counted). Decodes outside the lock."""
        try:
            return validate_frames(frames, topics, self.run_id, self.max_message_bytes)[0]
        except ProtocolError as err:
            with self._lock:
                self._reject(err)
            return None

    def publish_frames(self, frames: Frames) -> None:
        """Deliver raw frames to every subscription of their fan-out topic (the broker's pub_in)."""
        topic = self._admit(frames, FANOUT_TOPICS)
        if topic is None:
            return
        with self._lock:
            self.counters["fanout"] += 1
            for subscription in self._subscriptions:
                if topic in subscription.topics:
                    if len(subscription.queue) < self.hwm:
                        subscription.queue.append(frames)
                    else:
                        self.counters["dropped.fanout"] += 1
            self._lock.notify_all()

    def push_frames(self, frames: Frames, timeout_s: float) -> None:
        """Queue raw frames for one consumer (the broker's work_in); blocks while the queue is
        full, TimeoutError after `timeout_s`."""
        topic = self._admit(frames, WORK_TOPICS)
        if topic is None:
            return
        with self._lock:
            queue = self._queues[topic]
            if not self._lock.wait_for(lambda: len(queue) < self.max_queue, timeout_s):
                raise TimeoutError(f"push to {topic} blocked for {timeout_s}s (hub backpressure)")
            queue.append(frames)
            self._lock.notify_all()

    def _take(self, take: Callable[[], Frames | None], timeout_ms: int) -> Frames | None:
        """`take()` (called holding the lock) once it gives frames, waiting up to `timeout_ms`."""
        with self._lock:
            frames = take()
            if frames is None and timeout_ms > 0:
                deadline = time.monotonic() + timeout_ms / 1000
                while frames is None and (left := deadline - time.monotonic()) > 0:
                    self._lock.wait(left)
                    frames = take()
            if frames is not None:
                self._lock.notify_all()  # a pusher may be waiting for room
            return frames

    def _take_work(self, topic: str) -> Frames | None:
        queue = self._queues[topic]
        if not queue:
            return None
        self.counters["work"] += 1
        return queue.popleft()

    def _attach(self, subscription: MemorySubscription) -> None:
        with self._lock:
            self._subscriptions.append(subscription)

    def _detach(self, subscription: MemorySubscription) -> None:
        with self._lock:
            if subscription in self._subscriptions:
                self._subscriptions.remove(subscription)


class _MemoryReceiver:
    """Decodes and validates what a client takes from the hub, as a ZeroMQ client does."""

    def __init__(self, bus: MemoryBus) -> None:
        self.bus = bus
        self.busy_s = 0.0

    def _take(self) -> Frames | None:
        raise NotImplementedError

    def _next_valid(self, timeout_ms: int) -> tuple[str, Envelope] | None:
        hub = self.bus.hub
        # A message the hub admitted passes here too unless this client's size limit is lower;
        # the loop ends because each turn takes one message off the queue.
        while (frames := hub._take(self._take, timeout_ms)) is not None:
            started = time.perf_counter()
            try:
                limit = self.bus.max_message_bytes
                got = validate_frames(frames, ALL_TOPICS, hub.run_id, limit)
            except ProtocolError as err:
                if self.bus.on_reject is not None:
                    self.bus.on_reject(err.reason, str(err))
                got = None
            self.busy_s += time.perf_counter() - started
            if got is not None:
                return got
            timeout_ms = 0
        return None


class MemorySubscription(_MemoryReceiver):
    """A `Subscription` on a MemoryHub."""

    def __init__(self, bus: MemoryBus, topics: frozenset[str]) -> None:
        super().__init__(bus)
        self.topics = topics
        self.queue: deque[Frames] = deque()
        bus.hub._attach(self)

    def _take(self) -> Frames | None:
        return self.queue.popleft() if self.queue else None

    def recv(self, timeout_ms: int) -> tuple[str, Envelope] | None:
        return self._next_valid(timeout_ms)

    def close(self) -> None:
        self.bus.hub._detach(self)


class MemoryWorkQueue(_MemoryReceiver):
    """A `WorkQueue` on a MemoryHub: takes each message straight from the hub's queue."""

    def __init__(self, bus: MemoryBus, topic: str) -> None:
        super().__init__(bus)
        self.topic = topic

    def _take(self) -> Frames | None:
        return self.bus.hub._take_work(self.topic)

    def recv(self, timeout_ms: int) -> Envelope | None:
        got = self._next_valid(timeout_ms)
        return None if got is None else got[1]

    def close(self) -> None:
        """Nothing is held: messages not yet taken stay queued for the other consumers."""


class MemoryBus:
    """A `Bus` client of a MemoryHub; wraps payloads in envelopes carrying run and sender."""

    def __init__(self, hub: MemoryHub, sender: str, on_reject: RejectHook | None, max_message_bytes: int) -> None:
        self.hub = hub
        self.sender = sender
        self.on_reject = on_reject
        self.max_message_bytes = max_message_bytes
        self._receivers: list[MemorySubscription | MemoryWorkQueue] = []
        self._send_s = 0.0

    @property
    def busy_s(self) -> float:
        return self._send_s + sum(receiver.busy_s for receiver in self._receivers)

    def _frames(self, topic: str, payload: Any, policy_version: int) -> Frames:
        started = time.perf_counter()
        envelope = make_envelope(payload, run_id=self.hub.run_id, sender=self.sender, policy_version=policy_version)
        frames = [topic.encode(), encode(envelope)]
        self._send_s += time.perf_counter() - started
        return frames

    def ping(self, timeout_s: float) -> bool:
        return True  # the hub lives in this process: it is there as long as the caller is

    def publish(self, topic: str, payload: Any, policy_version: int) -> None:
        if topic not in FANOUT_TOPICS:
            raise ValueError(f"{topic!r} is not a fan-out topic")
        self.hub.publish_frames(self._frames(topic, payload, policy_version))

    def push(self, topic: str, payload: Any, policy_version: int, timeout_s: float = 60.0) -> None:
        if topic not in WORK_TOPICS:
            raise ValueError(f"{topic!r} is not a work topic")
        self.hub.push_frames(self._frames(topic, payload, policy_version), timeout_s)

    def subscribe(self, topics: Iterable[str]) -> MemorySubscription:
        wanted = frozenset(topics)
        for topic in wanted - FANOUT_TOPICS.keys():
            raise ValueError(f"{topic!r} is not a fan-out topic")
        subscription = MemorySubscription(self, wanted)
        self._receivers.append(subscription)
        return subscription

    def consume(self, topic: str, credit: int = 2) -> MemoryWorkQueue:
        """`credit` is accepted for the interface; a memory consumer holds nothing in flight."""
        if topic not in WORK_TOPICS:
            raise ValueError(f"{topic!r} is not a work topic")
        queue = MemoryWorkQueue(self, topic)
        self._receivers.append(queue)
        return queue

    def close(self) -> None:
        for receiver in self._receivers:
            receiver.close()
