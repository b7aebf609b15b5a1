"""A model's weights as one flat float32 buffer: copy in, checksum, verify, bind.

The layout is the model's state_dict order with tied tensors (an embedding shared with the
output layer) taken once, so both ends of a transfer agree on it as long as they hold the same
architecture. The checksum is xxh3-128: it runs faster than memcpy (blake2b, used before, ran at
0.3 GB/s), and it can be computed piece by piece as the pieces arrive.

A generator swaps a received version in by binding: its weights become views into the received
buffer, so the swap copies nothing (and the buffer it held before can take the next version). A
generator that holds its weights in another dtype (bfloat16) or on another device copies them
in instead, cast on the way (`assign`).

A trainer of several ranks sends a version in shards (`Shard`): shard i of n is a run of whole
weight objects, cut so the shards hold about equal numbers of values; shard 0 then shard 1 ...
laid end to end are exactly the flat buffer, so every rank and every generator agrees on the
cut from the architecture and n alone.
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


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count` (a trainer rank's part of each version)."""

    index: int
    count: int


WHOLE = Shard(0, 1)


def shard_bounds(sizes: list[int], count: int) -> list[int]:
    """Object indices where each of `count` shards starts (and, last, the end): runs of whole
    objects, each ending at the first object that reaches its equal share of the values, or
    earlier when only as many objects are left as shards; none is empty. SyncError when there
    are fewer objects than shards."""
    if len(sizes) < count:
        raise SyncError(f"{len(sizes)} weight tensors cannot be cut into {count} shards")
    total = sum(sizes)
    bounds = [0]
    running = 0
    for index, size in enumerate(sizes):
        running += size
        cut = len(bounds)  # the boundary to place next
        objects_left, shards_left = len(sizes) - index - 1, count - cut
        if cut < count and objects_left >= shards_left:
            if running * count >= cut * total or objects_left == shards_left:
                bounds.append(index + 1)
    return [*bounds, len(sizes)]


def shard_objects(model: torch.nn.Module, shard: Shard = WHOLE) -> list[torch.Tensor]:
    """The weight objects of one shard, in flat order."""
    objects = weight_objects(model)
    if shard.count == 1:
        return objects
    bounds = shard_bounds([t.numel() for t in objects], shard.count)
    return objects[bounds[shard.index] : bounds[shard.index + 1]]


def num_values(model: torch.nn.Module, shard: Shard = WHOLE) -> int:
    return sum(t.numel() for t in shard_objects(model, shard))


def copy_into(model: torch.nn.Module, out: torch.Tensor, shard: Shard = WHOLE) -> None:
    """Copy the model's weights (one shard of them) into the flat float32 tensor `out` (one pass,
    no temporaries; weights of another dtype are cast to float32)."""
    offset = 0
    with torch.no_grad():
        for tensor in shard_objects(model, shard):
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


def assign(model: torch.nn.Module, pieces: list[torch.Tensor]) -> None:
    """Make the model's weights the verified float32 `pieces` (the shards of a version, in
    order; or one flat buffer). A float32 weight on the pieces' device becomes a view into them
    (copies nothing; the pieces must then stay unchanged while the model uses them); any other
    is copied in, cast to its dtype and moved to its device. SyncError, before anything
    changes, when the sizes disagree or a weight would straddle two pieces."""
    objects = weight_objects(model)
    mismatch = SyncError(
        f"received {len(pieces)} piece(s) of {sum(p.numel() for p in pieces)} values, model needs "
        f"{sum(t.numel() for t in objects)}, each weight within one piece"
    )
    places: list[tuple[torch.Tensor, int]] = []  # (piece, offset) of each object
    piece, offset = 0, 0
    for tensor in objects:
        while piece < len(pieces) and offset == pieces[piece].numel():
            piece, offset = piece + 1, 0
        if piece == len(pieces) or offset + tensor.numel() > pieces[piece].numel():
            raise mismatch
        places.append((pieces[piece], offset))
        offset += tensor.numel()
    if piece != len(pieces) - 1 or offset != pieces[-1].numel():
        raise mismatch
    with torch.no_grad():
        for tensor, (source, start) in zip(objects, places, strict=True):
            view = source[start : start + tensor.numel()].view(tensor.shape)
            if tensor.dtype == view.dtype and tensor.device == view.device:
                tensor.data = view
            else:
                tensor.data.copy_(view)


def binds(model: torch.nn.Module, device: torch.device) -> bool:
    """Whether `assign` binds the model to float32 pieces on `device` (rather than copying)."""
    return all(t.dtype == torch.float32 and t.device == device for t in weight_objects(model))
