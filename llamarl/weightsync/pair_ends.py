"""The point-to-point transport's two ends as a `WeightPublisher` (the trainer's: stages a
version into a spare buffer and hands it to its `P2PWeightServer`) and a `WeightReceiver` (a
generator's: pulls every shard's buffer from its server through a `P2PReceiver`, side by side).
gloo.py and nccl.py subclass them with their backend."""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar

import structlog
import torch

from llamarl.config import GlooSync, NcclSync
from llamarl.curve import Curve
from llamarl.errors import SyncError
from llamarl.limits import RejectHook
from llamarl.weightsync.base import (
    Meta,
    Staged,
    StopCheck,
    VersionRecord,
    WeightPublisher,
    WeightReceiver,
    never_stop,
)
from llamarl.weightsync.flat import (
    WHOLE,
    FlatWeights,
    Received,
    Shard,
    binds,
    checksum,
    copy_into,
    num_values,
)
from llamarl.weightsync.messages import Announced
from llamarl.weightsync.p2p import P2PWeightServer, PairBackend
from llamarl.weightsync.p2p_receiver import Moved, P2PReceiver, Recheck

log = structlog.get_logger(__name__)


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
        shard: Shard = WHOLE,
    ) -> None:
        super().__init__()
        self.shard = shard
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
        buffer = self._free_buffer(num_values(model, self.shard))
        copy_into(model, buffer, self.shard)
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
        return {
            "transport": self.name,
            "endpoint": self._server.endpoint,
            "num_bytes": staged.num_bytes,
            "checksum": digest,
            "layout": self.shard.layout,
        }

    def discard(self, staged: Staged[torch.Tensor]) -> None:
        self._staged.discard(id(staged.handle))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._server.close()
        self._pool.clear()


class PairGroupReceiver(WeightReceiver[tuple[torch.Tensor, Received]]):
    """A generator's end: pulls land in the buffer the model held before the last swap, so after
    the first two pulls none allocates memory. The shards of a version from a trainer of several
    ranks are received side by side (one thread each) into one flat buffer. `sync.verify` auto
    or always: checksum; size: sizes only (a trusted network, where TCP's own checksums
    suffice)."""

    backend: ClassVar[PairBackend]

    def __init__(self, config: GlooSync | NcclSync, worker_id: str, curve: Curve | None = None):
        self._config = config
        self._worker_id = worker_id
        self._curve = curve
        self._clients: dict[str, P2PReceiver] = {}
        self._held: torch.Tensor | None = None
        self._spare: torch.Tensor | None = None

    def _client(self, endpoint: str) -> P2PReceiver:
        if endpoint not in self._clients:
            config = self._config
            self._clients[endpoint] = P2PReceiver(
                self._worker_id, self.backend, config.timeout_s, self._curve, checksum=config.verify != "size"
            )
        return self._clients[endpoint]

    def fetch(
        self, meta: Mapping[str, str], should_stop: StopCheck = never_stop, record: VersionRecord | None = None
    ) -> tuple[int, tuple[torch.Tensor, Received]]:
        announced = Announced.parse(meta, self.name)
        deadline = time.monotonic() + self._config.timeout_s  # however often the trainer moves
        while True:
            for endpoint in [e for e in self._clients if e not in announced.endpoints]:
                self._clients.pop(endpoint).close()  # a trainer gone, or one this record replaced
            try:
                return self._fetch(announced, should_stop, _recheck(announced, record))
            except Moved:
                assert record is not None
                if time.monotonic() > deadline:
                    raise SyncError(f"the trainer moved again and again for {self._config.timeout_s:g} s") from None
                announced = Announced.parse(record.read(), self.name)
                log.info("following the version record", policy_version=announced.policy_version, to=announced.endpoint)

    def _fetch(
        self, announced: Announced, should_stop: StopCheck, recheck: Recheck | None
    ) -> tuple[int, tuple[torch.Tensor, Received]]:
        """Ask each shard's server in turn, and receive its shard the moment it has answered,
        side by side with the next ask: no server waits on this generator while it waits on
        another rank (a dead one must not hold the live ones for a timeout)."""
        version, total = announced.policy_version, announced.num_bytes
        into, self._spare = self._spare, None
        device = self.backend.device
        if into is None or into.numel() * 4 != total or into.device.type != device:
            into = torch.empty(total // 4, dtype=torch.float32, device=device)
        endpoints = announced.endpoints
        pieces: list[torch.Tensor] = []
        try:
            with ThreadPoolExecutor(len(endpoints), thread_name_prefix="shard") as pool:
                receiving = []
                for index, endpoint in enumerate(endpoints):
                    offset = sum(piece.numel() for piece in pieces) * 4
                    left = total - offset
                    sizes = (left, left) if index == len(endpoints) - 1 else (4, left)
                    client = self._client(endpoint)
                    reply = client.ask(endpoint, version, should_stop, recheck, sizes)
                    pieces.append(into[offset // 4 : (offset + reply.num_bytes) // 4])
                    if len(endpoints) == 1:  # on this thread, like the model's device
                        client.receive(endpoint, reply, pieces[-1])
                    else:
                        receiving.append(pool.submit(client.receive, endpoint, reply, pieces[-1]))
            for future in receiving:  # all done: the pool's exit waits for each
                future.result()
        except SyncError:
            self._spare = into
            raise
        return version, (into, Received([into] if not announced.rows else pieces, announced.rows))

    def swap_in(self, model: torch.nn.Module, fetched: tuple[torch.Tensor, Received]) -> None:
        """Bind the model to the fetched buffer (the one it held becomes the next pull's); a
        model of another dtype or device, or shards in the rows layout, are copied in, and the
        buffer is free again at once."""
        buffer, received = fetched
        bound = binds(model, buffer.device) and not received.rows
        received.put_in(model)
        if not bound:
            self._spare = buffer
            return
        previous, self._held = self._held, buffer
        if previous is not None and previous is not buffer:
            self._spare = previous

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        self._spare = None


def _recheck(announced: Announced, record: VersionRecord | None) -> Recheck | None:
    """While a request waits unanswered: whether the version `record` now names other servers
    than `announced` (a trainer restarted on a new endpoint), at a version as new at least."""
    if record is None:
        return None

    def moved() -> bool:
        now = record.read()
        try:
            current = Announced.parse(now, announced.transport)
        except SyncError:  # nothing recorded yet, or not for this transport: keep waiting
            return False
        return current.endpoint != announced.endpoint and current.policy_version >= announced.policy_version

    return Recheck(moved, record.every_s)
