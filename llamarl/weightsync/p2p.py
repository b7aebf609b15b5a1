"""Point-to-point transport over torch.distributed: gloo on CPUs, NCCL on GPUs.

The trainer runs a `P2PWeightServer` thread: a ZeroMQ ROUTER (the sync control endpoint) and a
TCPStore. A generator asks for the latest version; the server answers with its size, checksum and
the name of the two-rank group (rank 0 trainer, rank 1 generator) that carries it, and the weights
go over in buckets with send/recv. The group is formed on a generator's first pull and kept for
the next ones, so a pull costs the transfer alone; generators still join and leave freely (a group
per generator, never a global world). A transfer that fails drops that generator's group and the
next pull forms a new one. Every wait has the sync timeout: a generator that dies mid-transfer
costs the trainer at most one timeout, and a trainer that does not answer raises SyncError naming
it. Transfers are served one at a time. Control messages have schemas (llamarl.weightsync.messages):
a malformed request is refused, answered and counted through `on_reject`; a malformed reply is a
SyncError naming the server.

`PairGroupPublisher` / `PairGroupReceiver` are the two ends as `WeightPublisher` /
`WeightReceiver`; gloo.py and nccl.py name them and set the device.
"""

from __future__ import annotations

import datetime
import itertools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlparse

import structlog
import torch
import torch.distributed as dist
import zmq

from llamarl.config import GlooSync, NcclSync
from llamarl.curve import Curve
from llamarl.errors import ProtocolError, SyncError
from llamarl.limits import RejectHook
from llamarl.net import make_socket
from llamarl.weightsync import messages
from llamarl.weightsync.base import (
    Meta,
    Staged,
    StopCheck,
    WeightPublisher,
    WeightReceiver,
    never_stop,
)
from llamarl.weightsync.flat import (
    Checksum,
    FlatWeights,
    bind_flat,
    checksum,
    copy_into,
    num_values,
)
from llamarl.weightsync.messages import Announced, TransferRefusal, TransferReply, TransferRequest

log = structlog.get_logger(__name__)
POLL_MS = 100


@dataclass(frozen=True)
class PairBackend:
    """What differs between gloo and NCCL: the process group's class and where buffers live."""

    name: str
    device: str
    make_group: Callable[[dist.Store, int, float], Any]
    """(store, rank, timeout_s) -> a two-rank process group of its own, outside any world."""


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
            host, 0, is_master=True, wait_for_workers=False,
            timeout=datetime.timedelta(seconds=timeout_s),
        )  # fmt: skip
        self._ctx = zmq.Context()
        self._auth = curve.authenticator(self._ctx) if curve is not None else None
        self._control = make_socket(self._ctx, zmq.ROUTER, 100, curve, server=True)
        port = self._control.bind_to_random_port(f"tcp://{host}")
        self.endpoint = f"tcp://{advertise_host or host}:{port}"
        self._latest: FlatWeights | None = None
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
        """Make `weights` the version served from now on (a transfer in flight keeps its own)."""
        with self._lock:
            self._latest = weights

    def in_use(self, buffer: torch.Tensor) -> bool:
        """Whether the server may still read `buffer` (the latest version or one being sent)."""
        with self._lock:
            held = (self._latest, self._sending)
        return any(w is not None and w.buffer is buffer for w in held)

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self._control.poll(POLL_MS):
                continue
            identity, *frames = self._control.recv_multipart()
            with self._lock:
                weights = self._sending = self._latest
            try:
                request = _parse_request(frames)
            except ProtocolError as err:  # refused and counted; the server keeps serving
                if self.on_reject is not None:
                    self.on_reject("bad_sync_request", str(err)[:80])
                self._answer(identity, TransferRefusal(f"bad request: {err}"))
            else:
                if weights is None:
                    self._answer(identity, TransferRefusal("no version yet"))
                else:
                    self._transfer(identity, request.worker_id, request.group, weights)
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
        self._answer(identity, TransferReply(
            weights.policy_version, weights.num_bytes, weights.checksum, self.store.port, name,
            self.bucket_values,
        ))  # fmt: skip
        try:
            if known is None:
                store = dist.PrefixStore(name, self.store)
                self._groups[peer] = (name, self.backend.make_group(store, 0, self.timeout_s))
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


def _parse_reply(raw: bytes, endpoint: str) -> TransferReply:
    """The server's reply, checked; a refusal or a malformed reply is a SyncError naming it."""
    try:
        reply = messages.decode(raw, TransferReply, TransferRefusal)
    except ProtocolError as err:
        raise SyncError(f"weight server at {endpoint}: malformed reply ({err})") from None
    if isinstance(reply, TransferRefusal):
        raise SyncError(
            f"trainer weight server at {endpoint}: {reply.error[: messages.MAX_ERROR_TEXT]}"
        )
    return reply


class P2PReceiver:
    """A generator's end: pulls versions from one trainer, keeping the pair group between pulls
    (a new one is formed after a failure or when the server names another)."""

    def __init__(self, worker_id: str, backend: PairBackend, timeout_s: float,
                 curve: Curve | None = None, checksum: bool = True) -> None:  # fmt: skip
        self.worker_id = worker_id
        self.checksum = checksum
        self.backend = backend
        self.timeout_s = timeout_s
        self.curve = curve
        self._group: tuple[str, str, Any] | None = None  # (endpoint, name, group)

    def _ask(self, endpoint: str, should_stop: StopCheck) -> TransferReply:
        ctx = zmq.Context()
        sock = make_socket(ctx, zmq.DEALER, 10, self.curve)
        try:
            sock.connect(endpoint)
            held = self._group[1] if self._group is not None and self._group[0] == endpoint else ""
            sock.send_multipart([b"", messages.encode(TransferRequest(self.worker_id, held))])
            deadline = time.monotonic() + self.timeout_s
            while not sock.poll(POLL_MS):
                if should_stop():
                    raise SyncError(f"stopped while waiting for the weight server at {endpoint}")
                if time.monotonic() > deadline:
                    raise SyncError(
                        f"trainer weight server at {endpoint} did not answer in {self.timeout_s}s"
                    )
            return _parse_reply(sock.recv_multipart()[-1], endpoint)
        finally:
            sock.close(linger=0)
            ctx.term()

    def _pair(self, endpoint: str, reply: TransferReply) -> Any:
        if self._group is not None and self._group[:2] == (endpoint, reply.group):
            return self._group[2]
        host = urlparse(endpoint).hostname or "127.0.0.1"
        store = dist.TCPStore(
            host, reply.store_port, is_master=False,
            timeout=datetime.timedelta(seconds=self.timeout_s),
        )  # fmt: skip
        group = self.backend.make_group(dist.PrefixStore(reply.group, store), 1, self.timeout_s)
        self._group = (endpoint, reply.group, group)
        return group

    def fetch(
        self,
        endpoint: str,
        should_stop: StopCheck = never_stop,
        into: torch.Tensor | None = None,
    ) -> tuple[int, torch.Tensor]:
        """Pull the latest version from the trainer at `endpoint` into `into` (when it has the
        right size; else into a new buffer), verified before it is returned. Each bucket is
        checksummed while the next one is on its way. Waiting for the server's answer ends
        early when `should_stop()` turns true."""
        reply = self._ask(endpoint, should_stop)
        device = self.backend.device
        values = reply.num_bytes // 4
        if into is None or into.numel() != values or into.device.type != device:
            into = torch.empty(values, dtype=torch.float32, device=device)
        digest = Checksum()
        timeout = datetime.timedelta(seconds=self.timeout_s)
        try:
            group = self._pair(endpoint, reply)
            spans = buckets(values, reply.bucket_values)
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
            raise SyncError(
                f"weight transfer from {endpoint} failed: {str(err).splitlines()[0]}"
            ) from None
        if self.checksum and digest.hexdigest() != reply.checksum:
            raise SyncError(f"weights from {endpoint}: checksum mismatch")
        return reply.policy_version, into

    def close(self) -> None:
        """Let go of the pair group (the server drops its end after its next failed send)."""
        self._group = None


class PairGroupPublisher(WeightPublisher[torch.Tensor]):
    """The trainer's end over a `P2PWeightServer`: `stage` copies into a staging buffer from a
    pool (a fresh one's first-touch page faults cost several times the copy itself), `publish`
    checksums it and hands it to the server."""

    backend: ClassVar[PairBackend]

    def __init__(
        self,
        config: GlooSync | NcclSync,
        curve: Curve | None = None,
        on_reject: RejectHook | None = None,
    ) -> None:
        super().__init__()
        self._pool: list[torch.Tensor] = []
        self._staged: set[int] = set()  # ids of pool buffers staged and not yet published
        self._server = P2PWeightServer(
            config.host,
            backend=self.backend,
            timeout_s=config.timeout_s,
            bucket_bytes=int(config.bucket_mb * 1024 * 1024),
            advertise_host=config.advertise_host,
            curve=curve,
            on_reject=on_reject,
        )
        self._closed = False

    def stage(self, model: torch.nn.Module, policy_version: int) -> Staged[torch.Tensor]:
        buffer = self._free_buffer(num_values(model))
        copy_into(model, buffer)
        return Staged(policy_version, buffer.numel() * 4, buffer)

    def _free_buffer(self, num_floats: int) -> torch.Tensor:
        """A staging buffer the server no longer reads."""
        self._pool = [b for b in self._pool if b.numel() == num_floats]
        free = [b for b in self._pool if id(b) not in self._staged and not self._server.in_use(b)]
        if free:
            buffer = free[0]
        else:
            buffer = torch.empty(num_floats, dtype=torch.float32)
            self._pool.append(buffer)
        self._staged.add(id(buffer))
        return buffer

    def publish(self, staged: Staged[torch.Tensor]) -> Meta:
        self._advance(staged.policy_version)
        digest = checksum(staged.handle)
        self._server.publish(FlatWeights(staged.policy_version, staged.handle, digest))
        self._staged.discard(id(staged.handle))
        return {"transport": self.name, "endpoint": self._server.endpoint,
                "num_bytes": staged.num_bytes, "checksum": digest}  # fmt: skip

    def discard(self, staged: Staged[torch.Tensor]) -> None:
        self._staged.discard(id(staged.handle))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._server.close()
        self._pool.clear()


class PairGroupReceiver(WeightReceiver[torch.Tensor]):
    """A generator's end: pulls land in the buffer the model held before the last swap, so after
    the first two pulls none allocates memory. `sync.verify` auto or always: checksum; size:
    sizes only (a trusted network, where TCP's own checksums suffice)."""

    backend: ClassVar[PairBackend]

    def __init__(self, config: GlooSync | NcclSync, worker_id: str, curve: Curve | None = None):
        self._client = P2PReceiver(
            worker_id, self.backend, config.timeout_s, curve, checksum=config.verify != "size"
        )
        self._held: torch.Tensor | None = None
        self._spare: torch.Tensor | None = None

    def fetch(
        self, meta: Mapping[str, str], should_stop: StopCheck = never_stop
    ) -> tuple[int, torch.Tensor]:
        announced = Announced.parse(meta, self.name)
        into, self._spare = self._spare, None
        try:
            policy_version, buffer = self._client.fetch(announced.endpoint, should_stop, into)
        except SyncError:
            self._spare = into
            raise
        if policy_version < announced.policy_version:
            self._spare = buffer
            raise SyncError(
                f"weight server at {announced.endpoint} served version {policy_version}, "
                f"older than the announced {announced.policy_version}"
            )
        return policy_version, buffer

    def swap_in(self, model: torch.nn.Module, fetched: torch.Tensor) -> None:
        """Bind the model to the fetched buffer; the one it held becomes the next pull's."""
        bind_flat(model, fetched)
        previous, self._held = self._held, fetched
        if previous is not None and previous is not fetched:
            self._spare = previous

    def close(self) -> None:
        self._client.close()
        self._spare = None
