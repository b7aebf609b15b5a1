"""Choosing a transport and the two ends of the channel as the trainer and generators use them.

`auto` is NCCL when CUDA is present, else shared memory (one host, as `llamarl run` is). A
cluster on CPUs sets `sync.transport: gloo`. What a generator needs to pull a version is the
metadata the trainer announces with it (and stores in Redis): transport, endpoint, num_bytes,
checksum.

Publishing has two halves so that the trainer's critical path holds only the copy: `stage`
copies the weights into the transport's buffer (before the next optimizer step may change them);
`publish`, run on a background thread, checksums the copy and makes it visible.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llamarl.config import SyncConfig
from llamarl.curve import Curve
from llamarl.limits import RejectHook
from llamarl.weightsync.flat import FlatWeights, bind_flat, checksum, copy_into, num_values
from llamarl.weightsync.p2p import P2PReceiver, P2PWeightServer, StopCheck
from llamarl.weightsync.shm import ShmPublisher, StagedFile, fetch_shm


def resolve_transport(name: str) -> str:
    if name != "auto":
        return name
    return "nccl" if torch.cuda.is_available() else "shm"


@dataclass(frozen=True)
class Staged:
    """A version's weights copied out of the model, not yet visible to generators."""

    policy_version: int
    num_bytes: int
    handle: StagedFile | torch.Tensor


class WeightPublisher:
    """The trainer's end: stage a version, then publish it and get the metadata to announce."""

    def __init__(
        self,
        config: SyncConfig,
        run_id: str,
        curve: Curve | None = None,
        on_reject: RejectHook | None = None,
    ) -> None:
        self.transport = resolve_transport(config.transport)
        self._pool: list[torch.Tensor] = []  # staging buffers of network transports, reused
        self._staged: set[int] = set()  # ids of pool buffers staged and not yet published
        self._shm: ShmPublisher | None = None
        self._server: P2PWeightServer | None = None
        if self.transport == "shm":
            self._shm = ShmPublisher(run_id)
        else:
            self._server = P2PWeightServer(
                config.host,
                backend=self.transport,
                timeout_s=config.timeout_s,
                bucket_bytes=int(config.bucket_mb * 1024 * 1024),
                advertise_host=config.advertise_host,
                curve=curve,
                on_reject=on_reject,
            )

    def stage(self, model: torch.nn.Module, policy_version: int) -> Staged:
        """Copy the weights out (call between optimizer steps; cheap: one memcpy)."""
        if self._shm is not None:
            staged = self._shm.stage(model, policy_version)
            return Staged(policy_version, staged.num_bytes, staged)
        buffer = self._free_buffer(num_values(model))
        copy_into(model, buffer)
        return Staged(policy_version, buffer.numel() * 4, buffer)

    def _free_buffer(self, values: int) -> torch.Tensor:
        """A staging buffer the server no longer reads (a fresh one's first-touch page faults
        cost several times the copy itself)."""
        assert self._server is not None
        self._pool = [b for b in self._pool if b.numel() == values]
        free = [b for b in self._pool if id(b) not in self._staged and not self._server.in_use(b)]
        if free:
            buffer = free[0]
        else:
            buffer = torch.empty(values, dtype=torch.float32)
            self._pool.append(buffer)
        self._staged.add(id(buffer))
        return buffer

    def publish(self, staged: Staged) -> dict[str, str | int]:
        """Checksum and expose a staged version (safe off the training thread)."""
        if isinstance(staged.handle, StagedFile):
            assert self._shm is not None
            endpoint, digest = self._shm.publish(staged.handle)
        else:
            assert self._server is not None
            digest = checksum(staged.handle)
            self._server.publish(FlatWeights(staged.policy_version, staged.handle, digest))
            self._staged.discard(id(staged.handle))
            endpoint = self._server.endpoint
        return {
            "transport": self.transport,
            "endpoint": endpoint,
            "num_bytes": staged.num_bytes,
            "checksum": digest,
        }

    def discard(self, staged: Staged) -> None:
        """Drop a staged version that a newer one superseded before it was published."""
        if isinstance(staged.handle, StagedFile):
            staged.handle.temp.unlink(missing_ok=True)
        else:
            self._staged.discard(id(staged.handle))

    def close(self) -> None:
        if self._shm is not None:
            self._shm.close()
        if self._server is not None:
            self._server.close()


class WeightReceiver:
    """A generator's end: pull the version an announcement describes, verify it, bind the model
    to it. `sync.verify`: `auto` checks the checksum of network transfers and only the size of
    shared memory (a published file is complete by construction); `always` checks checksums
    everywhere; `size` only sizes (a trusted network, where TCP's own checksums suffice).
    Network pulls land in the buffer the model held before the last swap, so after the first two
    pulls none allocates memory."""

    def __init__(
        self, worker_id: str, timeout_s: float, curve: Curve | None = None, verify: str = "auto"
    ) -> None:
        self.worker_id = worker_id
        self.timeout_s = timeout_s
        self.curve = curve
        self.verify = verify
        self._p2p: dict[str, P2PReceiver] = {}
        self._held: torch.Tensor | None = None
        self._spare: torch.Tensor | None = None
        self._held_is_mapped = False

    def fetch(
        self, meta: dict[str, str], should_stop: StopCheck = lambda: False
    ) -> tuple[int, torch.Tensor]:
        transport = meta["transport"]
        if transport == "shm":
            expected = meta["checksum"] if self.verify == "always" else None
            buffer = fetch_shm(meta["endpoint"], int(meta["num_bytes"]), expected)
            return int(meta["policy_version"]), buffer
        if transport not in self._p2p:
            self._p2p[transport] = P2PReceiver(
                self.worker_id, transport, self.timeout_s, self.curve, self.verify != "size"
            )
        into, self._spare = self._spare, None
        return self._p2p[transport].fetch(meta["endpoint"], should_stop, into)

    def swap_in(self, model: torch.nn.Module, buffer: torch.Tensor, mapped: bool) -> None:
        """Bind the model to a fetched buffer; the one it held becomes the next pull's buffer
        (unless it was mapped shared memory, which is let go)."""
        bind_flat(model, buffer)
        previous, previous_mapped = self._held, self._held_is_mapped
        self._held, self._held_is_mapped = buffer, mapped
        if previous is not None and not previous_mapped:
            self._spare = previous
