"""The ZeroMQ broker: a validating fan-out forwarder and a credit-based work distributor.

Fan-out (XSUB -> XPUB): every message published on a fan-out topic reaches every subscriber of
that topic. Subscriptions are applied by the broker itself (XPUB manual mode), only for exact
fan-out topic names: an empty-prefix (wildcard) or unknown subscription is refused, counted and
receives nothing. XPUB drops for a subscriber whose queue is at the high-water mark; fan-out
topics (versions, control, heartbeats) tolerate that because their state is also in Redis.

Work (PULL -> ROUTER): a consumer (DEALER) sends `READY <topic> <n>` to add n credits, or
`CREDIT <topic> <n>` to set its credits to n (an idle consumer re-announces so, which also
restores its credits after a broker restart); a consumer holds at most MAX_CONSUMER_CREDIT, so a
flood of credit messages costs O(1) each. Each work message goes to exactly one consumer holding
a credit, round robin. The broker holds at most `max_queue` messages and `max_queue_bytes` bytes
per work topic; when any topic's queue is full it stops reading producers, whose PUSH sockets
then fill to their HWM and block: backpressure, never silent loss. Messages already handed to a
consumer that dies are lost with it; prompt-ticket leases recover those.

Size: ZeroMQ itself refuses (and disconnects) a producer whose frame is over
`max_message_bytes`, and a consumer or subscriber whose command is over COMMAND_BYTES, before
the frame is buffered.

Every frame passes its sender's rate limit (before decoding) and is validated by
`llamarl.protocol.validate_frames` (as every client validates what it receives) before it is
forwarded; rejects are counted by reason (`llamarl.limits.Rejections`: logged once per reason per
interval, batched to Redis) and the broker keeps serving.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict, deque
from collections.abc import Callable

import msgpack
import structlog
import zmq

from llamarl.curve import Curve
from llamarl.errors import ProtocolError
from llamarl.limits import RateLimiter, Rejections
from llamarl.net import BrokerEndpoints, make_socket
from llamarl.protocol import validate_frames
from llamarl.topics import FANOUT_TOPICS, WORK_TOPICS

log = structlog.get_logger(__name__)
POLL_MS = 100
RETRY_MS = 2  # poll timeout while a consumer that holds credit had a full pipe
DRAIN_BATCH = 256
MAX_CONSUMER_CREDIT = 1000
COMMAND_BYTES = 4096
CREDIT_COMMANDS = (b"READY", b"CREDIT")


class Broker:
    """Binds the four broker sockets and serves until `stop()` is called."""

    def __init__(
        self,
        endpoints: BrokerEndpoints,
        *,
        run_id: str,
        hwm: int,
        max_queue: int,
        max_message_bytes: int,
        max_queue_bytes: int = 1 << 30,
        rejections: Rejections | None = None,
        rate_limit: RateLimiter | None = None,
        curve: Curve | None = None,
    ) -> None:
        self.endpoints = endpoints
        self.run_id = run_id
        self.max_queue = max_queue
        self.max_queue_bytes = max_queue_bytes
        self.max_message_bytes = max_message_bytes
        self.rejections = rejections or Rejections("broker")
        self.rate_limit = rate_limit or RateLimiter(0, 1)
        self.counters: Counter[str] = Counter()
        self.queues: dict[str, deque[bytes]] = {topic: deque() for topic in WORK_TOPICS}
        self.queued_bytes: dict[str, int] = dict.fromkeys(WORK_TOPICS, 0)
        self.credits: dict[str, OrderedDict[bytes, int]] = {t: OrderedDict() for t in WORK_TOPICS}
        """Per work topic, consumer identity -> credits, in round-robin order."""
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._auth = curve.authenticator(self._ctx) if curve is not None else None

        def bound(kind: int, max_bytes: int) -> zmq.Socket:
            return make_socket(self._ctx, kind, hwm, curve, server=True, max_message_bytes=max_bytes)

        self.pub_in = bound(zmq.XSUB, max_message_bytes)
        self.sub_out = bound(zmq.XPUB, COMMAND_BYTES)
        self.work_in = bound(zmq.PULL, max_message_bytes)
        self.work_out = bound(zmq.ROUTER, COMMAND_BYTES)
        self.work_out.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # Every subscription notice reaches the broker, which applies only the valid ones.
        self.sub_out.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.sub_out.setsockopt(zmq.XPUB_MANUAL, 1)
        try:
            self.pub_in.bind(endpoints.pub_in)
            self.sub_out.bind(endpoints.sub_out)
            self.work_in.bind(endpoints.work_in)
            self.work_out.bind(endpoints.work_out)
        except zmq.ZMQError:  # a port taken: nothing stays bound, so the caller may try others
            self._close_sockets()
            raise
        # Take every publication so malformed ones are seen and counted; XPUB filters per topic.
        self.pub_in.send(b"\x01")

    def stop(self) -> None:
        self._stop.set()

    def _reject(self, reason: str, detail: str) -> None:
        self.counters[f"rejected.{reason}"] += 1
        self.counters["rejected"] += 1
        self.rejections.record(reason, detail)

    def _receive(self, sock: zmq.Socket) -> list[bytes] | None:
        """One waiting message's frames, or None when its sender is over its rate (counted).
        Raises zmq.Again when nothing is waiting."""
        frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
        if not self.rate_limit.allow(_peer(frames[-1])):
            self._reject("rate_limited", "")
            return None
        return [frame.bytes for frame in frames]

    def _valid(self, frames: list[bytes], topics: dict[str, frozenset[str]]) -> str | None:
        """The frame's topic if it is well formed for `topics`, else None (counted)."""
        try:
            return validate_frames(frames, topics, self.run_id, self.max_message_bytes)[0]
        except ProtocolError as err:
            self._reject(err.reason, str(err))
            return None

    def _check_subscription(self) -> None:
        """A subscriber's notice must be one frame: 0x01 (subscribe) or 0x00 (unsubscribe) and
        an exact fan-out topic; only then does the broker apply it (to the notice's sender).
        An unsubscribe from an unknown topic is ignored, not counted: libzmq itself sends one for
        every subscribe notice of a subscriber that leaves, refused ones included."""
        frames = self._receive(self.sub_out)
        if frames is None:
            return
        notice = frames[0]
        topic = notice[1:].decode("utf-8", "replace")
        if len(frames) != 1 or notice[:1] not in (b"\x00", b"\x01"):
            self._reject("bad_subscription", repr(notice[:20]))
        elif topic not in FANOUT_TOPICS:
            if notice[:1] == b"\x01":
                self._reject("unknown_topic", topic[:40])
        else:
            option = zmq.SUBSCRIBE if notice[:1] == b"\x01" else zmq.UNSUBSCRIBE
            self.sub_out.setsockopt(option, notice[1:])

    def _forward_fanout(self) -> None:
        frames = self._receive(self.pub_in)
        if frames is not None and self._valid(frames, FANOUT_TOPICS) is not None:
            self.sub_out.send_multipart(frames)
            self.counters["fanout"] += 1

    def _accept_work(self) -> None:
        frames = self._receive(self.work_in)
        if frames is None:
            return
        topic = self._valid(frames, WORK_TOPICS)
        if topic is not None:
            self.queues[topic].append(frames[1])
            self.queued_bytes[topic] += len(frames[1])
            self._dispatch(topic)

    def _handle_consumer(self) -> None:
        frames = self._receive(self.work_out)
        if frames is None:
            return
        identity, command = frames[0], frames[1:]
        if command == [b"STATS"]:
            stats = dict(self.counters) | {f"queued.{t}": len(q) for t, q in self.queues.items()}
            self._send_to(identity, [b"STATS", msgpack.packb(stats)])
            return
        if len(command) != 3 or command[0] not in CREDIT_COMMANDS or not command[2].isdigit():
            self._reject("bad_command", repr(command[:1])[:60])
            return
        topic = command[1].decode("utf-8", "replace")
        if topic not in WORK_TOPICS:
            self._reject("unknown_topic", topic[:40])
            return
        credits = self.credits[topic]
        # CREDIT sets, not adds: a consumer re-announcing after a restart.
        held = credits.get(identity, 0) if command[0] == b"READY" else 0
        total = min(held + int(command[2]), MAX_CONSUMER_CREDIT)
        if total:
            credits[identity] = total
        else:
            credits.pop(identity, None)
        self._dispatch(topic)

    def _send_to(self, identity: bytes, frames: list[bytes]) -> str:
        """ "sent"; "full" when the consumer's pipe is at its high-water mark (it keeps its
        credit for later); "gone" when it is unknown or disconnected (its credit is void)."""
        try:
            self.work_out.send_multipart([identity, *frames], flags=zmq.NOBLOCK)
            return "sent"
        except zmq.Again:
            return "full"
        except zmq.ZMQError:
            return "gone"

    def _dispatch(self, topic: str) -> None:
        queue, credits = self.queues[topic], self.credits[topic]
        full: list[tuple[bytes, int]] = []
        while queue and credits:
            identity, held = credits.popitem(last=False)
            outcome = self._send_to(identity, [topic.encode(), queue[0]])
            if outcome == "sent":
                self.queued_bytes[topic] -= len(queue.popleft())
                self.counters["work"] += 1
                if held > 1:
                    credits[identity] = held - 1  # to the back: round robin
            elif outcome == "full":
                full.append((identity, held))
        # Retried on the next loop turn (see `_stalled`): libzmq tells a ROUTER that a peer's
        # pipe has room again only by letting the next send through.
        for identity, held in reversed(full):
            credits[identity] = held
            credits.move_to_end(identity, last=False)

    def _stalled(self) -> list[str]:
        """Work topics holding both queued messages and credits: their last dispatch found the
        consumers' pipes full, and nothing the consumers send may come to retry it."""
        return [t for t, q in self.queues.items() if q and self.credits[t]]

    def _room_for_work(self) -> bool:
        return all(
            len(queue) < self.max_queue and self.queued_bytes[topic] < self.max_queue_bytes
            for topic, queue in self.queues.items()
        )

    def serve(self) -> None:
        log.info("broker serving", endpoints=str(self.endpoints), curve=self._auth is not None)
        try:
            # Two pollers built once: with producers while every work queue has room, without
            # them (backpressure) when one is full.
            full = zmq.Poller()
            for sock in (self.pub_in, self.sub_out, self.work_out):
                full.register(sock, zmq.POLLIN)
            open_ = zmq.Poller()
            for sock in (self.pub_in, self.sub_out, self.work_out, self.work_in):
                open_.register(sock, zmq.POLLIN)
            while not self._stop.is_set():
                stalled = self._stalled()
                for topic in stalled:
                    self._dispatch(topic)
                poller = open_ if self._room_for_work() else full
                ready = dict(poller.poll(RETRY_MS if stalled else POLL_MS))
                if self.pub_in in ready:
                    _drain(self._forward_fanout)
                if self.sub_out in ready:
                    _drain(self._check_subscription)
                if self.work_out in ready:
                    _drain(self._handle_consumer)
                if self.work_in in ready:
                    _drain(self._accept_work, self._room_for_work)
                self.rejections.flush()
        finally:
            self.close()

    def _close_sockets(self) -> None:
        for sock in (self.pub_in, self.sub_out, self.work_in, self.work_out):
            sock.close(linger=0)
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()

    def close(self) -> None:
        self._close_sockets()
        self.rejections.flush(force=True)
        log.info("broker stopped", counters=dict(self.counters))


def _drain(handle: Callable[[], None], more: Callable[[], bool] = lambda: True) -> None:
    """Handle the messages waiting on a socket, up to DRAIN_BATCH of them (then the other
    sockets get their turn): one poll per batch instead of one per message."""
    for _ in range(DRAIN_BATCH):
        if not more():
            return
        try:
            handle()
        except zmq.Again:
            return


def _peer(frame: zmq.Frame) -> bytes:
    """The address a frame came from (every client of a run shares one CURVE key, so the key
    would not tell them apart)."""
    try:
        return str(frame.get("Peer-Address")).encode()
    except (zmq.ZMQError, KeyError):
        return b"?"
