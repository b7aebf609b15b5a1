"""The gloo transport: point-to-point torch.distributed send/recv on CPUs, trainer to each
generator over a two-rank group of their own (llamarl.weightsync.p2p), on one host or many."""

from __future__ import annotations

import datetime
from typing import Any

import torch.distributed as dist

from llamarl.config import GlooSync, transport_name
from llamarl.weightsync.p2p import PairBackend
from llamarl.weightsync.pair_ends import PairGroupPublisher, PairGroupReceiver


def gloo_pair_group(store: dist.Store, rank: int, timeout_s: float) -> Any:
    return dist.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=timeout_s))


GLOO = PairBackend("gloo", "cpu", gloo_pair_group)


class GlooPublisher(PairGroupPublisher):
    name = transport_name(GlooSync)
    backend = GLOO


class GlooReceiver(PairGroupReceiver):
    name = transport_name(GlooSync)
    backend = GLOO
