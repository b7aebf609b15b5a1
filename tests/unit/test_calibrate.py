"""The simulator's cost lines scaled to the turns probe's real steps (`llamarl.sim.calibrate`):
the lock-step run it then predicts takes the measured phase times, splits are charged the same
scales, and a profile without the probe's phases, or with a nonsense one, is left as measured."""

from __future__ import annotations

import dataclasses

import pytest

from llamarl.sim.calibrate import SCALE_LIMITS, calibrated
from llamarl.sim.rl import simulate_async, simulate_sync
from tests.unit.test_sim import FIXED, LENGTH, costs, layout


def test_the_lock_step_run_takes_the_measured_phases_and_splits_pay_the_same_scales() -> None:
    profiled = costs(decode_s=0.01, train_s=0.5)  # lock-step: generate 0.1 s, train 0.5 s a step
    measured = dataclasses.replace(profiled, turns_phase_s={"generate": 0.3, "train": 0.4})
    scaled, scales = calibrated(measured, layout(), FIXED, steps=20)
    assert scales == {"generate": pytest.approx(3.0), "train": pytest.approx(0.8)}
    sync = simulate_sync(layout(), scaled, FIXED, steps=20)
    spent = {phase: sync.s_per_step * (1 - idle) for phase, idle in sync.idle_fraction.items()}
    assert spent["generate"] == pytest.approx(0.3) and spent["train"] == pytest.approx(0.4)
    # A split (a generator and a trainer side by side): the generator's 3x dearer decode is now
    # the slower role, where the profile's own lines had the trainer the slower one.
    before = simulate_async(layout(), profiled, FIXED, steps=40).s_per_step
    after = simulate_async(layout(), scaled, FIXED, steps=40).s_per_step
    assert before == pytest.approx(0.5, rel=0.1)
    assert after == pytest.approx(4 / 2 * LENGTH * 0.01 * 3, rel=0.1), "two batches of 0.3 s a step"


def test_without_the_probes_phases_or_with_a_nonsense_one_the_costs_stay_as_measured() -> None:
    profiled = costs(decode_s=0.01, train_s=0.5)
    same, scales = calibrated(profiled, layout(), FIXED, steps=20)
    assert same == profiled and scales == {"generate": 1.0, "train": 1.0}
    wild = dataclasses.replace(profiled, turns_phase_s={"generate": 1000.0, "train": 0.0})
    scaled, scales = calibrated(wild, layout(), FIXED, steps=20)
    assert scales == {"generate": SCALE_LIMITS[1], "train": 1.0}
    assert scaled.threads[1].decode_s == pytest.approx(0.01 * SCALE_LIMITS[1])
    assert scaled.threads[1].train_s == pytest.approx(0.5)


def test_a_scale_below_one_makes_only_the_every_core_lines_cheaper() -> None:
    """The turns probe ran on every core: a run faster than predicted there says nothing of one
    thread, whose lines stay as measured; a slower one makes every line dearer."""
    profiled = costs(decode_s=0.01, train_s=0.5)
    faster = dataclasses.replace(profiled, turns_phase_s={"generate": 0.05, "train": 0.25})
    scaled, scales = calibrated(faster, layout(), FIXED, steps=20)
    assert scales == {"generate": pytest.approx(0.5), "train": pytest.approx(0.5)}
    assert scaled.threads[2].decode_s == pytest.approx(0.005) and scaled.threads[2].train_s == pytest.approx(0.25)
    assert scaled.threads[1] == profiled.threads[1]
    slower = dataclasses.replace(profiled, turns_phase_s={"generate": 0.2, "train": 0.25})
    scaled, _ = calibrated(slower, layout(), FIXED, steps=20)
    assert scaled.threads[1].decode_s == pytest.approx(0.02) and scaled.threads[1].train_s == pytest.approx(0.5)
