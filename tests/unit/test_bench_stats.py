"""The benchmark's summaries: a run that never reaches the target counts as slower than any run
that does, and the target needs the mean of the last evaluations, not one lucky one."""

from __future__ import annotations

from llamarl.bench.async_vs_sync import time_to
from llamarl.bench.stats import median_time


def test_a_run_that_never_reached_the_target_is_the_slowest() -> None:
    assert median_time([30.0, None, 10.0]) == 30.0
    assert median_time([None, None, 10.0]) is None
    assert median_time([40.0, 10.0, None, 20.0]) == 30.0
    assert median_time([10.0, None]) is None


def test_time_to_target_needs_the_mean_of_the_last_evaluations() -> None:
    records = [
        {"rl_s": 10.0, "held_out_accuracy": 0.5, "eval_s": 1.0},
        {"rl_s": 20.0, "held_out_accuracy": 0.9, "eval_s": 1.0},  # one lucky evaluation
        {"rl_s": 25.0},
        {"rl_s": 30.0, "held_out_accuracy": 0.8, "eval_s": 1.0},
        {"rl_s": 40.0, "held_out_accuracy": 0.8, "eval_s": 1.0},
    ]
    # Means of the last three: 0.5, 0.7, 0.733, 0.833 -> reached at rl_s 40, less 4 s of evaluation.
    assert time_to(records, 0.8) == 36.0
    assert time_to(records, 0.9) is None
