"""The NCCL transport: the gloo transport's shape (llamarl.weightsync.p2p) over NCCL, the
buffers in CUDA memory: the trainer stages on the CPU and each transfer copies its version to the
GPU; a generator receives into a CUDA buffer and binds its model to it. Needs a GPU at both
ends; not exercised on CPU-only machines (the contract suite skips it there)."""

from __future__ import annotations

import datetime
from typing import Any

import torch.distributed as dist

from llamarl.config import NcclSync, transport_name
from llamarl.weightsync.p2p import PairBackend
from llamarl.weightsync.pair_ends import PairGroupPublisher, PairGroupReceiver


def nccl_pair_group(store: dist.Store, rank: int, timeout_s: float, address: str | None) -> Any:
    """A two-rank NCCL group (NCCL finds its own interface: NCCL_SOCKET_IFNAME; `address` is
    gloo's concern)."""
    del address
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = datetime.timedelta(seconds=timeout_s)
    return dist.ProcessGroupNCCL(store, rank, 2, options)


NCCL = PairBackend("nccl", "cuda", nccl_pair_group)


class NcclPublisher(PairGroupPublisher):
    name = transport_name(NcclSync)
    backend = NCCL


class NcclReceiver(PairGroupReceiver):
    name = transport_name(NcclSync)
    backend = NCCL
