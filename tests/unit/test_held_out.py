"""Evaluations off the trainer's critical path: which version a generator evaluates, and what
the trainer takes from the store (well-formed entries past its step; the rest refused)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict

import pytest

from llamarl.roles.held_out import EvaluationIntake, HeldOut, due_step, parse
from llamarl.store.memory import MemoryStore

GOOD = HeldOut(step=6, policy_version=6, accuracy=0.5, first_turn_accuracy=None,
               samples=[{"prompt": "1+1", "completion": "2"}], eval_s=0.3,
               worker_id="generator-0")  # fmt: skip


@pytest.mark.parametrize(
    ("version", "last_step", "due"),
    [(6, 0, 6), (7, 0, 7), (5, 0, None), (7, 6, None), (12, 6, 12), (20, 6, None)],
)
def test_a_version_is_evaluated_when_it_crosses_an_eval_every_boundary_before_the_last_step(
    version: int, last_step: int, due: int | None
) -> None:
    assert due_step(version, every_steps=1, eval_every=6, num_steps=20, last_step=last_step) == due


def test_versions_count_steps_by_sync_every_steps() -> None:
    assert due_step(3, every_steps=2, eval_every=6, num_steps=20, last_step=0) == 6
    assert due_step(2, every_steps=2, eval_every=6, num_steps=20, last_step=0) is None


@pytest.mark.parametrize(
    ("entry", "wrong"),
    [
        ("not json", "not JSON"),
        ("[1]", "not an object"),
        (json.dumps(asdict(GOOD) | {"accuracy": 1.5}), "out of range"),
        (json.dumps(asdict(GOOD) | {"step": "6"}), "step"),
        (json.dumps(asdict(GOOD) | {"accuracy": True}), "accuracy"),
        (json.dumps(asdict(GOOD) | {"samples": ["x"]}), "samples"),
        (json.dumps(asdict(GOOD) | {"first_turn_accuracy": "high"}), "first_turn_accuracy"),
    ],
)
def test_a_malformed_entry_is_refused_naming_what_is_wrong(entry: str, wrong: str) -> None:
    with pytest.raises(ValueError, match=wrong):
        parse(entry)


def test_the_trainer_takes_each_entry_once_skips_those_before_its_step_and_counts_the_rest() -> (
    None
):
    store = MemoryStore()
    refused: list[tuple[str, str]] = []
    intake = EvaluationIntake(store, lambda reason, detail: refused.append((reason, detail)),
                              after_step=6)  # fmt: skip
    store.add_evaluation(json.dumps(asdict(GOOD)))  # step 6: a resumed trainer has it already
    store.add_evaluation(json.dumps(asdict(GOOD) | {"step": 12, "accuracy": 0.75}))
    store.add_evaluation("{broken")
    taken = intake.take()
    assert [(h.step, h.accuracy) for h in taken] == [(12, 0.75)]
    assert [reason for reason, _ in refused] == ["malformed_evaluation"]
    assert intake.take() == [], "each entry once"
    store.add_evaluation(json.dumps(asdict(GOOD) | {"step": 18}))
    assert [h.step for h in intake.take()] == [18]


def test_at_the_last_step_the_trainer_waits_for_every_claimed_evaluation() -> None:
    store = MemoryStore()
    intake = EvaluationIntake(store, lambda reason, detail: None, after_step=0)
    assert store.claim_evaluation(6, "generator-0")
    late = threading.Timer(0.2, store.add_evaluation, [json.dumps(asdict(GOOD))])
    late.start()
    try:
        assert [h.step for h in intake.take(wait_s=30.0)] == [6], "waited for the claimed one"
    finally:
        late.join()
    assert store.claim_evaluation(12, "generator-1")
    started = time.monotonic()
    assert intake.take(wait_s=0.2) == [], "a claim never fulfilled is given up on"
    assert time.monotonic() - started >= 0.2
