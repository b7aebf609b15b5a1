"""Transports by name: `make_publisher` / `make_receiver` build the two ends from `sync` config.

`TRANSPORTS` maps each `sync` config variant (whose `transport` literal is the one spelling of its
name) to the factories of its two ends; nothing in the library compares transport names.
`auto` is resolved here and only here (`resolve_transport`):
shm when the weight server's address (advertise_host, else host) is this host's own (loopback
or unspecified: one host, as `llamarl run` is); else nccl when CUDA is present; else gloo.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from llamarl.config import (
    AutoSync,
    ConcreteSync,
    GlooSync,
    LocalSync,
    NcclSync,
    ShmSync,
    SyncConfig,
)
from llamarl.curve import Curve
from llamarl.errors import ConfigError
from llamarl.limits import RejectHook
from llamarl.net import address_towards
from llamarl.weightsync.base import WeightPublisher, WeightReceiver
from llamarl.weightsync.flat import WHOLE, Shard
from llamarl.weightsync.gloo import GlooPublisher, GlooReceiver
from llamarl.weightsync.local import LocalPublisher, LocalReceiver
from llamarl.weightsync.nccl import NcclPublisher, NcclReceiver
from llamarl.weightsync.shm import ShmPublisher, ShmReceiver


@dataclass(frozen=True)
class Transport:
    """How to build the two ends of one transport from its config variant."""

    publisher: Callable[[Any, str, Curve | None, RejectHook | None, Shard], WeightPublisher[Any]]
    """(config, run_id, curve, on_reject, shard) -> the trainer's end (of one rank's shard)."""
    receiver: Callable[[Any, str, Curve | None], WeightReceiver[Any]]
    """(config, worker_id, curve) -> a generator's end."""


TRANSPORTS: dict[type[ConcreteSync], Transport] = {
    ShmSync: Transport(
        lambda config, run_id, curve, on_reject, shard: ShmPublisher(run_id, shard=shard),
        lambda config, worker_id, curve: ShmReceiver(config),
    ),
    GlooSync: Transport(
        lambda config, run_id, curve, on_reject, shard: GlooPublisher(config, curve, on_reject, shard),
        lambda config, worker_id, curve: GlooReceiver(config, worker_id, curve),
    ),
    NcclSync: Transport(
        lambda config, run_id, curve, on_reject, shard: NcclPublisher(config, curve, on_reject, shard),
        lambda config, worker_id, curve: NcclReceiver(config, worker_id, curve),
    ),
    LocalSync: Transport(
        lambda config, run_id, curve, on_reject, shard: LocalPublisher(run_id),
        lambda config, worker_id, curve: LocalReceiver(),
    ),
}


def _is_this_host(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:  # a host name: reached from elsewhere
        return False
    return ip.is_loopback or ip.is_unspecified


def advertise_towards(config: SyncConfig, peer: str) -> SyncConfig:
    """`config` with `advertise_host` set where the weight server binds every address (0.0.0.0
    or ::) and none is advertised: this machine's address on the route to `peer` (the broker's
    host), which is where generators elsewhere reach it, wherever a scheduler placed the
    trainer. Any other config is returned as it is."""
    if not isinstance(config, AutoSync | GlooSync | NcclSync):
        return config
    if config.advertise_host or not _binds_every_address(config.host):
        return config
    return config.model_copy(update={"advertise_host": address_towards(peer)})


def _binds_every_address(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:  # a host name
        return False


def resolve_transport(config: SyncConfig) -> ConcreteSync:
    """The config variant `auto` stands for on this machine; any other is returned as is. One
    host takes shm whatever the devices (NCCL between two processes on one GPU does not work;
    the generator copies each version to its device); across hosts nccl with CUDA, else gloo."""
    if not isinstance(config, AutoSync):
        return config
    fields = config.model_dump(exclude={"transport"})
    if _is_this_host(config.advertise_host or config.host):
        return ShmSync(**config.model_dump(include={"timeout_s", "verify", "every_steps"}))
    if torch.cuda.is_available():
        return NcclSync(**fields)
    return GlooSync(**fields)


def make_publisher(
    sync_config: SyncConfig,
    run_id: str,
    curve: Curve | None = None,
    on_reject: RejectHook | None = None,
    shard: Shard = WHOLE,
) -> WeightPublisher[Any]:
    """The trainer's end of the configured transport (for one rank's `shard` of each version);
    `on_reject` counts malformed requests."""
    config = resolve_transport(sync_config)
    return TRANSPORTS[type(config)].publisher(config, run_id, curve, on_reject, shard)


def make_receiver(sync_config: SyncConfig, worker_id: str, curve: Curve | None = None) -> WeightReceiver[Any]:
    """A generator's end of the configured transport."""
    config = resolve_transport(sync_config)
    return TRANSPORTS[type(config)].receiver(config, worker_id, curve)


def check_crosses_processes(config: SyncConfig) -> None:
    """ConfigError naming `sync.transport` when it cannot move weights between processes."""
    if isinstance(resolve_transport(config), LocalSync):
        raise ConfigError(
            "sync.transport: local hands weights over inside one process; it works only with "
            "`llamarl run --mode sync`. Use shm (one host), gloo or nccl"
        )
