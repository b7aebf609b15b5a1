"""A generator's end of the point-to-point transport (llamarl.weightsync.p2p has the protocol
and the trainer's weight server).

`P2PReceiver.ask` sends a request to one weight server, waits for the reply (asking again while
the server answers "not yet"), and answers it with a go (or declines a size it cannot take), on
the same connection; `receive` then takes the transfer over the pair group, verified. A request
unanswered for a while may be waiting on a trainer that is gone: a `Recheck` (the version record,
read every heartbeat) ends the wait with Moved once the record names another trainer, and the
caller asks that one. A generator that gives up closes its connection, so the server never
serves its request late.
"""

from __future__ import annotations

import datetime
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import torch
import torch.distributed as dist
import zmq

from llamarl.curve import Curve
from llamarl.errors import ProtocolError, SyncError
from llamarl.net import address_towards, make_socket
from llamarl.weightsync import messages
from llamarl.weightsync.base import StopCheck, never_stop
from llamarl.weightsync.flat import Checksum
from llamarl.weightsync.messages import TransferGo, TransferRefusal, TransferReply, TransferRequest
from llamarl.weightsync.p2p import GO_LINGER_MS, POLL_MS, PairBackend, buckets


class NotYet(SyncError):
    """The server has not published the version asked for yet."""


class Moved(SyncError):
    """The version record names another trainer than the one asked (`Recheck`)."""


@dataclass(frozen=True)
class Recheck:
    """What else ends a wait for a server's reply: `moved()`, asked every `every_s` while the
    request is unanswered, turns true once the version record names another trainer."""

    moved: Callable[[], bool]
    every_s: float


class _Patience:
    """One ask's wait: its deadline, the stop check, and the rechecks of the version record."""

    def __init__(self, timeout_s: float, should_stop: StopCheck, recheck: Recheck | None) -> None:
        self.timeout_s = timeout_s
        self.should_stop = should_stop
        self.recheck = recheck
        now = time.monotonic()
        self.deadline = now + timeout_s
        self.next_check = now + recheck.every_s if recheck is not None else math.inf

    def expired(self) -> bool:
        return time.monotonic() > self.deadline

    def check(self, endpoint: str) -> None:
        """SyncError once the wait must end (a stop, the timeout); Moved once the version
        record names another trainer."""
        if self.should_stop():
            raise SyncError(f"stopped while waiting for the weight server at {endpoint}")
        now = time.monotonic()
        if self.recheck is not None and now >= self.next_check:
            self.next_check = now + self.recheck.every_s
            if self.recheck.moved():
                raise Moved(f"the version record names another trainer than {endpoint}")
        if now > self.deadline:
            raise SyncError(f"trainer weight server at {endpoint} did not answer in {self.timeout_s}s")


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

    def ask(
        self,
        endpoint: str,
        policy_version: int,
        should_stop: StopCheck = never_stop,
        recheck: Recheck | None = None,
        sizes: tuple[int, int] = (4, 2**62),
    ) -> TransferReply:
        """Ask the server at `endpoint` for `policy_version` (again while it has not published
        it yet, up to the timeout; Moved once `recheck` says so) and say go: the transfer must
        follow at once (`receive`). A reply whose size is outside `sizes` (bytes, lowest and
        highest) is declined, a SyncError."""
        patience = _Patience(self.timeout_s, should_stop, recheck)
        while True:
            try:
                return self._ask_once(endpoint, policy_version, patience, sizes)
            except NotYet:
                if patience.expired():
                    raise
                patience.check(endpoint)
                time.sleep(POLL_MS / 1000)

    def _ask_once(
        self, endpoint: str, policy_version: int, patience: _Patience, sizes: tuple[int, int]
    ) -> TransferReply:
        ctx = zmq.Context()
        sock = make_socket(ctx, zmq.DEALER, 10, self.curve)
        linger_ms = 0
        try:
            sock.connect(endpoint)
            held = self._group[1] if self._group is not None and self._group[0] == endpoint else ""
            request = TransferRequest(self.worker_id, held, policy_version)
            sock.send_multipart([b"", messages.encode(request)])
            while not sock.poll(POLL_MS):
                patience.check(endpoint)
            reply = _parse_reply(sock.recv_multipart()[-1], endpoint)
            go = sizes[0] <= reply.num_bytes <= sizes[1]
            sock.send_multipart([b"", messages.encode(TransferGo(reply.policy_version, go))])
            linger_ms = GO_LINGER_MS
            if not go:
                wanted = str(sizes[0]) if sizes[0] == sizes[1] else f"{sizes[0]} to {sizes[1]}"
                raise SyncError(f"weight server at {endpoint}: {reply.num_bytes} bytes, announced {wanted}")
            return reply
        finally:
            sock.close(linger=linger_ms)
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
