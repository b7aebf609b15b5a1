"""The gloo transport: point-to-point torch.distributed send/recv on CPUs, trainer to each
generator over a two-rank group of their own (llamarl.weightsync.p2p), on one host or many."""

from __future__ import annotations

import datetime
from typing import Any

import torch.distributed as dist

from llamarl.config import GlooSync, transport_name
from llamarl.weightsync.p2p import PairBackend
from llamarl.weightsync.pair_ends import PairGroupPublisher, PairGroupReceiver


def gloo_pair_group(store: dist.Store, rank: int, timeout_s: float, address: str | None) -> Any:
    """A two-rank gloo group whose end here listens on `address`: gloo's own choice resolves
    the host name, which on a machine whose name does not resolve (or resolves to loopback) is
    127.0.0.1, out of a peer's reach on another host."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if address is None:
        return dist.ProcessGroupGloo(store, rank, 2, timeout)
    options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # torch's own API
    options._timeout = timeout
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=address)]
    return dist.ProcessGroupGloo(store, rank, 2, options)


GLOO = PairBackend("gloo", "cpu", gloo_pair_group)


class GlooPublisher(PairGroupPublisher):
    name = transport_name(GlooSync)
    backend = GLOO


class GlooReceiver(PairGroupReceiver):
    name = transport_name(GlooSync)
    backend = GLOO
