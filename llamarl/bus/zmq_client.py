"""The ZeroMQ `Bus` (see llamarl.bus.interfaces): a client of the broker process in brokers/.

Publish/subscribe fan-out topics and push/pull work topics by name. One client per thread
(ZeroMQ sockets are not thread-safe). Sockets are created on first use with explicit high-water
marks and closed with linger 0. A push blocks while the broker applies backpressure and raises
TimeoutError after `timeout_s` rather than dropping the message. Received frames are validated by
`llamarl.protocol.validate_frames` (size checked before decoding); a malformed one is reported to
`on_reject(reason, detail)` (a worker's `llamarl.limits.Rejections`) and skipped."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import msgpack
import zmq

from llamarl.curve import Curve
from llamarl.errors import ProtocolError
from llamarl.limits import RejectHook
from llamarl.net import BrokerEndpoints, make_socket
from llamarl.protocol import Envelope, encode, make_envelope, validate_frames
from llamarl.topics import FANOUT_TOPICS, WORK_TOPICS

ALL_TOPICS = FANOUT_TOPICS | WORK_TOPICS
PUSH_LINGER_MS = 2000
RECREDIT_S = 2.0
MAX_SKIPPED = 1000  # rejected messages one recv() skips before it returns, so a flood cannot starve


class _Receiver:
    def __init__(self, sock: zmq.Socket, run_id: str, max_message_bytes: int, on_reject: RejectHook | None):
        self.sock = sock
        self.run_id = run_id
        self.max_message_bytes = max_message_bytes
        self.on_reject = on_reject
        self.busy_s = 0.0
        """Seconds spent taking messages off the socket and decoding them (not waiting)."""

    def _next_valid(self, timeout_ms: int) -> tuple[str, Envelope] | None:
        """The next valid message as (topic, envelope), skipping (and counting) rejected ones,
        at most MAX_SKIPPED per call; None when none came within `timeout_ms`."""
        for _ in range(MAX_SKIPPED):
            if timeout_ms:
                self._before_wait()
            if not self.sock.poll(timeout_ms):
                self._idle()
                return None
            started = time.perf_counter()
            frames = self.sock.recv_multipart()
            self._received()
            envelope = self._decode(frames)
            self.busy_s += time.perf_counter() - started
            if envelope is not None:
                return frames[0].decode(), envelope
            timeout_ms = 0
        return None

    def _before_wait(self) -> None:
        """Called before a poll that may block."""

    def _idle(self) -> None:
        """Called when a poll found nothing."""

    def _received(self) -> None:
        """Called for every message taken off the socket, valid or not."""

    def _decode(self, frames: list[bytes]) -> Envelope | None:
        """The envelope of a well-formed [topic, payload] message of this run, else None."""
        try:
            return validate_frames(frames, ALL_TOPICS, self.run_id, self.max_message_bytes)[1]
        except ProtocolError as err:
            if self.on_reject is not None:
                self.on_reject(err.reason, str(err))
            return None

    def close(self) -> None:
        self.sock.close(linger=0)


class Subscriber(_Receiver):
    """Receives every message of the subscribed fan-out topics."""

    def recv(self, timeout_ms: int) -> tuple[str, Envelope] | None:
        """The next valid (topic, envelope); None when none came."""
        return self._next_valid(timeout_ms)


class Consumer(_Receiver):
    """Competes with other consumers of one work topic; each message reaches exactly one."""

    def __init__(
        self, sock: zmq.Socket, topic: str, credit: int, run_id: str, max_bytes: int, on_reject: RejectHook | None
    ):
        super().__init__(sock, run_id, max_bytes, on_reject)
        self.topic = topic.encode()
        self.credit = str(credit).encode()
        # Credits go back in batches (READY n), one message per `_batch` received, not per one.
        self._batch = max(1, credit // 4)
        self._taken = 0
        self._idle_since = time.monotonic()
        sock.send_multipart([b"CREDIT", self.topic, self.credit])

    def recv(self, timeout_ms: int) -> Envelope | None:
        """The next valid work message; None when none came."""
        got = self._next_valid(timeout_ms)
        return None if got is None else got[1]

    def _return_credits(self) -> None:
        if self._taken:
            self.sock.send_multipart([b"READY", self.topic, str(self._taken).encode()])
            self._taken = 0

    def _before_wait(self) -> None:
        self._return_credits()  # about to wait: every credit taken so far goes back first

    def _idle(self) -> None:
        if time.monotonic() - self._idle_since > RECREDIT_S:
            # Re-announce the credit, in case the broker restarted and forgot it.
            self.sock.send_multipart([b"CREDIT", self.topic, self.credit])
            self._idle_since = time.monotonic()

    def _received(self) -> None:
        self._idle_since = time.monotonic()
        self._taken += 1
        if self._taken >= self._batch:
            self._return_credits()


def query_broker_stats(
    endpoints: BrokerEndpoints, timeout_s: float = 5.0, curve: Curve | None = None
) -> dict[str, int]:
    """The broker's counters (forwarded, rejected by reason, queued); also a health check."""
    ctx = zmq.Context()
    sock = make_socket(ctx, zmq.DEALER, 10, curve)
    try:
        sock.connect(endpoints.work_out)
        sock.send_multipart([b"STATS"])
        if not sock.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"broker at {endpoints} did not answer within {timeout_s}s")
        frames = sock.recv_multipart()
        if len(frames) != 2 or frames[0] != b"STATS":  # something else on that port
            raise TimeoutError(f"{endpoints.work_out} answered, but not as a broker answers STATS")
        return dict(msgpack.unpackb(frames[1], raw=False))
    finally:
        sock.close(linger=0)
        ctx.term()


class BusClient:
    """A worker's handle on the broker; wraps payloads in envelopes carrying run and sender."""

    def __init__(
        self,
        endpoints: BrokerEndpoints,
        *,
        run_id: str,
        sender: str,
        hwm: int = 1000,
        max_message_bytes: int = 64 * 1024 * 1024,
        on_reject: RejectHook | None = None,
        curve: Curve | None = None,
    ) -> None:
        self.endpoints = endpoints
        self.curve = curve
        self.run_id = run_id
        self.sender = sender
        self.hwm = hwm
        self.max_message_bytes = max_message_bytes
        self.on_reject = on_reject
        self._ctx = zmq.Context()
        self._pub: zmq.Socket | None = None
        self._push: zmq.Socket | None = None
        self._receivers: list[_Receiver] = []
        self._send_s = 0.0

    @property
    def busy_s(self) -> float:
        """Seconds this client spent encoding, sending, receiving and decoding (not waiting)."""
        return self._send_s + sum(receiver.busy_s for receiver in self._receivers)

    def _envelope(self, payload: Any, policy_version: int) -> bytes:
        return encode(make_envelope(payload, run_id=self.run_id, sender=self.sender, policy_version=policy_version))

    def publish(self, topic: str, payload: Any, policy_version: int) -> None:
        if topic not in FANOUT_TOPICS:
            raise ValueError(f"{topic!r} is not a fan-out topic")
        if self._pub is None:
            self._pub = make_socket(self._ctx, zmq.PUB, self.hwm, self.curve)
            self._pub.connect(self.endpoints.pub_in)
        started = time.perf_counter()
        self._pub.send_multipart([topic.encode(), self._envelope(payload, policy_version)])
        self._send_s += time.perf_counter() - started

    def push(self, topic: str, payload: Any, policy_version: int, timeout_s: float = 60.0) -> None:
        if topic not in WORK_TOPICS:
            raise ValueError(f"{topic!r} is not a work topic")
        if self._push is None:
            self._push = make_socket(self._ctx, zmq.PUSH, self.hwm, self.curve)
            self._push.connect(self.endpoints.work_in)
        started = time.perf_counter()
        frames = [topic.encode(), self._envelope(payload, policy_version)]
        try:
            self._push.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:  # the broker applies backpressure: wait for room, up to the timeout
            waiting = time.perf_counter()
            if not self._push.poll(int(timeout_s * 1000), zmq.POLLOUT):
                raise TimeoutError(f"push to {topic} blocked for {timeout_s}s (broker backpressure)") from None
            started += time.perf_counter() - waiting  # waiting is not bus work
            self._push.send_multipart(frames)
        self._send_s += time.perf_counter() - started

    def subscribe(self, topics: Iterable[str]) -> Subscriber:
        sock = make_socket(self._ctx, zmq.SUB, self.hwm, self.curve)
        for topic in topics:
            if topic not in FANOUT_TOPICS:
                raise ValueError(f"{topic!r} is not a fan-out topic")
            # The trailing frame boundary is not part of the prefix match, so exact topic names
            # must not prefix each other; FANOUT_TOPICS is chosen so.
            sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        sock.connect(self.endpoints.sub_out)
        receiver = Subscriber(sock, self.run_id, self.max_message_bytes, self.on_reject)
        self._receivers.append(receiver)
        return receiver

    def consume(self, topic: str, credit: int = 2) -> Consumer:
        if topic not in WORK_TOPICS:
            raise ValueError(f"{topic!r} is not a work topic")
        sock = make_socket(self._ctx, zmq.DEALER, self.hwm, self.curve)
        sock.connect(self.endpoints.work_out)
        receiver = Consumer(sock, topic, credit, self.run_id, self.max_message_bytes, self.on_reject)
        self._receivers.append(receiver)
        return receiver

    def ping(self, timeout_s: float) -> bool:
        try:
            query_broker_stats(self.endpoints, timeout_s, self.curve)
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        if self._pub is not None:
            self._pub.close(linger=0)
        if self._push is not None:
            # Give queued work a moment to reach the broker; leases cover what still is lost.
            self._push.close(linger=PUSH_LINGER_MS)
        for receiver in self._receivers:
            receiver.close()
        self._ctx.term()
