"""Point-to-point transport over torch.distributed: gloo on CPUs, NCCL on GPUs.

The trainer runs a `P2PWeightServer` thread: a ZeroMQ ROUTER (the sync control endpoint) and a
TCPStore. A generator asks for a version; the server answers with its size, checksum and the
name of the two-rank group (rank 0 trainer, rank 1 generator) that carries it; the generator
says go (`TransferGo`) on the same connection, and the weights go over in buckets with
send/recv. Without a go (the generator gave up while its request waited: its connection is
closed, or nothing comes within GO_WAIT_S) the request is dropped unserved, so a stale request
never holds the server for a timeout while the generators behind it give up in turn. The group
is formed on a generator's first pull and kept for the next ones, so a pull costs the transfer
alone; generators still join and leave freely (a group per generator, never a global world). A
transfer that fails drops that generator's group and the next pull forms a new one. Every wait
has the sync timeout: a generator that dies mid-transfer costs the trainer at most one timeout,
and a trainer that does not answer raises SyncError naming it (a generator that follows the
version record asks a restarted trainer instead: p2p_receiver.py). Transfers are served one at a
time. Control messages have schemas (llamarl.weightsync.messages): a malformed request is
refused, answered and counted through `on_reject`; a malformed reply is a SyncError naming the
server.

A trainer of several ranks runs one server per rank, each serving its own shard
(`flat.Shard`). A generator asks every shard's server for the same version, which each keeps
for KEEP_VERSIONS publishes (a version a server has not published yet is refused as "not yet"
and asked for again), and receives each shard as soon as its server answers, side by side with
the next ask, into one flat buffer: no server waits on a generator that waits on another rank.

The generator's end is p2p_receiver.py; the two ends as `WeightPublisher` / `WeightReceiver` are
in pair_ends.py; gloo.py and nccl.py name them and set the device.
"""

from __future__ import annotations

import datetime
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
import torch
import torch.distributed as dist
import zmq

from llamarl.curve import Curve
from llamarl.errors import ProtocolError
from llamarl.limits import RejectHook
from llamarl.net import make_socket, own_address
from llamarl.weightsync import messages
from llamarl.weightsync.flat import FlatWeights
from llamarl.weightsync.messages import TransferGo, TransferRefusal, TransferReply, TransferRequest

log = structlog.get_logger(__name__)
POLL_MS = 100
GO_WAIT_S = 5.0
"""How long a server waits for the go of a generator it answered (one that is receiving sends
it at once); without one it moves on to the next request (capped by the sync timeout)."""
MAX_QUEUED = 1000
"""Requests a server holds while it waits for a go; past it, a request is told to ask again."""
GO_LINGER_MS = 1000
"""A generator's go is flushed before its socket closes, for at most this long."""
KEEP_VERSIONS = 2
"""Versions a server keeps serving: a generator asking each rank's server for one version in
turn still finds it after the next publish."""


@dataclass(frozen=True)
class PairBackend:
    """What differs between gloo and NCCL: the process group's class and where buffers live."""

    name: str
    device: str
    make_group: Callable[[dist.Store, int, float, str | None], Any]
    """(store, rank, timeout_s, address) -> a two-rank process group of its own, outside any
    world, whose end here uses this machine's `address` (the one the peer reaches it at; None:
    the backend's own choice)."""


def buckets(total: int, bucket_values: int) -> list[tuple[int, int]]:
    return [(start, min(start + bucket_values, total)) for start in range(0, total, bucket_values)]


class P2PWeightServer:
    def __init__(
        self,
        host: str,
        *,
        backend: PairBackend,
        timeout_s: float,
        bucket_bytes: int,
        advertise_host: str | None = None,
        curve: Curve | None = None,
        on_reject: RejectHook | None = None,
    ) -> None:
        self.backend = backend
        self.on_reject = on_reject
        self.timeout_s = timeout_s
        self.bucket_values = max(1, bucket_bytes // 4)
        self.store = dist.TCPStore(
            host,
            0,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        self._ctx = zmq.Context()
        self._auth = curve.authenticator(self._ctx) if curve is not None else None
        self._control = make_socket(self._ctx, zmq.ROUTER, 100, curve, server=True)
        self._control.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a closed connection fails
        port = self._control.bind_to_random_port(f"tcp://{host}")
        self.endpoint = f"tcp://{advertise_host or host}:{port}"
        self.group_address = own_address(advertise_host or host)
        self._held: dict[int, FlatWeights] = {}
        self._sending: FlatWeights | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._names = itertools.count()
        self._groups: dict[str, tuple[str, Any]] = {}
        self._queued: deque[tuple[bytes, list[bytes]]] = deque()
        """Requests read while waiting for a generator's go, served next."""
        self.num_served = 0
        self.num_failed = 0
        self.num_abandoned = 0
        """Requests not served: their generator had gone, or did not say go."""
        self._thread = threading.Thread(target=self._serve, name="weight-server", daemon=True)
        self._thread.start()

    def group_of(self, worker_id: str) -> str | None:
        """The name of the pair group the server holds for a generator, if any."""
        known = self._groups.get(worker_id)
        return None if known is None else known[0]

    def publish(self, weights: FlatWeights) -> None:
        """Serve `weights` from now on, and the KEEP_VERSIONS - 1 versions before it (a transfer
        in flight keeps its own)."""
        with self._lock:
            self._held[weights.policy_version] = weights
            for old in sorted(self._held)[:-KEEP_VERSIONS]:
                del self._held[old]

    def in_use(self, buffer: torch.Tensor) -> bool:
        """Whether the server may still read `buffer` (a version it holds or one being sent)."""
        with self._lock:
            held = [*self._held.values(), self._sending]
        return any(w is not None and w.buffer is buffer for w in held)

    def _look_up(self, policy_version: int) -> FlatWeights | TransferRefusal:
        with self._lock:
            weights = self._sending = self._held.get(policy_version)
            newest = max(self._held, default=-1)
        if weights is not None:
            return weights
        if policy_version > newest:
            return TransferRefusal(f"version {policy_version} is not published yet", True)
        return TransferRefusal(f"version {policy_version} is no longer held", False)

    def _serve(self) -> None:
        while not self._stop.is_set():
            message = self._queued.popleft() if self._queued else self._receive(POLL_MS)
            if message is not None:
                self._handle(*message)
            with self._lock:
                self._sending = None

    def _receive(self, timeout_ms: int) -> tuple[bytes, list[bytes]] | None:
        if not self._control.poll(timeout_ms):
            return None
        identity, *frames = self._control.recv_multipart()
        return identity, frames

    def _handle(self, identity: bytes, frames: list[bytes]) -> None:
        try:
            request = _parse_request(frames)
        except ProtocolError as err:  # refused and counted; the server keeps serving
            if self.on_reject is not None:
                self.on_reject("bad_sync_request", str(err)[:80])
            self._answer(identity, TransferRefusal(f"bad request: {err}", False))
            return
        if isinstance(request, TransferGo):  # late: its offer was abandoned already
            return
        found = self._look_up(request.policy_version)
        if isinstance(found, TransferRefusal):
            self._answer(identity, found)
            return
        name = self._group_name(request.worker_id, request.group)
        if self._offer(identity, request.worker_id, name, found):
            self._transfer(request.worker_id, name, found)

    def _answer(self, identity: bytes, reply: TransferReply | TransferRefusal) -> bool:
        """Send `reply`; False when its generator is gone (its connection closed: ZeroMQ knows
        with ROUTER_MANDATORY) or reads nothing (its queue is full)."""
        try:
            self._control.send_multipart([identity, b"", messages.encode(reply)], zmq.NOBLOCK)
        except zmq.Again:
            return False
        except zmq.ZMQError as err:
            if err.errno != zmq.EHOSTUNREACH:
                raise
            return False
        return True

    def _group_name(self, peer: str, held: str) -> str:
        """The pair group to send over: the one the generator says it `held`, if the server has
        that one too, else a new one (a restarted generator holds none)."""
        known = self._groups.get(peer)
        return known[0] if known is not None and known[0] == held else f"w{next(self._names)}-{peer}"

    def _offer(self, identity: bytes, peer: str, name: str, weights: FlatWeights) -> bool:
        """Tell the generator what is coming over which group; whether it answers go. A request
        may have waited here past its generator's patience: one that gave up is never served."""
        reply = TransferReply(
            weights.policy_version, weights.num_bytes, weights.checksum, self.store.port, name, self.bucket_values
        )
        if self._answer(identity, reply) and self._go(identity, weights.policy_version):
            return True
        self.num_abandoned += 1
        log.info("weight request abandoned by its generator; not served", peer=peer)
        return False

    def _go(self, identity: bytes, policy_version: int) -> bool:
        """Wait up to GO_WAIT_S for the generator's go (other requests that come meanwhile are
        queued); False on anything else from it, or nothing."""
        deadline = time.monotonic() + min(GO_WAIT_S, self.timeout_s)
        while not self._stop.is_set() and time.monotonic() < deadline:
            message = self._receive(POLL_MS)
            if message is None:
                continue
            if message[0] != identity:
                if len(self._queued) < MAX_QUEUED:
                    self._queued.append(message)
                else:  # asked again (a refusal "not yet"), not held without bound
                    self._answer(message[0], TransferRefusal("the weight server is busy", True))
                continue
            return _is_go(message[1], policy_version)
        return False

    def _transfer(self, peer: str, name: str, weights: FlatWeights) -> None:
        """Send `weights` to `peer` over the group `name` (formed first unless held already)."""
        try:
            known = self._groups.get(peer)
            if known is None or known[0] != name:
                store = dist.PrefixStore(name, self.store)
                self._groups[peer] = (name, self.backend.make_group(store, 0, self.timeout_s, self.group_address))
            group = self._groups[peer][1]
            buffer = weights.buffer.to(self.backend.device)
            timeout = datetime.timedelta(seconds=self.timeout_s)
            sent = None  # the next bucket is queued before the previous one is waited for
            for tag, (start, end) in enumerate(buckets(buffer.numel(), self.bucket_values)):
                sending = group.send([buffer[start:end]], 1, tag)
                if sent is not None:
                    sent.wait(timeout)
                sent = sending
            if sent is not None:
                sent.wait(timeout)
            self.num_served += 1
        except Exception as err:  # a dead or stuck peer must not stop the server
            self._groups.pop(peer, None)
            self.num_failed += 1
            log.warning("weight transfer failed", peer=peer, error=str(err).splitlines()[0][:160])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(self.timeout_s + 1)
        self._groups.clear()
        self._control.close(linger=0)
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()


def _parse_request(frames: list[bytes]) -> TransferRequest | TransferGo:
    """The request (or go) in a message's frames ([b"", encoded message]); ProtocolError if it
    is anything else."""
    if len(frames) != 2 or frames[0] != b"":
        raise ProtocolError("bad_frames", f"{len(frames)} frames, expected [b'', request]")
    request: TransferRequest | TransferGo = messages.decode(frames[1], TransferRequest, TransferGo)
    return request


def _is_go(frames: list[bytes], policy_version: int) -> bool:
    """Whether a message is a go for `policy_version`."""
    try:
        answer = _parse_request(frames)
    except ProtocolError:
        return False
    return isinstance(answer, TransferGo) and answer.go and answer.policy_version == policy_version
