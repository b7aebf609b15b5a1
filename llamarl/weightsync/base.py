"""The weight-transport interface: what a trainer and a generator need of the weight-sync channel.

A transport is a pair: the trainer's `WeightPublisher` and a generator's `WeightReceiver`, one
module per backend (shm, gloo, nccl, local), built by name from `llamarl.weightsync.registry`.
Publishing has two halves so that the trainer's critical path holds only the copy: `stage` copies
the weights out (before the next optimizer step may change them); `publish`, run on a background
thread, checksums the copy, makes it visible and returns the metadata to announce. A generator
`fetch`es the version an announcement describes, verified, and `swap_in`s it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

import torch

from llamarl.errors import StaleVersionError

StopCheck = Callable[[], bool]
Meta = dict[str, str | int]
"""What `publish` returns: transport, endpoint, num_bytes, checksum (the announcement's fields
but the version; stored in Redis as strings)."""
Handle = TypeVar("Handle")
Fetched = TypeVar("Fetched")


def never_stop() -> bool:
    return False


@dataclass(frozen=True)
class VersionRecord:
    """Where a receiver looks again while a trainer does not answer: the store's version record
    (a restarted trainer records its first version there, at its new endpoint)."""

    read: Callable[[], Mapping[str, str]]
    """The record as it is now, in the form an announcement is stored (`Store.version_meta`)."""
    every_s: float
    """How long a request waits unanswered before the record is read again (a heartbeat)."""


@dataclass(frozen=True)
class Staged(Generic[Handle]):
    """A version's weights copied out of the model, not yet visible to generators."""

    policy_version: int
    num_bytes: int
    handle: Handle
    """The backend's own: a shm file, a staging buffer, the model (local)."""


class WeightPublisher(ABC, Generic[Handle]):
    """The trainer's end of a transport.

    Contract: versions only move forward: `publish` refuses a version not above the last one it
    published (StaleVersionError); a published version is never changed afterwards (except
    `local`, which hands over the live model: see llamarl.weightsync.local). `stage` may be
    called again before the previous staged version is published; the superseded one is then
    `discard`ed. `close` releases every resource (files, sockets, threads) and is idempotent.
    """

    name: ClassVar[str]
    """The registry name, announced as `transport` so a receiver can refuse a mismatch."""

    def __init__(self) -> None:
        self._published = -1

    @abstractmethod
    def stage(self, model: torch.nn.Module, policy_version: int) -> Staged[Handle]:
        """Copy the weights out (call between optimizer steps; one memcpy at most)."""

    @abstractmethod
    def publish(self, staged: Staged[Handle]) -> Meta:
        """Make a staged version visible (safe off the training thread); returns the metadata
        generators need to fetch it."""

    @abstractmethod
    def discard(self, staged: Staged[Handle]) -> None:
        """Drop a staged version that a newer one superseded before it was published."""

    @abstractmethod
    def close(self) -> None:
        """Release every resource; generators can fetch nothing from it afterwards."""

    def _advance(self, policy_version: int) -> None:
        """Record a version as published; StaleVersionError unless it is above the last one."""
        if policy_version <= self._published:
            raise StaleVersionError(f"publish of version {policy_version} after version {self._published}")
        self._published = policy_version


class WeightReceiver(ABC, Generic[Fetched]):
    """A generator's end of a transport.

    Contract: `fetch` returns (policy_version, fetched): the version at least the announced one
    (a network server hands over its newest), verified per `sync.verify` before it is returned;
    any failure (timeout, dead trainer, size or checksum mismatch, a version announced over
    another transport, a malformed reply) raises SyncError and leaves the model as it was. A
    receiver that waits on a server re-reads the `record`, when given, every `record.every_s`
    while a request is unanswered, and asks the trainer it names when that is another one (a
    trainer restarted on a new endpoint) instead of waiting out the timeout.
    `swap_in` makes the model's weights the fetched ones; it raises SyncError when the
    architectures disagree, before it changes anything. The caller swaps in only versions newer
    than the one it holds, so the model's version only moves forward. `close` releases the
    receiver's resources; the model keeps the weights it was given.
    """

    name: ClassVar[str]

    @abstractmethod
    def fetch(
        self, meta: Mapping[str, str], should_stop: StopCheck = never_stop, record: VersionRecord | None = None
    ) -> tuple[int, Fetched]:
        """Pull the version `meta` (an announcement, as stored) describes; waits end early when
        `should_stop()` turns true, or move on to the trainer the version `record` names."""

    @abstractmethod
    def swap_in(self, model: torch.nn.Module, fetched: Fetched) -> None:
        """Make the model's weights the fetched ones (no copy where the backend allows)."""

    @abstractmethod
    def close(self) -> None:
        """Release sockets, groups and buffers held for the next fetch."""
