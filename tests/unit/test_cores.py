"""The core split: proportional to the measured work, at least one thread per process."""

from __future__ import annotations

import pytest

from llamarl.config import parse_config
from llamarl.launch.cores import plan_threads
from llamarl.sim.predict import split_cores


@pytest.mark.parametrize(
    ("cores", "generators", "share", "expected"),
    [
        (16, 1, 0.25, (4, 12)),
        (16, 3, 0.5, (8, 2)),
        (8, 2, 0.9, (6, 1)),  # generators keep a thread each
        (8, 1, 0.01, (1, 7)),  # and so does the trainer
        (2, 1, 0.7, (1, 1)),
    ],
)
def test_split_follows_the_measured_share(cores: int, generators: int, share: float, expected: tuple[int, int]) -> None:
    trainer, generator = split_cores(cores, generators, share)
    assert (trainer, generator) == expected
    assert trainer + generators * generator <= cores


def test_no_measurement_when_there_is_no_choice_and_explicit_threads_win() -> None:
    tight = parse_config({"workers": {"num_cores": 2, "num_generators": 1}})
    split = plan_threads(tight)
    assert (split.trainer_threads, split.generator_threads, split.trainer_share) == (1, 1, None)
    fixed = parse_config({"workers": {"num_cores": 32, "trainer_threads": 3, "generator_threads": 5}})
    split = plan_threads(fixed)
    assert (split.trainer_threads, split.generator_threads, split.trainer_share) == (3, 5, None)


def test_the_measured_share_splits_a_larger_machine() -> None:
    config = parse_config(
        {
            "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
            "generation": {"num_samples": 2, "max_new_tokens": 8, "prompts_per_batch": 2},
            "trainer": {"prompts_per_step": 2},
            "workers": {"num_cores": 8, "num_generators": 1},
        }
    )
    split = plan_threads(config)
    assert split.trainer_share is not None and 0 < split.trainer_share < 1
    assert split.trainer_threads + split.generator_threads <= 8
    assert (split.trainer_threads, split.generator_threads) == split_cores(8, 1, split.trainer_share)
