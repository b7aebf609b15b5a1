"""Evaluations shared in chunks: each chunk is evaluated once, by whoever claims it, only for a
version the trainer opened; the trainer records an evaluation once every chunk is in, its
accuracy the whole set's, and refuses malformed entries; at the last step it waits for every
claimed chunk. Real roles' runtimes on the in-process store and bus."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from brokers.redis_server import RedisServer
from llamarl.bus import MemoryHub
from llamarl.config import parse_config
from llamarl.limits import Clock
from llamarl.observe.progress import Listener
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
from llamarl.store import EvaluationClaim, RedisStore, Store
from llamarl.store.memory import MemoryStore
from llamarl.tasks import Example
from llamarl.training.eval_sets import EvalSet, SetSums, set_metrics
from llamarl.training.evaluate import Evaluation
from tests.factories import FakeClock
from tests.memory_runtime import memory_runtime

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


def runtime(
    tmp_path: Path, store: Store, worker_id: str, clock: Clock = time.monotonic, **sections: dict[str, Any]
) -> RoleRuntime:
    tree = {"run_id": "held", "run_dir": str(tmp_path), "trainer": {"eval_every": 6, "num_steps": 20}}
    config = parse_config(tree | sections)
    made = memory_runtime(worker_id.split("-")[0], config, worker_id, store, MemoryHub("held"), clock)
    made.register()  # a claim is held while the registry reports its claimer alive
    return made


def claimed_by_generator_1(store: Store, version: int, num_chunks: int) -> EvaluationClaim:
    """A chunk claimed by generator-1, a live worker evaluating it elsewhere."""
    store.register_worker("generator-1", "generator", ttl_s=3600.0)
    claim = store.claim_evaluation_chunk(version, num_chunks, "generator-1")
    assert claim is not None
    return claim


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
    taken = claimed_by_generator_1(store, 7, held_out.num_chunks)
    assert taken.chunk == 0
    assert trainer.take_part(7) == 2
    generator.after_version(7)  # every chunk is claimed already
    assert [(batch[0], len(batch)) for batch in seen] == [("p100", CHUNK), ("p200", 50)]
    assert trainer.take() == [], "chunk 0 is not in yet"
    assert store.add_evaluation(
        taken, json.dumps(asdict(GOOD) | {"policy_version": 7, "num_chunks": 3, "accuracy": 1.0})
    )
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
    assert claimed_by_generator_1(store, 12, 4).chunk == 0
    generator.after_version(12)  # takes the three left
    assert trainer.take_part(12) == 0
    batches = [batch[0] for batch in seen]
    assert batches == ["p100", "p200", "p300"], "each chunk is one evaluation batch"
    assert trainer.take() == [], "chunk 0 is not in yet"


def test_a_generator_holding_the_version_takes_over_a_dead_claimers_chunks_once_a_heartbeat(
    tmp_path: Path,
) -> None:
    clock, seen = FakeClock(), []
    store = MemoryStore(clock=clock)
    held_out = held_out_set(2 * CHUNK, seen)
    trainer = TrainerEvaluations(runtime(tmp_path, store, "trainer", clock), held_out)
    trainer.open_if_due(step=6, version=6)
    store.register_worker("generator-1", "generator", ttl_s=1.0)
    claims = [store.claim_evaluation_chunk(6, 2, "generator-1") for _ in range(2)]
    assert [c.chunk for c in claims if c] == [0, 1]
    generator = GeneratorEvaluations(runtime(tmp_path, store, "generator-0", clock), held_out)
    heartbeat_s = generator.runtime.config.workers.heartbeat_s
    generator.while_holding(6)  # generator-1 is alive: its chunks are its own
    clock.advance(heartbeat_s - 0.5)  # generator-1's registration lapsed; no heartbeat since the last ask
    generator.while_holding(6)
    assert seen == [], "it asks at most once a heartbeat"
    clock.advance(0.5)
    generator.while_holding(6)
    assert [batch[0] for batch in seen] == ["p0", "p100"]
    assert generator.runtime.counters["evaluation_chunks_taken_over"] == 2
    (whole,) = trainer.take()
    assert (whole.step, whole.workers) == (6, ["generator-0"])
    assert not any(store.add_evaluation(c, "late") for c in claims if c), "generator-1's results come too late"


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
    store.open_evaluation(6)  # by the trainer this one resumed from
    good = json.dumps(asdict(GOOD) | {"policy_version": 12, "num_chunks": 1})
    for version, entry in [(6, json.dumps(asdict(GOOD))), (12, "{broken"), (12, good)]:
        assert store.add_evaluation(claimed_by_generator_1(store, version, 3), entry)
    assert [(h.step, h.accuracy, h.workers) for h in trainer.take()] == [(12, 0.5, ["generator-0"])]
    role.rejections.flush(force=True)
    assert store.rejected() == {"trainer.malformed_evaluation": 1}


def test_at_the_last_step_the_trainer_waits_for_every_claimed_chunk(tmp_path: Path) -> None:
    store = MemoryStore()
    trainer = TrainerEvaluations(runtime(tmp_path, store, "trainer"), held_out_set(1, []))
    trainer.open_if_due(step=6, version=6)
    claim = claimed_by_generator_1(store, 6, 1)
    entry = json.dumps(asdict(GOOD) | {"num_chunks": 1})
    late = threading.Timer(0.2, store.add_evaluation, [claim, entry])
    late.start()
    try:
        assert [h.step for h in trainer.take(wait_s=30.0)] == [6], "waited for the claimed one"
    finally:
        late.join()
    trainer.open_if_due(step=12, version=12)
    claimed_by_generator_1(store, 12, 1)
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
    claim = claimed_by_generator_1(store, 6, held_out.num_chunks)
    assert claim.chunk == 0
    assert first.take_part(6) == 1
    counters = first.counters()  # the step-6 checkpoint; then the trainer dies
    assert counters == {"eval_open:6": 6.0}
    resumed = TrainerEvaluations(runtime(tmp_path, store, "trainer"), held_out, counters)
    assert store.add_evaluation(claim, json.dumps(asdict(GOOD) | {"policy_version": 6, "num_chunks": 2}))
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


# -- a claimer that dies mid-chunk (a process of its own, killed; the run's Redis) -------------
BEATS: dict[str, Any] = {"workers": {"heartbeat_s": 0.1, "heartbeat_ttl_s": 1.0}}
WAIT_S = 30.0
POLL_S = 0.05


def until(probe: Callable[[], Any], what: str) -> Any:
    """The first truthy result of `probe`, tried every POLL_S for up to WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not (got := probe()):
        assert time.monotonic() < deadline, f"no {what} within {WAIT_S:.0f} s"
        threading.Event().wait(POLL_S)
    return got


def claim_a_chunk_and_hang(url: str, run_dir: str, evaluating: Any) -> None:
    """generator-0: take up version 6, claim a chunk of its evaluation and never finish it."""
    store = RedisStore(url, "test", connect_deadline_s=5)
    role = runtime(Path(run_dir), store, "generator-0", **BEATS)

    def hang(batch: Sequence[Example], listener: Listener | None) -> Evaluation:
        evaluating.set()
        threading.Event().wait()  # until the test kills this process
        raise AssertionError("unreachable")

    GeneratorEvaluations(role, HeldOutSet(held_out_set(CHUNK + 50, []).examples, hang)).after_version(6)


def a_claimer_dies_mid_chunk(store: RedisStore, url: str, tmp_path: Path) -> TrainerEvaluations:
    """Version 6's evaluation (two chunks) open; generator-0 claims chunk 0, the trainer
    evaluates chunk 1, and generator-0 is killed (SIGKILL) while evaluating chunk 0."""
    trainer = TrainerEvaluations(runtime(tmp_path, store, "trainer", **BEATS), held_out_set(CHUNK + 50, []))
    trainer.open_if_due(step=6, version=6)
    context = mp.get_context("spawn")
    evaluating = context.Event()
    claimer = context.Process(target=claim_a_chunk_and_hang, args=(url, str(tmp_path), evaluating))
    claimer.start()
    try:
        assert evaluating.wait(WAIT_S * 2), "generator-0 never started on its chunk"
        assert trainer.take_part(6) == 1, "generator-0 holds chunk 0: the trainer takes chunk 1"
    finally:
        os.kill(claimer.pid, signal.SIGKILL)
        claimer.join(WAIT_S)
    return trainer


def test_a_dead_claimers_chunk_is_taken_over_by_a_generator_holding_its_version(
    store: RedisStore, redis_server: RedisServer, tmp_path: Path
) -> None:
    trainer = a_claimer_dies_mid_chunk(store, redis_server.url, tmp_path)
    role = runtime(tmp_path, store, "generator-1", **BEATS)
    generator = GeneratorEvaluations(role, held_out_set(CHUNK + 50, []))

    def took_over() -> float:
        role.beat()  # a generator's loop: it beats, and it holds version 6
        generator.after_version(6)
        return role.counters.get("evaluations", 0)

    until(took_over, "generator-1 taking over chunk 0 of generator-0, killed")
    started = time.monotonic()
    (whole,) = trainer.take(wait_s=trainer.runtime.config.sync.timeout_s)  # the last step
    assert time.monotonic() - started < WAIT_S, "every chunk was in: the last step did not wait"
    assert (whole.step, whole.workers, whole.accuracy) == (6, ["generator-1", "trainer"], 0.5)
    assert sorted(parse(entry).chunk for entry in store.evaluations()) == [0, 1], "each chunk once"


def test_the_last_step_does_not_wait_out_the_timeout_for_a_dead_claimers_chunk(
    store: RedisStore, redis_server: RedisServer, tmp_path: Path
) -> None:
    trainer = a_claimer_dies_mid_chunk(store, redis_server.url, tmp_path)
    timeout_s = trainer.runtime.config.sync.timeout_s
    started = time.monotonic()
    assert trainer.take(wait_s=timeout_s) == [], "no one holds version 6 to evaluate chunk 0 again"
    waited = time.monotonic() - started
    assert waited < timeout_s / 2, f"the last step waited {waited:.1f} s for a chunk whose claimer died"
