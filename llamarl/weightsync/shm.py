"""Shared-memory transport for one host: one file under /dev/shm per version.

The trainer copies its weights straight into a new file's memory map (one copy, the snapshot
that training may not overwrite), then, off its critical path, checksums it and renames it into
place, so a reader never sees half a file. A generator maps the file, verifies size and checksum
on the mapped pages and copies them into its model: one copy on each side, no read() buffers.
The newest KEEP_VERSIONS files stay; a removed file stays readable for a reader that mapped it.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from llamarl.errors import SyncError
from llamarl.weightsync.flat import checksum, copy_into, num_values, verify

KEEP_VERSIONS = 3


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
    """A float32 tensor over the file's pages (private copy-on-write when not `writable`)."""
    flags = os.O_RDWR if writable else os.O_RDONLY
    descriptor = os.open(path, flags)
    try:
        if writable:
            os.ftruncate(descriptor, num_bytes)
        elif os.fstat(descriptor).st_size != num_bytes:
            size = os.fstat(descriptor).st_size
            raise SyncError(f"weights at {path}: {size} bytes, announced {num_bytes}")
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_COPY
        mapped = mmap.mmap(descriptor, num_bytes, access=access)
    finally:
        os.close(descriptor)
    return torch.frombuffer(mapped, dtype=torch.float32)


class ShmPublisher:
    def __init__(self, run_id: str, directory: str = "/dev/shm") -> None:
        self.directory = Path(directory)
        self.prefix = f"llamarl-{run_id}-{os.getpid()}-v"
        self._remove_orphans(f"llamarl-{run_id}-")

    def _remove_orphans(self, run_prefix: str) -> None:
        """Delete versions left by a trainer of this run that died without closing."""
        for path in self.directory.glob(f"{run_prefix}*"):
            pid = path.name.removeprefix(run_prefix).split("-")[0]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                path.unlink(missing_ok=True)

    def path(self, policy_version: int) -> Path:
        return self.directory / f"{self.prefix}{policy_version}.bin"

    def stage(self, model: torch.nn.Module, policy_version: int) -> StagedFile:
        """Copy the weights into a new temporary file (the trainer's only synchronous part)."""
        target = self.path(policy_version)
        temp = target.with_suffix(".tmp")
        temp.touch()
        buffer = map_file(temp, num_values(model) * 4, writable=True)
        copy_into(model, buffer)
        return StagedFile(policy_version, temp, target, buffer)

    def publish(self, staged: StagedFile) -> tuple[str, str]:
        """Checksum the staged file and make it visible; returns (endpoint, checksum)."""
        digest = checksum(staged.buffer)
        os.replace(staged.temp, staged.target)
        self.path(staged.policy_version - KEEP_VERSIONS).unlink(missing_ok=True)
        return str(staged.target), digest

    def close(self) -> None:
        for path in self.directory.glob(f"{self.prefix}*"):
            path.unlink(missing_ok=True)


def fetch_shm(endpoint: str, num_bytes: int, expected_checksum: str) -> torch.Tensor:
    """Map a published version and verify it; raises SyncError when missing, short or
    corrupted. The tensor reads the shared pages until it is dropped."""
    try:
        buffer = map_file(Path(endpoint), num_bytes, writable=False)
    except OSError as err:
        raise SyncError(f"weights at {endpoint}: {err.strerror}") from None
    verify(buffer, num_bytes, expected_checksum, endpoint)
    return buffer
