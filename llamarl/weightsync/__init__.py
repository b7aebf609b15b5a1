"""The weight-sync channel: trainer -> generators, apart from the data bus.

`base` declares the interface (WeightPublisher, WeightReceiver); one module per transport
implements it: `shm` (one host: a file in /dev/shm written atomically, mapped by generators),
`gloo` and `nccl` (point-to-point torch.distributed send/recv in a two-rank group per generator,
sharing `p2p`, so generators join and leave without a global world), `local` (trainer and
generator in one process, nothing copied). `registry` builds them by `sync.transport`. A receiver
verifies size and checksum (per `sync.verify`) before it hands weights over, so a corrupted or
truncated transfer is never swapped in.
"""

from llamarl.weightsync.base import Staged, VersionRecord, WeightPublisher, WeightReceiver
from llamarl.weightsync.registry import (
    TRANSPORTS,
    Transport,
    advertise_towards,
    check_crosses_processes,
    make_publisher,
    make_receiver,
    resolve_transport,
)

__all__ = [
    "TRANSPORTS",
    "Staged",
    "Transport",
    "VersionRecord",
    "WeightPublisher",
    "WeightReceiver",
    "advertise_towards",
    "make_publisher",
    "make_receiver",
    "check_crosses_processes",
    "resolve_transport",
]
