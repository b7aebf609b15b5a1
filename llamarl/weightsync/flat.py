"""Flattening a model's parameters into one float32 buffer, its checksum, and loading it back."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from llamarl.errors import SyncError


@dataclass(frozen=True)
class FlatWeights:
    """All parameters (in state_dict order) as one contiguous float32 tensor."""

    policy_version: int
    buffer: torch.Tensor
    checksum: str

    @property
    def num_bytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


def checksum(buffer: torch.Tensor) -> str:
    return hashlib.blake2b(buffer.numpy().tobytes(), digest_size=16).hexdigest()


def flatten(model: torch.nn.Module, policy_version: int) -> FlatWeights:
    with torch.no_grad():
        parts = [p.detach().reshape(-1).float() for p in model.state_dict().values()]
        buffer = torch.cat(parts).contiguous()
    return FlatWeights(policy_version, buffer, checksum(buffer))


def verify(buffer: torch.Tensor, num_bytes: int, expected: str, peer: str) -> None:
    got_bytes = buffer.numel() * buffer.element_size()
    if got_bytes != num_bytes:
        raise SyncError(f"weights from {peer}: {got_bytes} bytes, announced {num_bytes}")
    if checksum(buffer) != expected:
        raise SyncError(f"weights from {peer}: checksum mismatch")


def load_flat(model: torch.nn.Module, buffer: torch.Tensor) -> None:
    """Copy a verified flat buffer into the model's parameters (the swap)."""
    state = model.state_dict()
    total = sum(t.numel() for t in state.values())
    if total != buffer.numel():
        raise SyncError(f"flat buffer has {buffer.numel()} values, model needs {total}")
    offset = 0
    with torch.no_grad():
        for tensor in state.values():
            count = tensor.numel()
            tensor.copy_(buffer[offset : offset + count].view_as(tensor))
            offset += count
