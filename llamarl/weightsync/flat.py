"""A model's weights as one flat float32 buffer: copy in, checksum, verify, bind.

The layout is the model's state_dict order with tied tensors (an embedding shared with the
output layer) taken once, so both ends of a transfer agree on it as long as they hold the same
architecture. The checksum is xxh3-128: it runs faster than memcpy (blake2b, used before, ran at
0.3 GB/s), and it can be computed piece by piece as the pieces arrive.

A generator swaps a received version in by binding: its weights become views into the received
buffer, so the swap copies nothing (and the buffer it held before can take the next version). A
generator that holds its weights in another dtype (bfloat16) or on another device copies them
in instead, cast on the way (`assign`).

A trainer of several ranks sends a version in shards (`Shard`), in one of two layouts, both
agreed from the architecture and n alone. `runs` (data-parallel replicas): shard i of n is a run
of whole weight objects, cut so the shards hold about equal numbers of values; shard 0 then
shard 1 ... laid end to end are exactly the flat buffer. `rows` (FSDP2): every rank holds rows
of every parameter, the dim-0 chunk `torch.chunk` gives it (what `fully_shard` keeps), and sends
those as they are, never a gathered whole tensor; shard i is rank i's chunks in flat order (a
buffer, which FSDP leaves whole, is in shard 0). A generator then copies each weight together
from the chunks of every shard (`assign_rows`).

With LoRA adapters on the model (peft's `lora_` parameters) a version is the adapters only: the
base stays frozen and the same on both ends, so only they are weight objects here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import xxhash
from torch.distributed.tensor import DTensor

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


ADAPTER_MARK = "lora_"
"""In the names of peft's LoRA parameters."""


def weight_objects(model: torch.nn.Module) -> list[torch.Tensor]:
    """The model's parameters and persistent buffers in state_dict order, each object once; only
    the LoRA adapters when the model has them."""
    seen: set[int] = set()
    found = []
    named = model.state_dict(keep_vars=True)
    if any(ADAPTER_MARK in name for name in named):
        named = {k: v for k, v in named.items() if ADAPTER_MARK in k}
    for tensor in named.values():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            found.append(tensor)
    return found


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count` (a trainer rank's part of each version)."""

    index: int
    count: int
    rows: bool = False
    """The `rows` layout (every rank's dim-0 chunk of every parameter: fsdp), else `runs`."""

    @property
    def layout(self) -> str:
        return "rows" if self.rows else "runs"


WHOLE = Shard(0, 1)
LAYOUTS = ("runs", "rows")


def chunk_rows(num_rows: int, index: int, count: int) -> tuple[int, int]:
    """The rows [start, end) of chunk `index` of `count`, as `torch.chunk` (and so FSDP2) cuts
    dim 0: chunks of ceil(num_rows / count) rows, the last ones shorter or empty."""
    size = -(-num_rows // count)
    start = min(index * size, num_rows)
    return start, min(start + size, num_rows)


def _rows_values(tensor: torch.Tensor, index: int, count: int, parameter: bool) -> int:
    """Values of `tensor` in shard `index` of `count` in the rows layout."""
    if not parameter or tensor.dim() == 0:  # left whole by FSDP: sent by shard 0
        return tensor.numel() if index == 0 else 0
    start, end = chunk_rows(tensor.shape[0], index, count)
    return (end - start) * (tensor.numel() // max(tensor.shape[0], 1))


def _local(tensor: torch.Tensor, index: int) -> torch.Tensor:
    """This rank's part of a weight object in the rows layout: a DTensor's local chunk; a
    plain tensor whole on rank 0, nothing elsewhere."""
    if isinstance(tensor, DTensor):
        return tensor.to_local()
    return tensor if index == 0 else tensor.detach().reshape(-1)[:0]


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
    if shard.rows:
        return [_local(t, shard.index) for t in objects]
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


def assign_rows(model: torch.nn.Module, pieces: list[torch.Tensor]) -> None:
    """Make the model's weights the ones whose rows layout shards are `pieces` (in shard
    order): each weight is copied together from its chunk in every piece, cast to its dtype and
    moved to its device. SyncError, before anything changes, when the sizes disagree."""
    objects = weight_objects(model)
    parameters = {id(p) for p in model.parameters()}
    counts = [[_rows_values(t, i, len(pieces), id(t) in parameters) for t in objects] for i in range(len(pieces))]
    if [sum(c) for c in counts] != [p.numel() for p in pieces]:
        raise SyncError(
            f"received shards of {[p.numel() for p in pieces]} values, the model's rows layout "
            f"over {len(pieces)} ranks needs {[sum(c) for c in counts]}"
        )
    offsets = [0] * len(pieces)
    with torch.no_grad():
        for number, tensor in enumerate(objects):
            parts = []
            for index, piece in enumerate(pieces):
                count = counts[index][number]
                parts.append(piece[offsets[index] : offsets[index] + count])
                offsets[index] += count
            tensor.data.copy_(torch.cat(parts).view(tensor.shape))


@dataclass(frozen=True)
class Received:
    """A version's shards as a generator received them, in shard order, with their layout."""

    pieces: list[torch.Tensor]
    rows: bool

    def put_in(self, model: torch.nn.Module) -> None:
        """Make the model's weights these: bound or copied (runs), copied together (rows)."""
        if self.rows:
            assign_rows(model, self.pieces)
        else:
            assign(model, self.pieces)


def binds(model: torch.nn.Module, device: torch.device) -> bool:
    """Whether `assign` binds the model to float32 pieces on `device` (rather than copying)."""
    return all(t.dtype == torch.float32 and t.device == device for t in weight_objects(model))
