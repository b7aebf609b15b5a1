"""A model's weights as one flat float32 buffer: copy in, checksum, verify, bind.

The layout is the model's state_dict order with tied tensors (an embedding shared with the
output layer) taken once, so both ends of a transfer agree on it as long as they hold the same
architecture. The checksum is xxh3-128: it runs faster than memcpy (blake2b, used before, ran at
0.3 GB/s), and it can be computed piece by piece as the pieces arrive.

A generator swaps a received version in by binding: its weights become views into the received
buffer, so the swap copies nothing (and the buffer it held before can take the next version).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import xxhash

from llamarl.errors import SyncError


@dataclass(frozen=True)
class FlatWeights:
    """All weights (see `weight_objects`) as one contiguous float32 tensor."""

    policy_version: int
    buffer: torch.Tensor
    checksum: str

    @property
    def num_bytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


def weight_objects(model: torch.nn.Module) -> list[torch.Tensor]:
    """The model's parameters and persistent buffers in state_dict order, each object once."""
    seen: set[int] = set()
    found = []
    for tensor in model.state_dict(keep_vars=True).values():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            found.append(tensor)
    return found


def num_values(model: torch.nn.Module) -> int:
    return sum(t.numel() for t in weight_objects(model))


def copy_into(model: torch.nn.Module, out: torch.Tensor) -> None:
    """Copy the model's weights into the flat float32 tensor `out` (one pass, no temporaries)."""
    offset = 0
    with torch.no_grad():
        for tensor in weight_objects(model):
            count = tensor.numel()
            out[offset : offset + count].copy_(tensor.detach().reshape(-1))
            offset += count
    if offset != out.numel():
        raise SyncError(f"flat buffer has {out.numel()} values, model has {offset}")


def _bytes(buffer: torch.Tensor) -> memoryview:
    data: Any = buffer.detach().contiguous().numpy()
    return memoryview(data).cast("B")


def checksum(buffer: torch.Tensor) -> str:
    return xxhash.xxh3_128_hexdigest(_bytes(buffer))


class Checksum:
    """The checksum of a buffer computed piece by piece (equal to `checksum` of the whole)."""

    def __init__(self) -> None:
        self._state = xxhash.xxh3_128()

    def update(self, piece: torch.Tensor) -> None:
        self._state.update(_bytes(piece))

    def hexdigest(self) -> str:
        return str(self._state.hexdigest())


def flatten(model: torch.nn.Module, policy_version: int) -> FlatWeights:
    buffer = torch.empty(num_values(model), dtype=torch.float32)
    copy_into(model, buffer)
    return FlatWeights(policy_version, buffer, checksum(buffer))


def verify_size(buffer: torch.Tensor, num_bytes: int, peer: str) -> None:
    got_bytes = buffer.numel() * buffer.element_size()
    if got_bytes != num_bytes:
        raise SyncError(f"weights from {peer}: {got_bytes} bytes, announced {num_bytes}")


def verify(buffer: torch.Tensor, num_bytes: int, expected: str, peer: str) -> None:
    verify_size(buffer, num_bytes, peer)
    if checksum(buffer) != expected:
        raise SyncError(f"weights from {peer}: checksum mismatch")


def bind_flat(model: torch.nn.Module, buffer: torch.Tensor) -> None:
    """Make the model's weights views into a verified flat buffer (the swap; copies nothing).
    The buffer must stay unchanged while the model uses it."""
    objects = weight_objects(model)
    total = sum(t.numel() for t in objects)
    if total != buffer.numel():
        raise SyncError(f"flat buffer has {buffer.numel()} values, model needs {total}")
    offset = 0
    with torch.no_grad():
        for tensor in objects:
            count = tensor.numel()
            tensor.data = buffer[offset : offset + count].view(tensor.shape)
            offset += count
