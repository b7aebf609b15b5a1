"""Point-to-point transport over torch.distributed: gloo on CPUs, NCCL on GPUs.

The trainer runs a `P2PWeightServer` thread: a ZeroMQ ROUTER (the sync control endpoint) and a
TCPStore. A generator asks for the latest version; the server answers with its size, checksum and
a fresh group name, then both sides form a two-rank group of their own (rank 0 trainer, rank 1
generator) on the store and the weights go over in buckets with send/recv. Every wait has the
sync timeout: a generator that dies mid-transfer costs the trainer at most one timeout, and a
trainer that does not answer raises SyncError naming it. Transfers are served one at a time.
"""

from __future__ import annotations

import datetime
import itertools
import threading
import time
from collections.abc import Callable
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
from llamarl.weightsync.flat import FlatWeights, verify

log = structlog.get_logger(__name__)
POLL_MS = 100
MAX_REQUEST_BYTES = 1024
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
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._groups = itertools.count()
        self.num_served = 0
        self.num_failed = 0
        self._thread = threading.Thread(target=self._serve, name="weight-server", daemon=True)
        self._thread.start()

    def publish(self, weights: FlatWeights) -> None:
        """Make `weights` the version served from now on (a transfer in flight keeps its own)."""
        with self._lock:
            self._latest = weights

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self._control.poll(POLL_MS):
                continue
            identity, *request = self._control.recv_multipart()
            with self._lock:
                weights = self._latest
            peer = _requesting_worker(request)
            if peer is None:  # refused and counted; the server keeps serving
                if self.on_reject is not None:
                    self.on_reject("bad_sync_request", repr(request[:2])[:80])
                self._control.send_multipart(
                    [identity, b"", msgpack.packb({"error": "bad request"})]
                )
                continue
            if weights is None:
                self._control.send_multipart(
                    [identity, b"", msgpack.packb({"error": "no version yet"})]
                )
                continue
            self._transfer(identity, peer, weights)

    def _transfer(self, identity: bytes, peer: str, weights: FlatWeights) -> None:
        group = f"w{next(self._groups)}-{peer}"
        reply = {
            "policy_version": weights.policy_version,
            "num_bytes": weights.num_bytes,
            "checksum": weights.checksum,
            "store_port": self.store.port,
            "group": group,
            "bucket_values": self.bucket_values,
        }
        self._control.send_multipart([identity, b"", msgpack.packb(reply)])
        try:
            pg = pair_group(self.backend, dist.PrefixStore(group, self.store), 0, self.timeout_s)
            buffer = weights.buffer.to(self.device)
            for tag, (start, end) in enumerate(buckets(buffer.numel(), self.bucket_values)):
                pg.send([buffer[start:end]], 1, tag).wait(
                    datetime.timedelta(seconds=self.timeout_s)
                )
            self.num_served += 1
        except Exception as err:  # a dead or stuck peer must not stop the server
            self.num_failed += 1
            log.warning("weight transfer failed", peer=peer, error=str(err).splitlines()[0][:160])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(self.timeout_s + 1)
        self._control.close(linger=0)
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()


def _requesting_worker(frames: list[bytes]) -> str | None:
    """The worker id of a well-formed request ([b"", msgpack {"worker_id": str}]), else None."""
    if len(frames) != 2 or frames[0] != b"" or len(frames[1]) > MAX_REQUEST_BYTES:
        return None
    try:
        request = msgpack.unpackb(frames[1], raw=False, ext_hook=_no_ext, max_ext_len=0)
    except Exception:  # msgpack raises many types on bad input; all mean garbage
        return None
    if not isinstance(request, dict) or not isinstance(request.get("worker_id"), str):
        return None
    return request["worker_id"][:64]


def _no_ext(code: int, data: bytes) -> None:
    raise ValueError("msgpack extension types are not allowed")


def _await_reply(sock: zmq.Socket, endpoint: str, timeout_s: float, should_stop: StopCheck) -> Any:
    deadline = time.monotonic() + timeout_s
    while not sock.poll(POLL_MS):
        if should_stop():
            raise SyncError(f"stopped while waiting for the weight server at {endpoint}")
        if time.monotonic() > deadline:
            raise SyncError(f"trainer weight server at {endpoint} did not answer in {timeout_s}s")
    return msgpack.unpackb(sock.recv_multipart()[-1], raw=False)


def fetch_p2p(
    endpoint: str,
    worker_id: str,
    *,
    backend: str,
    timeout_s: float,
    should_stop: StopCheck = lambda: False,
    curve: Curve | None = None,
) -> tuple[int, torch.Tensor]:
    """Pull the latest version from the trainer at `endpoint`; verified before it is returned.
    Waiting for the server's answer ends early when `should_stop()` turns true."""
    ctx = zmq.Context()
    sock = make_socket(ctx, zmq.DEALER, 10, curve)
    try:
        sock.connect(endpoint)
        sock.send_multipart([b"", msgpack.packb({"worker_id": worker_id})])
        reply = _await_reply(sock, endpoint, timeout_s, should_stop)
    finally:
        sock.close(linger=0)
        ctx.term()
    if "error" in reply:
        raise SyncError(f"trainer weight server at {endpoint}: {reply['error']}")
    host = urlparse(endpoint).hostname or "127.0.0.1"
    try:
        store = dist.TCPStore(
            host, reply["store_port"], is_master=False,
            timeout=datetime.timedelta(seconds=timeout_s),
        )  # fmt: skip
        pg = pair_group(backend, dist.PrefixStore(reply["group"], store), 1, timeout_s)
        device = "cuda" if backend == "nccl" else "cpu"
        buffer = torch.empty(reply["num_bytes"] // 4, dtype=torch.float32, device=device)
        for tag, (start, end) in enumerate(buckets(buffer.numel(), reply["bucket_values"])):
            chunk = buffer[start:end]
            pg.recv([chunk], 0, tag).wait(datetime.timedelta(seconds=timeout_s))
    except (RuntimeError, dist.DistError) as err:
        raise SyncError(
            f"weight transfer from {endpoint} failed: {str(err).splitlines()[0]}"
        ) from None
    buffer = buffer.cpu()
    verify(buffer, reply["num_bytes"], reply["checksum"], endpoint)
    return int(reply["policy_version"]), buffer
