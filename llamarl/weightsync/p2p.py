"""Point-to-point transport over torch.distributed: gloo on CPUs, NCCL on GPUs.

The trainer runs a `P2PWeightServer` thread: a ZeroMQ ROUTER (the sync control endpoint) and a
TCPStore. A generator asks for a version; the server answers with its size, checksum and the
name of the two-rank group (rank 0 trainer, rank 1 generator) that carries it, and the weights
go over in buckets with send/recv. The group is formed on a generator's first pull and kept for
the next ones, so a pull costs the transfer alone; generators still join and leave freely (a group
per generator, never a global world). A transfer that fails drops that generator's group and the
next pull forms a new one. Every wait has the sync timeout: a generator that dies mid-transfer
costs the trainer at most one timeout, and a trainer that does not answer raises SyncError naming
it. Transfers are served one at a time. Control messages have schemas (llamarl.weightsync.messages):
a malformed request is refused, answered and counted through `on_reject`; a malformed reply is a
SyncError naming the server.

A trainer of several ranks runs one server per rank, each serving its own shard
(`flat.Shard`). A generator asks every shard's server for the same version, which each keeps
for KEEP_VERSIONS publishes (a version a server has not published yet is refused as "not yet"
and asked for again), and receives the shards side by side into one flat buffer.

The two ends as `WeightPublisher` / `WeightReceiver` are in pair_ends.py; gloo.py and nccl.py
name them and set the device.
"""

from __future__ import annotations

import datetime
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import structlog
import torch
import torch.distributed as dist
import zmq

from llamarl.curve import Curve
from llamarl.errors import ProtocolError, SyncError
from llamarl.limits import RejectHook
from llamarl.net import address_towards, make_socket, own_address
from llamarl.weightsync import messages
from llamarl.weightsync.base import (
    StopCheck,
    never_stop,
)
from llamarl.weightsync.flat import (
    Checksum,
    FlatWeights,
)
from llamarl.weightsync.messages import TransferRefusal, TransferReply, TransferRequest

log = structlog.get_logger(__name__)
POLL_MS = 100
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
        port = self._control.bind_to_random_port(f"tcp://{host}")
        self.endpoint = f"tcp://{advertise_host or host}:{port}"
        self.group_address = own_address(advertise_host or host)
        self._held: dict[int, FlatWeights] = {}
        self._sending: FlatWeights | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._names = itertools.count()
        self._groups: dict[str, tuple[str, Any]] = {}
        self.num_served = 0
        self.num_failed = 0
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
            if not self._control.poll(POLL_MS):
                continue
            identity, *frames = self._control.recv_multipart()
            try:
                request = _parse_request(frames)
            except ProtocolError as err:  # refused and counted; the server keeps serving
                if self.on_reject is not None:
                    self.on_reject("bad_sync_request", str(err)[:80])
                self._answer(identity, TransferRefusal(f"bad request: {err}", False))
            else:
                found = self._look_up(request.policy_version)
                if isinstance(found, TransferRefusal):
                    self._answer(identity, found)
                else:
                    self._transfer(identity, request.worker_id, request.group, found)
            with self._lock:
                self._sending = None

    def _answer(self, identity: bytes, reply: TransferReply | TransferRefusal) -> None:
        self._control.send_multipart([identity, b"", messages.encode(reply)])

    def _transfer(self, identity: bytes, peer: str, held: str, weights: FlatWeights) -> None:
        """Send `weights` to `peer` over its group: the one it says it `held`, if the server has
        that one too, else a new one (a restarted generator holds none)."""
        known = self._groups.get(peer)
        if known is not None and known[0] != held:
            known = None
        name = known[0] if known is not None else f"w{next(self._names)}-{peer}"
        self._answer(
            identity,
            TransferReply(
                weights.policy_version,
                weights.num_bytes,
                weights.checksum,
                self.store.port,
                name,
                self.bucket_values,
            ),
        )
        try:
            if known is None:
                store = dist.PrefixStore(name, self.store)
                self._groups[peer] = (
                    name,
                    self.backend.make_group(store, 0, self.timeout_s, self.group_address),
                )
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


def _parse_request(frames: list[bytes]) -> TransferRequest:
    """The request in a message's frames ([b"", encoded TransferRequest]); ProtocolError if it is
    anything else."""
    if len(frames) != 2 or frames[0] != b"":
        raise ProtocolError("bad_frames", f"{len(frames)} frames, expected [b'', request]")
    request: TransferRequest = messages.decode(frames[1], TransferRequest)
    return request


class NotYet(SyncError):
    """The server has not published the version asked for yet."""


def _parse_reply(raw: bytes, endpoint: str) -> TransferReply:
    """The server's reply, checked; a refusal or a malformed reply is a SyncError naming it."""
    try:
        reply = messages.decode(raw, TransferReply, TransferRefusal)
    except ProtocolError as err:
        raise SyncError(f"weight server at {endpoint}: malformed reply ({err})") from None
    if isinstance(reply, TransferRefusal):
        refused = NotYet if reply.not_yet else SyncError
        raise refused(f"trainer weight server at {endpoint}: {reply.error[: messages.MAX_ERROR_TEXT]}")
    return reply


class P2PReceiver:
    """A generator's end towards one weight server: pulls versions, keeping the pair group
    between pulls (a new one is formed after a failure or when the server names another)."""

    def __init__(
        self, worker_id: str, backend: PairBackend, timeout_s: float, curve: Curve | None = None, checksum: bool = True
    ) -> None:
        self.worker_id = worker_id
        self.checksum = checksum
        self.backend = backend
        self.timeout_s = timeout_s
        self.curve = curve
        self._group: tuple[str, str, Any] | None = None  # (endpoint, name, group)

    def ask(self, endpoint: str, policy_version: int, should_stop: StopCheck = never_stop) -> TransferReply:
        """Ask the server at `endpoint` for `policy_version` (again while it has not published
        it yet, up to the timeout); its reply. The transfer must follow (`receive`)."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                return self._ask_once(endpoint, policy_version, should_stop, deadline)
            except NotYet:
                if time.monotonic() > deadline:
                    raise
                time.sleep(POLL_MS / 1000)

    def _ask_once(self, endpoint: str, policy_version: int, should_stop: StopCheck, deadline: float) -> TransferReply:
        ctx = zmq.Context()
        sock = make_socket(ctx, zmq.DEALER, 10, self.curve)
        try:
            sock.connect(endpoint)
            held = self._group[1] if self._group is not None and self._group[0] == endpoint else ""
            request = TransferRequest(self.worker_id, held, policy_version)
            sock.send_multipart([b"", messages.encode(request)])
            while not sock.poll(POLL_MS):
                if should_stop():
                    raise SyncError(f"stopped while waiting for the weight server at {endpoint}")
                if time.monotonic() > deadline:
                    raise SyncError(f"trainer weight server at {endpoint} did not answer in {self.timeout_s}s")
            return _parse_reply(sock.recv_multipart()[-1], endpoint)
        finally:
            sock.close(linger=0)
            ctx.term()

    def _pair(self, endpoint: str, reply: TransferReply) -> Any:
        if self._group is not None and self._group[:2] == (endpoint, reply.group):
            return self._group[2]
        host = urlparse(endpoint).hostname or "127.0.0.1"
        store = dist.TCPStore(
            host,
            reply.store_port,
            is_master=False,
            timeout=datetime.timedelta(seconds=self.timeout_s),
        )
        group = self.backend.make_group(dist.PrefixStore(reply.group, store), 1, self.timeout_s, address_towards(host))
        self._group = (endpoint, reply.group, group)
        return group

    def receive(self, endpoint: str, reply: TransferReply, into: torch.Tensor) -> None:
        """Receive the version `reply` announced into `into` (of its size), verified: each
        bucket is checksummed while the next one is on its way."""
        digest = Checksum()
        timeout = datetime.timedelta(seconds=self.timeout_s)
        try:
            group = self._pair(endpoint, reply)
            spans = buckets(into.numel(), reply.bucket_values)
            pending = None
            for tag, (start, end) in enumerate(spans):
                if pending is None:
                    pending = group.recv([into[start:end]], 0, tag)
                pending.wait(timeout)
                pending = None
                if tag + 1 < len(spans):
                    after = spans[tag + 1]
                    pending = group.recv([into[after[0] : after[1]]], 0, tag + 1)
                if self.checksum:
                    digest.update(into[start:end].cpu())
        except (RuntimeError, dist.DistError) as err:
            self._group = None
            raise SyncError(f"weight transfer from {endpoint} failed: {str(err).splitlines()[0]}") from None
        if self.checksum and digest.hexdigest() != reply.checksum:
            raise SyncError(f"weights from {endpoint}: checksum mismatch")

    def fetch(
        self,
        endpoint: str,
        policy_version: int,
        should_stop: StopCheck = never_stop,
        into: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Pull `policy_version` from the server at `endpoint` into `into` (when it has the right
        size; else into a new buffer), verified."""
        reply = self.ask(endpoint, policy_version, should_stop)
        values = reply.num_bytes // 4
        device = self.backend.device
        if into is None or into.numel() != values or into.device.type != device:
            into = torch.empty(values, dtype=torch.float32, device=device)
        self.receive(endpoint, reply, into)
        return into

    def close(self) -> None:
        """Let go of the pair group (the server drops its end after its next failed send)."""
        self._group = None
