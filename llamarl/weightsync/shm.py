"""Shared-memory transport for one host: one file under /dev/shm per version.

Trainer: `stage` copies the weights into the pages of a file prepared beforehand (one memcpy;
first-touch page faults of a fresh file cost about ten times the copy, so the next file is
created and its pages populated by `prepare_next` on the publisher thread, off the critical
path). `publish` checksums the file and renames it into place, so a path is only ever a complete
version, and a published file is never written again; files older than KEEP_VERSIONS are
unlinked (a reader that mapped one keeps its pages until it lets go).

Generator (`ShmReceiver`): `fetch_shm` maps the file privately and populated, checks its size
and, with `sync.verify: always`, its checksum (auto and size check the size only: a published
file is complete by construction). The generator's weights are then bound to the mapped pages
(`flat.bind_flat`): no copy at all, and every generator on the host shares one copy of the pages.
`close` on the publisher unlinks every file it made.

A trainer of several ranks publishes one file per rank and version, each holding that rank's
shard (`flat.Shard`); a generator maps every shard's file and binds its weights across them
(each weight lies within one shard), still without a copy; shards in the rows layout (fsdp) are
copied together into the generator's own weights instead.
"""

from __future__ import annotations

import itertools
import mmap
import os
import socket
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from llamarl.config import ShmSync, transport_name
from llamarl.errors import ConfigError, SyncError
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
    Received,
    Shard,
    checksum,
    copy_into,
    num_values,
    verify,
    verify_size,
)
from llamarl.weightsync.messages import Announced

KEEP_VERSIONS = 3


def shm_domain(directory: str | Path) -> str:
    """Which shared memory `directory` is, as `host/boot id/filesystem device`: two processes
    see each other's files there exactly when the boot id and device agree (another machine has
    booted with another id; a container or a host of its own mounts /dev/shm afresh)."""
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return f"{socket.gethostname()}/{boot_id}/{os.stat(directory).st_dev}"


def check_same_shared_memory(announced: Announced) -> None:
    """ConfigError when a version lies in another host's shared memory: no file of it can be
    mapped here, and no retry changes that."""
    there = announced.shared_memory
    if not there:
        return
    directory = Path(announced.endpoints[0]).parent
    here = shm_domain(directory) if directory.is_dir() else f"{socket.gethostname()}/-"
    if there.split("/", 1)[1] != here.split("/", 1)[1]:
        raise ConfigError(
            f"sync.transport: shm: the trainer's versions are in the shared memory of host "
            f"{there.split('/')[0]!r} and this generator runs on {here.split('/')[0]!r}; shared "
            "memory cannot cross hosts: set sync.transport: gloo (or auto) on every role"
        )


@dataclass
class StagedFile:
    """A version copied into a temporary shm file, not yet visible to generators."""

    policy_version: int
    temp: Path
    target: Path
    buffer: torch.Tensor
    """float32 view of the file's pages."""

    @property
    def num_bytes(self) -> int:
        return self.buffer.numel() * 4


def map_file(path: Path, num_bytes: int, writable: bool) -> torch.Tensor:
    """A float32 tensor over the file's pages, populated up front: shared and writable for the
    trainer; private and read-only for a reader (a write would fault instead of changing the
    pages every generator shares; making a private mapping writable would copy every page)."""
    descriptor = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
    try:
        if writable:
            os.ftruncate(descriptor, num_bytes)
        else:
            verify_size_on_disk(descriptor, num_bytes, path)
        flags = (mmap.MAP_SHARED if writable else mmap.MAP_PRIVATE) | mmap.MAP_POPULATE
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        mapped = mmap.mmap(descriptor, num_bytes, flags=flags, prot=prot)
    finally:
        os.close(descriptor)
    with warnings.catch_warnings():  # torch warns that a read-only buffer is not writable
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(mapped, dtype=torch.float32)


def verify_size_on_disk(descriptor: int, num_bytes: int, path: Path) -> None:
    size = os.fstat(descriptor).st_size
    if size != num_bytes or num_bytes == 0:
        raise SyncError(f"weights at {path}: {size} bytes, announced {num_bytes}")


class ShmPublisher(WeightPublisher[StagedFile]):
    name = transport_name(ShmSync)

    def __init__(self, run_id: str, directory: str = "/dev/shm", shard: Shard = WHOLE) -> None:
        super().__init__()
        self.directory = Path(directory)
        self.domain = shm_domain(directory)
        self.shard = shard
        part = f"s{shard.index}-" if shard.count > 1 else ""
        self.prefix = f"llamarl-{run_id}-{os.getpid()}-{part}v"
        self._remove_orphans(f"llamarl-{run_id}-")
        # The prepared file, made on the publisher thread and taken on the trainer's.
        self._next: tuple[Path, torch.Tensor] | None = None
        self._lock = threading.Lock()
        self._names = itertools.count()

    def _remove_orphans(self, run_prefix: str) -> None:
        """Delete versions left by a trainer of this run that died without closing."""
        for path in self.directory.glob(f"{run_prefix}*"):
            pid = path.name.removeprefix(run_prefix).split("-")[0]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                path.unlink(missing_ok=True)

    def path(self, policy_version: int) -> Path:
        return self.directory / f"{self.prefix}{policy_version}.bin"

    def prepare_next(self, num_bytes: int) -> None:
        """Create the file the next version will be staged into, its pages already in memory."""
        with self._lock:
            if self._next is not None:
                return
        temp = self.directory / f"{self.prefix}next{next(self._names)}.tmp"
        temp.touch()
        prepared = (temp, map_file(temp, num_bytes, writable=True))
        with self._lock:
            taken = self._next is None
            if taken:
                self._next = prepared
        if not taken:  # the other thread was faster
            temp.unlink(missing_ok=True)

    def _take_prepared(self, num_bytes: int) -> tuple[Path, torch.Tensor]:
        while True:
            with self._lock:
                prepared, self._next = self._next, None
            if prepared is not None and prepared[1].numel() * 4 == num_bytes:
                return prepared
            if prepared is not None:  # the model changed size: that file is of no use
                prepared[0].unlink(missing_ok=True)
            self.prepare_next(num_bytes)

    def stage(self, model: torch.nn.Module, policy_version: int) -> Staged[StagedFile]:
        """Copy the weights into the prepared file (the trainer's only synchronous part)."""
        target = self.path(policy_version)
        prepared, buffer = self._take_prepared(num_values(model, self.shard) * 4)
        temp = target.with_suffix(".tmp")
        os.replace(prepared, temp)
        copy_into(model, buffer, self.shard)
        staged = StagedFile(policy_version, temp, target, buffer)
        return Staged(policy_version, staged.num_bytes, staged)

    def publish(self, staged: Staged[StagedFile]) -> Meta:
        """Checksum the staged file and make it visible, then prepare the next version's file."""
        self._advance(staged.policy_version)
        file = staged.handle
        digest = checksum(file.buffer)
        os.replace(file.temp, file.target)
        self.path(staged.policy_version - KEEP_VERSIONS).unlink(missing_ok=True)
        self.prepare_next(file.num_bytes)
        return {
            "transport": self.name,
            "endpoint": str(file.target),
            "num_bytes": file.num_bytes,
            "checksum": digest,
            "layout": self.shard.layout,
            "shared_memory": self.domain,
        }

    def discard(self, staged: Staged[StagedFile]) -> None:
        staged.handle.temp.unlink(missing_ok=True)

    def close(self) -> None:
        self._next = None
        for path in self.directory.glob(f"{self.prefix}*"):
            path.unlink(missing_ok=True)


def fetch_shm(endpoint: str, num_bytes: int, expected_checksum: str | None) -> torch.Tensor:
    """Map a published version (or shard); SyncError when it is missing, of the wrong size or
    (when a checksum is given) corrupted. The tensor reads the shared pages until it is
    dropped."""
    try:
        buffer = map_file(Path(endpoint), num_bytes, writable=False)
    except OSError as err:
        raise SyncError(f"weights at {endpoint}: {err.strerror}") from None
    if expected_checksum is None:
        verify_size(buffer, num_bytes, endpoint)
    else:
        verify(buffer, num_bytes, expected_checksum, endpoint)
    return buffer


def _file_size(endpoint: str) -> int:
    try:
        return os.stat(endpoint).st_size
    except OSError as err:
        raise SyncError(f"weights at {endpoint}: {err.strerror}") from None


class ShmReceiver(WeightReceiver[Received]):
    """A generator's end: map the announced file (a file per shard) and bind the model to its
    pages. A mapped buffer is never reused for a later version (its pages are the trainer's)."""

    name = transport_name(ShmSync)

    def __init__(self, config: ShmSync) -> None:
        self.always_checksum = config.verify == "always"

    def fetch(
        self, meta: Mapping[str, str], should_stop: StopCheck = never_stop, record: VersionRecord | None = None
    ) -> tuple[int, Received]:
        announced = Announced.parse(meta, self.name)
        check_same_shared_memory(announced)
        endpoints = announced.endpoints
        if len(endpoints) == 1:
            sizes = [announced.num_bytes]
        else:
            sizes = [_file_size(e) for e in endpoints]
            if sum(sizes) != announced.num_bytes:
                raise SyncError(
                    f"version {announced.policy_version}: shard files of "
                    f"{sum(sizes)} bytes, announced {announced.num_bytes}"
                )
        checksums = announced.checksums if self.always_checksum else [None] * len(endpoints)
        pieces = [
            fetch_shm(endpoint, size, expected)
            for endpoint, size, expected in zip(endpoints, sizes, checksums, strict=True)
        ]
        return announced.policy_version, Received(pieces, announced.rows)

    def swap_in(self, model: torch.nn.Module, fetched: Received) -> None:
        fetched.put_in(model)

    def close(self) -> None:
        """Nothing held: the model's weights keep their mapping alive until they are replaced."""
