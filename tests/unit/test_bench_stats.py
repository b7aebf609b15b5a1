"""The benchmark's summaries: a run that never reaches the target counts as slower than any run
that does, and the target needs the mean of the last evaluations, not one lucky one."""

from __future__ import annotations

from llamarl.bench.async_vs_sync import clean_step_s, evaluation_slowed, time_to
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


def test_steps_an_evaluation_slowed_are_left_out_of_the_step_time() -> None:
    """A trainer's evaluation slows its step and the next; a generator's (of version 3, its
    result taken at step 5) the steps from 4 to 5 and the next, while the trainer waits."""
    walls = {1: 1.0, 2: 2.0, 3: 3.0, 4: 9.0, 5: 10.0, 6: 11.5, 7: 12.5, 8: 13.5, 9: 20.0, 10: 21.5}
    records = [{"step": step, "wall_s": wall} for step, wall in walls.items()]
    records[4] |= {"eval_step": 3, "held_out_accuracy": 0.5}  # step 5
    records[8] |= {"eval_s": 6.0, "held_out_accuracy": 0.6}  # step 9
    assert evaluation_slowed(records) == {4, 5, 6, 9, 10}
    # Past the first step: steps 2, 3, 7 and 8, one second each.
    assert clean_step_s(records, "async") == 1.0
