"""How a version is cut into shards, one per trainer rank: runs of whole weight tensors, none
empty, covering every tensor once in order, each about its equal share of the values; and
`assign` puts shards (or one flat buffer) back into a model, binding or casting."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from llamarl.config import ModelConfig
from llamarl.engine.model import build_policy, place
from llamarl.errors import SyncError
from llamarl.weightsync.flat import (
    Shard,
    assign,
    copy_into,
    flatten,
    num_values,
    shard_bounds,
    shard_objects,
)

MODEL = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


@given(st.lists(st.integers(1, 1000), min_size=1, max_size=40), st.integers(1, 8))
def test_shards_are_runs_of_whole_tensors_each_near_its_share(sizes: list[int], count: int) -> None:
    if len(sizes) < count:
        with pytest.raises(SyncError, match="cannot be cut"):
            shard_bounds(sizes, count)
        return
    bounds = shard_bounds(sizes, count)
    assert bounds[0] == 0 and bounds[-1] == len(sizes) and len(bounds) == count + 1
    assert all(a < b for a, b in zip(bounds, bounds[1:], strict=False)), "a shard is empty"
    share, largest = sum(sizes) / count, max(sizes)
    for start, end in zip(bounds, bounds[1:], strict=False):
        # a shard runs past its share by less than one tensor, unless it holds a single one
        assert end - start == 1 or sum(sizes[start:end]) < share + largest


def test_a_models_shards_laid_end_to_end_are_its_flat_weights() -> None:
    model = build_policy(MODEL, seed=1).model
    whole = flatten(model, 0).buffer
    pieces = []
    for index in range(3):
        shard = Shard(index, 3)
        piece = torch.empty(num_values(model, shard))
        copy_into(model, piece, shard)
        pieces.append(piece)
        assert shard_objects(model, shard)
    assert torch.equal(torch.cat(pieces), whole)

    generator = build_policy(MODEL, seed=2).model
    assign(generator, pieces)  # bound across the three pieces, no copy
    assert torch.equal(flatten(generator, 0).buffer, whole)
    first = next(iter(generator.state_dict(keep_vars=True).values()))
    assert first.data_ptr() == pieces[0].data_ptr()

    cast = place(build_policy(MODEL, seed=2), "cpu", "bfloat16").model
    assign(cast, pieces)  # copied in, cast
    assert torch.equal(flatten(cast, 0).buffer, whole.to(torch.bfloat16).float())


def test_pieces_that_split_a_tensor_or_miss_values_are_refused_untouched() -> None:
    model = build_policy(MODEL, seed=1).model
    whole = flatten(model, 0).buffer
    generator = build_policy(MODEL, seed=2).model
    before = flatten(generator, 0).buffer.clone()
    for pieces in ([whole[:5], whole[5:]], [whole[:-1]], [whole, whole[:1]]):
        with pytest.raises(SyncError, match="model needs"):
            assign(generator, pieces)
        assert torch.equal(flatten(generator, 0).buffer, before)
