"""What layout auto starts from the predictions (`llamarl.launch.layout.choose`): taking turns in
one process unless a split is predicted faster by more than the margin, which is the profile's
own spread and at least SPLIT_FLOOR, since taking turns cannot lose to sync and a split can."""

from __future__ import annotations

import dataclasses

import pytest

from llamarl.launch.layout import SPLIT_FLOOR, choose, margin
from tests.unit.test_sim import costs


def _rows(split_s: float) -> list[dict]:
    turns = {"one_process": True, "colocated": False, "s_per_step": 1.0}
    split = {
        "num_generators": 1,
        "generator_threads": 1,
        "trainer_threads": 1,
        "max_staleness": 1,
        "colocated": False,
        "s_per_step": split_s,
    }
    return [turns, split]


@pytest.mark.parametrize(
    ("jitter", "split_s", "starts"),
    [
        (0.04, 0.93, "one_process"),  # 7% faster, spread 4%: under the floor
        (0.04, 0.85, "split"),  # 15% faster: past the floor and the spread
        (0.20, 0.85, "one_process"),  # 15% faster, but the profile's own spread is 20%
    ],
)
def test_a_split_starts_only_when_predicted_faster_than_the_floor_and_the_spread(
    jitter: float, split_s: float, starts: str
) -> None:
    profile = dataclasses.replace(costs(decode_s=0.01, train_s=0.5), jitter_cv={"generate": jitter, "train": 0.01})
    needed = margin(profile, SPLIT_FLOOR)
    assert needed == max(SPLIT_FLOOR, jitter)
    chosen = choose(_rows(split_s), needed)
    assert ("one_process" if chosen.get("one_process") else "split") == starts
