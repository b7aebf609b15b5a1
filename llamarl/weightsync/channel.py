"""Choosing a transport and the two ends of the channel as the trainer and generators use them.

`auto` is NCCL when CUDA is present, else shared memory (one host, as `llamarl run` is). A
cluster on CPUs sets `sync.transport: gloo`. What a generator needs to pull a version is the
metadata the trainer stores with it in Redis: transport, endpoint, num_bytes, checksum.
"""

from __future__ import annotations

import torch

from llamarl.config import SyncConfig
from llamarl.curve import Curve
from llamarl.limits import RejectHook
from llamarl.weightsync.flat import FlatWeights
from llamarl.weightsync.p2p import P2PWeightServer, StopCheck, fetch_p2p
from llamarl.weightsync.shm import ShmPublisher, fetch_shm


def resolve_transport(name: str) -> str:
    if name != "auto":
        return name
    return "nccl" if torch.cuda.is_available() else "shm"


class WeightPublisher:
    """The trainer's end: publish a version, get the metadata to announce."""

    def __init__(
        self,
        config: SyncConfig,
        run_id: str,
        curve: Curve | None = None,
        on_reject: RejectHook | None = None,
    ) -> None:
        self.transport = resolve_transport(config.transport)
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

    def publish(self, weights: FlatWeights) -> dict[str, str | int]:
        if self._shm is not None:
            endpoint = self._shm.publish(weights)
        else:
            assert self._server is not None
            self._server.publish(weights)
            endpoint = self._server.endpoint
        return {
            "transport": self.transport,
            "endpoint": endpoint,
            "num_bytes": weights.num_bytes,
            "checksum": weights.checksum,
        }

    def close(self) -> None:
        if self._shm is not None:
            self._shm.close()
        if self._server is not None:
            self._server.close()


def fetch_weights(
    meta: dict[str, str],
    worker_id: str,
    timeout_s: float,
    should_stop: StopCheck = lambda: False,
    curve: Curve | None = None,
) -> tuple[int, torch.Tensor]:
    """The generator's end: pull and verify the version described by `meta`."""
    transport = meta["transport"]
    if transport == "shm":
        buffer = fetch_shm(meta["endpoint"], int(meta["num_bytes"]), meta["checksum"])
        return int(meta["policy_version"]), buffer
    return fetch_p2p(
        meta["endpoint"],
        worker_id,
        backend=transport,
        timeout_s=timeout_s,
        should_stop=should_stop,
        curve=curve,
    )
