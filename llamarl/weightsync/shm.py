"""Shared-memory transport for one host: the trainer writes each version to a file under
/dev/shm (temp file + rename, so a reader never sees half a file); generators read and verify."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from llamarl.errors import SyncError
from llamarl.weightsync.flat import FlatWeights, verify

KEEP_VERSIONS = 3


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

    def publish(self, weights: FlatWeights) -> str:
        target = self.path(weights.policy_version)
        temp = target.with_suffix(".tmp")
        with open(temp, "wb") as out:
            out.write(weights.buffer.numpy().tobytes())
        os.replace(temp, target)
        stale = self.path(weights.policy_version - KEEP_VERSIONS)
        stale.unlink(missing_ok=True)
        return str(target)

    def close(self) -> None:
        for path in self.directory.glob(f"{self.prefix}*"):
            path.unlink(missing_ok=True)


def fetch_shm(endpoint: str, num_bytes: int, expected_checksum: str) -> torch.Tensor:
    """Read a published version; raises SyncError when missing, short or corrupted."""
    try:
        data = Path(endpoint).read_bytes()
    except OSError as err:
        raise SyncError(f"weights at {endpoint}: {err.strerror}") from None
    if len(data) % 4:
        raise SyncError(f"weights at {endpoint}: {len(data)} bytes is not float32-aligned")
    buffer = torch.frombuffer(bytearray(data), dtype=torch.float32)
    verify(buffer, num_bytes, expected_checksum, endpoint)
    return buffer
