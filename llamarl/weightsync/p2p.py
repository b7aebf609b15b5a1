"""Point-to-point transport over torch.distributed: gloo on CPUs, NCCL on GPUs.

The trainer runs a `P2PWeightServer` thread: a ZeroMQ ROUTER (the sync control endpoint) and a
TCPStore. A generator asks for the latest version; the server answers with its size, checksum and
the name of the two-rank group (rank 0 trainer, rank 1 generator) that carries it, and the weights
go over in buckets with send/recv. The group is formed on a generator's first pull and kept for
the next ones, so a pull costs the transfer alone; generators still join and leave freely (a group
per generator, never a global world). A transfer that fails drops that generator's group and the
next pull forms a new one. Every wait has the sync timeout: a generator that dies mid-transfer
costs the trainer at most one timeout, and a trainer that does not answer raises SyncError naming
it. Transfers are served one at a time. Control messages are msgpack maps checked field by field.
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

import msgpack
import structlog
import torch
import torch.distributed as dist
import zmq

from llamarl.curve import Curve
from llamarl.errors import SyncError
from llamarl.limits import RejectHook
from llamarl.net import make_socket
from llamarl.weightsync.flat import Checksum, FlatWeights

log = structlog.get_logger(__name__)
POLL_MS = 100
MAX_REQUEST_BYTES = 1024
MAX_REPLY_BYTES = 4096
StopCheck = Callable[[], bool]


def pair_group(backend: str, store: dist.Store, rank: int, timeout_s: float) -> Any:
    """A two-rank process group of its own, outside any global world."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "nccl":  # not exercised on CPU-only machines
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, 2, options)
    return dist.ProcessGroupGloo(store, rank, 2, timeout)


def buckets(total: int, bucket_values: int) -> list[tuple[int, int]]:
    return [(start, min(start + bucket_values, total)) for start in range(0, total, bucket_values)]


@dataclass(frozen=True)
class TransferReply:
    """The server's answer to a pull: what is coming and over which group."""

    policy_version: int
    num_bytes: int
    checksum: str
    store_port: int
    group: str
    bucket_values: int

    @classmethod
    def parse(cls, raw: bytes, endpoint: str) -> TransferReply:
        """Check every field of a reply; a malformed one is a SyncError naming the server."""
        try:
            if len(raw) > MAX_REPLY_BYTES:
                raise ValueError("oversize")
            reply = msgpack.unpackb(raw, raw=False, ext_hook=_no_ext, max_ext_len=0)
        except Exception:  # msgpack raises many types on bad input; all mean garbage
            raise SyncError(f"weight server at {endpoint}: unreadable reply") from None
        if isinstance(reply, dict) and isinstance(reply.get("error"), str):
            raise SyncError(f"trainer weight server at {endpoint}: {reply['error'][:200]}")
        fields = {"policy_version": int, "num_bytes": int, "checksum": str, "store_port": int,
                  "group": str, "bucket_values": int}  # fmt: skip
        if not isinstance(reply, dict) or set(reply) != set(fields):
            raise SyncError(f"weight server at {endpoint}: malformed reply")
        for name, typ in fields.items():
            if type(reply[name]) is not typ:
                raise SyncError(f"weight server at {endpoint}: reply field {name} is not {typ}")
        if reply["num_bytes"] % 4 or reply["bucket_values"] < 1:
            raise SyncError(f"weight server at {endpoint}: impossible sizes in reply")
        return cls(**reply)


class P2PWeightServer:
    def __init__(
        self,
        host: str,
        *,
        backend: str,
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
        self.device = "cuda" if backend == "nccl" else "cpu"
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
            identity, *request = self._control.recv_multipart()
            with self._lock:
                weights = self._sending = self._latest
            asked = _parse_request(request)
            if asked is None:  # refused and counted; the server keeps serving
                if self.on_reject is not None:
                    self.on_reject("bad_sync_request", repr(request[:2])[:80])
                self._answer(identity, {"error": "bad request"})
            elif weights is None:
                self._answer(identity, {"error": "no version yet"})
            else:
                self._transfer(identity, *asked, weights)
            with self._lock:
                self._sending = None

    def _answer(self, identity: bytes, reply: dict[str, Any]) -> None:
        self._control.send_multipart([identity, b"", msgpack.packb(reply)])

    def _transfer(self, identity: bytes, peer: str, held: str, weights: FlatWeights) -> None:
        """Send `weights` to `peer` over its group: the one it says it `held`, if the server has
        that one too, else a new one (a restarted generator holds none)."""
        known = self._groups.get(peer)
        if known is not None and known[0] != held:
            known = None
        name = known[0] if known is not None else f"w{next(self._names)}-{peer}"
        self._answer(identity, {
            "policy_version": weights.policy_version, "num_bytes": weights.num_bytes,
            "checksum": weights.checksum, "store_port": self.store.port, "group": name,
            "bucket_values": self.bucket_values,
        })  # fmt: skip
        try:
            if known is None:
                store = dist.PrefixStore(name, self.store)
                self._groups[peer] = (name, pair_group(self.backend, store, 0, self.timeout_s))
            group = self._groups[peer][1]
            buffer = weights.buffer.to(self.device)
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


def _parse_request(frames: list[bytes]) -> tuple[str, str] | None:
    """(worker id, name of the group it holds or "") of a well-formed request
    ([b"", msgpack {"worker_id": str, "group": str}]), else None."""
    if len(frames) != 2 or frames[0] != b"" or len(frames[1]) > MAX_REQUEST_BYTES:
        return None
    try:
        request = msgpack.unpackb(frames[1], raw=False, ext_hook=_no_ext, max_ext_len=0)
    except Exception:  # msgpack raises many types on bad input; all mean garbage
        return None
    if not isinstance(request, dict) or set(request) != {"worker_id", "group"}:
        return None
    if not all(isinstance(value, str) for value in request.values()):
        return None
    return request["worker_id"][:64], request["group"][:160]


def _no_ext(code: int, data: bytes) -> None:
    raise ValueError("msgpack extension types are not allowed")


class P2PReceiver:
    """A generator's end: pulls versions from one trainer, keeping the pair group between pulls
    (a new one is formed after a failure or when the server names another)."""

    def __init__(self, worker_id: str, backend: str, timeout_s: float,
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
            request = {"worker_id": self.worker_id, "group": held}
            sock.send_multipart([b"", msgpack.packb(request)])
            deadline = time.monotonic() + self.timeout_s
            while not sock.poll(POLL_MS):
                if should_stop():
                    raise SyncError(f"stopped while waiting for the weight server at {endpoint}")
                if time.monotonic() > deadline:
                    raise SyncError(
                        f"trainer weight server at {endpoint} did not answer in {self.timeout_s}s"
                    )
            return TransferReply.parse(sock.recv_multipart()[-1], endpoint)
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
        group = pair_group(self.backend, dist.PrefixStore(reply.group, store), 1, self.timeout_s)
        self._group = (endpoint, reply.group, group)
        return group

    def fetch(
        self,
        endpoint: str,
        should_stop: StopCheck = lambda: False,
        into: torch.Tensor | None = None,
    ) -> tuple[int, torch.Tensor]:
        """Pull the latest version from the trainer at `endpoint` into `into` (when it has the
        right size; else into a new buffer), verified before it is returned. Each bucket is
        checksummed while the next one is on its way. Waiting for the server's answer ends
        early when `should_stop()` turns true."""
        reply = self._ask(endpoint, should_stop)
        device = "cuda" if self.backend == "nccl" else "cpu"
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
