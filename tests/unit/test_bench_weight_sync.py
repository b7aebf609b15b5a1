"""The weight-sync benchmark's bookkeeping: what a generator's weights are checked against, and the
figures and ratios reported per arm, trainer rank count and generator count."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from llamarl.bench.weight_sync import Rounds, add_ratios, bench, summary
from llamarl.bench.weight_sync_ranks import FlatModel, Published, model_checksum, shards
from llamarl.errors import ConfigError
from llamarl.weightsync.flat import checksum, copy_into, flatten, num_values

NUM_BYTES = 32 * 4 * 10


def test_the_checksum_a_generator_reports_is_that_of_the_trainers_shards_end_to_end() -> None:
    model = FlatModel(NUM_BYTES, seed=0)
    pieces = []
    for shard in shards(2):
        piece = torch.empty(num_values(model, shard))
        copy_into(model, piece, shard)
        pieces.append(piece)
    assert [p.numel() for p in pieces] == [160, 160]
    assert model_checksum(model) == checksum(torch.cat(pieces)) == flatten(model, 0).checksum
    assert model_checksum(FlatModel(NUM_BYTES, seed=1)) != model_checksum(model)


def _rounds(num_ranks: int, stage_s: float, pull_s: float) -> Rounds:
    rounds = Rounds()
    for extra in (0.0, 0.5, 1.0):  # per-round noise; the slowest rank's stage counts
        per_rank = [stage_s * (1 + extra)] + [stage_s] * (num_ranks - 1)
        rounds.add(Published({}, per_rank, [0.01] * num_ranks), pull_s * (1 + extra))
    return rounds


def test_ratios_compare_two_ranks_with_one_and_g_generators_with_one() -> None:
    num_bytes = 10**9
    entry: dict[str, Any] = {"memcpy_GBps": {"median": 10.0}, "raw_gloo_GBps": {"median": 2.0}}
    cases = {(1, 1): (0.2, 1.0), (1, 4): (0.2, 4.0), (2, 1): (0.1, 0.8), (2, 4): (0.1, 2.0)}
    entry["gloo"] = {f"ranks_{r}": {} for r in (1, 2)}
    for (ranks, count), (stage_s, pull_s) in cases.items():
        figures = summary(num_bytes, _rounds(ranks, stage_s, pull_s))
        entry["gloo"][f"ranks_{ranks}"][f"generators_{count}"] = figures
    two = entry["gloo"]["ranks_2"]["generators_1"]
    assert two["stage_s"]["median"] == 0.15 and len(two["stage_s_per_rank"]) == 2
    assert two["stage_s_per_rank"][1]["median"] == 0.1 and two["pull_GBps"]["median"] == 0.833
    add_ratios(entry, "gloo", [1, 4], [1, 2])
    # from the medians as reported (GB/s to 3 digits: 0.667 and 0.833)
    assert entry["gloo_vs_raw_gloo"] == {"ranks_1": 0.334, "ranks_2": 0.416}
    assert entry["gloo_time_4_vs_1"] == {"ranks_1": 4.0, "ranks_2": 2.5}
    assert entry["gloo_pull_time_ranks_2_vs_1"] == {"generators_1": 0.8, "generators_4": 0.5}
    assert entry["gloo_stage_time_ranks_2_vs_1"] == {"generators_1": 0.5, "generators_4": 0.5}


def test_generators_on_the_gpu_compare_shared_memory_with_a_host_to_gpu_copy() -> None:
    entry: dict[str, Any] = {"memcpy_GBps": {"median": 10.0}, "h2d_GBps": {"median": 5.0}}
    entry["shm"] = {"ranks_1": {"generators_1": summary(10**9, _rounds(1, 0.1, 0.4))}}
    add_ratios(entry, "shm", [1], [1])
    # pull medians 0.6 s (noise 0, 0.5, 1): 1.667 GB/s against 5
    assert entry["shm_vs_h2d"] == {"ranks_1": 0.333} and "shm_vs_memcpy" not in entry


def test_generators_on_a_gpu_this_machine_lacks_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="--generator-device: cuda, but this machine has no"):
        bench([4], [1], 1, 16.0, [1], generator_device="cuda")
