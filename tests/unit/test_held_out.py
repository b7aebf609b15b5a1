"""Evaluations shared in chunks: each chunk is evaluated once, by whoever claims it, only for a
version the trainer opened; the trainer records an evaluation once every chunk is in, its
accuracy the whole set's, and refuses malformed entries; at the last step it waits for every
claimed chunk. Real roles' runtimes on the in-process store and bus."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from llamarl.bus import MemoryHub
from llamarl.config import parse_config
from llamarl.observe.progress import Listener
from llamarl.roles import build
from llamarl.roles.held_out import (
    CHUNK,
    EvaluatedChunk,
    GeneratorEvaluations,
    HeldOutSet,
    TrainerEvaluations,
    parse,
)
from llamarl.roles.runtime import RoleRuntime
from llamarl.roles.trainer_evaluations import EvaluationLog
from llamarl.store.memory import MemoryStore
from llamarl.tasks import Example
from llamarl.training.eval_sets import EvalSet, SetSums, set_metrics
from llamarl.training.evaluate import Evaluation

GOOD = EvaluatedChunk(
    policy_version=6,
    chunk=0,
    num_chunks=2,
    num_prompts=100,
    accuracy=0.5,
    first_turn_accuracy=None,
    samples=[{"prompt": "1+1", "completion": "2"}],
    started=10.0,
    ended=10.5,
    worker_id="generator-0",
)


def runtime(tmp_path: Path, store: MemoryStore, worker_id: str) -> RoleRuntime:
    config = parse_config({"run_id": "held", "run_dir": str(tmp_path), "trainer": {"eval_every": 6, "num_steps": 20}})
    hub = MemoryHub("held")
    role = worker_id.split("-")[0]
    rejections = build.rejections_of(role, config, store)
    return RoleRuntime(
        role,
        config,
        worker_id,
        store,
        hub.client(worker_id),
        rejections,
        lambda: hub.client(worker_id),
    )


def held_out_set(num_prompts: int, seen: list[tuple[str, ...]]) -> HeldOutSet:
    """A set whose prompt i is right when i is even; each evaluated batch noted in `seen`."""
    examples = [Example(i, f"p{i}", str(i)) for i in range(num_prompts)]

    def evaluate(batch: Sequence[Example], listener: Listener | None) -> Evaluation:
        seen.append(tuple(e.prompt for e in batch))
        right = sum(1 for e in batch if e.index % 2 == 0)
        return Evaluation(right / len(batch), [{"prompt": batch[0].prompt}], None, len(batch))

    return HeldOutSet(examples, evaluate)


def test_chunks_are_shared_once_each_and_combine_into_the_whole_sets_accuracy(
    tmp_path: Path,
) -> None:
    store, seen = MemoryStore(), []
    held_out = held_out_set(2 * CHUNK + 50, seen)
    trainer = TrainerEvaluations(runtime(tmp_path, store, "trainer"), held_out)
    generator = GeneratorEvaluations(runtime(tmp_path, store, "generator-0"), held_out)
    generator.after_version(3)  # no evaluation open for version 3: nothing to do
    assert seen == []
    trainer.open_if_due(step=5, version=5)
    trainer.open_if_due(step=20, version=20)  # the last step's is the trainer's own, whole
    generator.after_version(5)
    assert seen == []
    trainer.open_if_due(step=6, version=7)  # a resumed trainer: versions ahead of steps
    assert store.claim_evaluation_chunk(7, held_out.num_chunks) == 0  # someone took chunk 0
    assert trainer.take_part(7) == 2
    generator.after_version(7)  # every chunk is claimed already
    assert [(batch[0], len(batch)) for batch in seen] == [("p100", CHUNK), ("p200", 50)]
    assert trainer.take() == [], "chunk 0 is not in yet"
    store.add_evaluation(json.dumps(asdict(GOOD) | {"policy_version": 7, "num_chunks": 3, "accuracy": 1.0}))
    (whole,) = trainer.take()
    assert (whole.step, whole.policy_version) == (6, 7)
    # all of the first 100, 50 of the next 100, 25 of the last 50: the whole set's share
    assert whole.accuracy == pytest.approx(175 / 250)
    assert trainer.take() == [], "each evaluation once"


def test_a_generator_takes_chunks_of_an_open_evaluation_beside_the_trainer(
    tmp_path: Path,
) -> None:
    store, seen = MemoryStore(), []
    held_out = held_out_set(4 * CHUNK, seen)
    trainer = TrainerEvaluations(runtime(tmp_path, store, "trainer"), held_out)
    generator = GeneratorEvaluations(runtime(tmp_path, store, "generator-0"), held_out)
    trainer.open_if_due(step=12, version=12)
    assert store.claim_evaluation_chunk(12, 4) == 0
    generator.after_version(12)  # takes the three left
    assert trainer.take_part(12) == 0
    batches = [batch[0] for batch in seen]
    assert batches == ["p100", "p200", "p300"], "each chunk is one evaluation batch"
    assert trainer.take() == [], "chunk 0 is not in yet"


@pytest.mark.parametrize(
    ("entry", "wrong"),
    [
        ("not json", "not JSON"),
        ("[1]", "not an object"),
        (json.dumps(asdict(GOOD) | {"accuracy": 1.5}), "out of range"),
        (json.dumps(asdict(GOOD) | {"chunk": 2}), "out of range"),
        (json.dumps(asdict(GOOD) | {"policy_version": "6"}), "policy_version"),
        (json.dumps(asdict(GOOD) | {"accuracy": True}), "accuracy"),
        (json.dumps(asdict(GOOD) | {"samples": ["x"]}), "samples"),
        (json.dumps(asdict(GOOD) | {"first_turn_accuracy": "high"}), "first_turn_accuracy"),
    ],
)
def test_a_malformed_entry_is_refused_naming_what_is_wrong(entry: str, wrong: str) -> None:
    with pytest.raises(ValueError, match=wrong):
        parse(entry)


def test_the_trainer_counts_malformed_entries_and_skips_versions_it_did_not_open(
    tmp_path: Path,
) -> None:
    store = MemoryStore()
    role = runtime(tmp_path, store, "trainer")
    trainer = TrainerEvaluations(role, held_out_set(1, []))
    trainer.open_if_due(step=12, version=12)
    store.add_evaluation(json.dumps(asdict(GOOD)))  # version 6: before this process resumed
    store.add_evaluation("{broken")
    store.add_evaluation(json.dumps(asdict(GOOD) | {"policy_version": 12, "num_chunks": 1}))
    assert [(h.step, h.accuracy, h.workers) for h in trainer.take()] == [(12, 0.5, ["generator-0"])]
    role.rejections.flush(force=True)
    assert store.rejected() == {"trainer.malformed_evaluation": 1}


def test_at_the_last_step_the_trainer_waits_for_every_claimed_chunk(tmp_path: Path) -> None:
    store = MemoryStore()
    trainer = TrainerEvaluations(runtime(tmp_path, store, "trainer"), held_out_set(1, []))
    trainer.open_if_due(step=6, version=6)
    assert store.claim_evaluation_chunk(6, 1) == 0
    entry = json.dumps(asdict(GOOD) | {"num_chunks": 1})
    late = threading.Timer(0.2, store.add_evaluation, [entry])
    late.start()
    try:
        assert [h.step for h in trainer.take(wait_s=30.0)] == [6], "waited for the claimed one"
    finally:
        late.join()
    trainer.open_if_due(step=12, version=12)
    assert store.claim_evaluation_chunk(12, 1) == 0
    started = time.monotonic()
    assert trainer.take(wait_s=0.2) == [], "a claim never fulfilled is given up on"
    assert time.monotonic() - started >= 0.2


def test_named_sets_ride_in_the_chunks_after_the_held_out_prompts(tmp_path: Path) -> None:
    """Chunks run across the held-out prompts into a named set's; each part is evaluated its
    own way, the held-out accuracy stays over held-out prompts only, and the set's sums add up
    the same whether one process evaluates everything or the chunks are shared."""
    seen: list[tuple[str, ...]] = []
    parts: list[tuple[int, int]] = []
    base = held_out_set(CHUNK + 30, seen)
    extra = EvalSet(
        "extra",
        [Example(i, f"q{i}", "0") for i in range(CHUNK + 20)],
        lambda e, texts, turns: [0.0],
        0,
        1.0,
        (),
        1.0,
        0,
    )

    def part(eval_set: EvalSet, first: int, examples: Sequence[Example]) -> SetSums:
        parts.append((first, len(examples)))
        solved = sum(1 for e in examples if e.index % 4 == 0)
        return {"prompts": float(len(examples)), "greedy": float(solved)}

    held_out = HeldOutSet(base.examples, base.evaluate, (extra,), part)
    assert held_out.num_chunks == 3
    whole = held_out()
    assert parts == [(0, CHUNK - 30), (CHUNK - 30, 50)], "each chunk's share of the set"
    assert whole.num_prompts == CHUNK + 30
    assert whole.accuracy == pytest.approx(sum(1 for i in range(CHUNK + 30) if i % 2 == 0) / (CHUNK + 30))
    expected = sum(1 for i in range(CHUNK + 20) if i % 4 == 0) / (CHUNK + 20)
    assert set_metrics(whole.sets) == {"eval/extra/greedy": pytest.approx(expected)}
    store = MemoryStore()
    trainer = TrainerEvaluations(runtime(tmp_path, store, "trainer"), held_out)
    generator = GeneratorEvaluations(runtime(tmp_path, store, "generator-0"), held_out)
    trainer.open_if_due(step=6, version=6)
    generator.after_version(6)
    (shared,) = trainer.take()
    assert shared.accuracy == pytest.approx(whole.accuracy)
    record: dict[str, Any] = {}
    shared.into_record(record)
    assert record["eval/extra/greedy"] == pytest.approx(expected)
    assert record["held_out_accuracy"] == pytest.approx(whole.accuracy)


def test_a_resumed_trainer_records_the_evaluation_its_checkpoint_had_not(tmp_path: Path) -> None:
    """The checkpoint of an evaluation step is written before that evaluation's chunks are all
    in; the trainer that resumes from it still records that evaluation, once."""
    store, seen = MemoryStore(), []
    held_out = held_out_set(CHUNK + 50, seen)
    first = TrainerEvaluations(runtime(tmp_path, store, "trainer"), held_out)
    first.open_if_due(step=6, version=6)
    assert store.claim_evaluation_chunk(6, held_out.num_chunks) == 0  # a generator's
    assert first.take_part(6) == 1
    counters = first.counters()  # the step-6 checkpoint; then the trainer dies
    assert counters == {"eval_open:6": 6.0}
    resumed = TrainerEvaluations(runtime(tmp_path, store, "trainer"), held_out, counters)
    store.add_evaluation(json.dumps(asdict(GOOD) | {"policy_version": 6, "num_chunks": 2}))
    (whole,) = resumed.take()
    assert (whole.step, whole.policy_version) == (6, 6)
    assert resumed.counters() == {}, "recorded: the next checkpoint no longer carries it"
    assert resumed.take() == []


def test_a_resumed_trainers_summary_keeps_the_evaluation_before_rl(tmp_path: Path) -> None:
    sums = {"s": {"prompts": 4.0, "greedy": 1.0}}
    fresh = EvaluationLog(tmp_path, {})
    fresh.own(0, Evaluation(0.1, [], 0.05, 8, sums), before_rl=True)
    resumed = EvaluationLog(tmp_path, fresh.counters())  # the trainer after --resume
    resumed.resumed()
    assert resumed.summary()["final_accuracy"] == 0.1
    later = {"s": {"prompts": 4.0, "greedy": 3.0}}
    resumed.own(40, Evaluation(0.6, [], 0.5, 8, later))
    summary = resumed.summary()
    assert (summary["initial_accuracy"], summary["final_accuracy"]) == (0.1, 0.6)
    first_turn = (summary["initial_first_turn_accuracy"], summary["final_first_turn_accuracy"])
    assert first_turn == (0.05, 0.5)
    assert summary["initial_evaluations"] == {"eval/s/greedy": 0.25}
    assert summary["final_evaluations"] == {"eval/s/greedy": 0.75}
    fresh.close()
    resumed.close()
