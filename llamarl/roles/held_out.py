"""Held-out evaluations in async runs, made with the capacity that would idle, in chunks.

A trainer that evaluates alone stops training for as long as the evaluation takes, and its
generators, held by the staleness gate, wait with it; a generator that evaluates alone stops
generating, and the trainer waits for its rollouts. Instead (`trainer.evaluate_on: shared`, the
default) the held-out prompts are cut into chunks of one evaluation batch (`CHUNK`: a chunk is
computed the same way wherever it runs), and every process holding the version of an evaluation
step takes chunks in turn from the store until none is left (`Store.claim_evaluation_chunk`:
each chunk exactly once): the trainer right after it publishes that version, and each generator
that takes up exactly that version. Both cores evaluate at once, and both go back to RL together.
Each evaluated chunk is appended to the store's list (JSON); the trainer reads the list once a
step, and once every chunk of a step is in, writes the whole evaluation into that step's metrics
record (`held_out_accuracy`, with `eval_step` and `eval_version`: the step and the one version
evaluated, and `eval_wall_s`: from the first chunk's start to the last one's end) and into
RUN_DIR/samples.jsonl. At the last step it waits (up to `sync.timeout_s`) for every claimed
chunk. The evaluations before RL and after the last step, every evaluation of a sync run, and
those of a trainer that cannot share (`shares_evaluations`) are the trainer's own, whole. An
entry that is not a well-formed chunk is refused and counted (`malformed_evaluation`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from llamarl.config import RunConfig
from llamarl.observe.progress import Listener
from llamarl.roles.runtime import RoleRuntime
from llamarl.tasks import Example
from llamarl.training.evaluate import BATCH_SIZE, Evaluation

CHUNK = BATCH_SIZE
"""Held-out prompts a chunk: one evaluation batch, so it is computed alike on every role."""
MAX_SAMPLES = 16
"""Samples an entry may carry (an evaluation shows a few)."""
WAIT_POLL_S = 0.05


@dataclass(frozen=True)
class HeldOutSet:
    """The task's held-out prompts and how to evaluate some of them (greedy)."""

    examples: list[Example]
    evaluate: Callable[[Sequence[Example], Listener | None], Evaluation]

    def __call__(self, listener: Listener | None = None) -> Evaluation:
        """The whole set at once."""
        return self.evaluate(self.examples, listener)

    @property
    def num_chunks(self) -> int:
        return math.ceil(len(self.examples) / CHUNK)

    def chunk(self, index: int, listener: Listener | None = None) -> Evaluation:
        return self.evaluate(self.examples[index * CHUNK : (index + 1) * CHUNK], listener)


@dataclass(frozen=True)
class EvaluatedChunk:
    """One chunk of one evaluation, as a store entry."""

    policy_version: int
    chunk: int
    num_chunks: int
    num_prompts: int
    accuracy: float
    first_turn_accuracy: float | None
    samples: list[dict[str, Any]]
    started: float
    ended: float
    """Wall-clock times (time.time()) of the chunk's start and end."""
    worker_id: str


@dataclass(frozen=True)
class HeldOut:
    """A whole evaluation: every chunk of one step, combined."""

    step: int
    policy_version: int
    accuracy: float
    first_turn_accuracy: float | None
    samples: list[dict[str, Any]]
    wall_s: float
    workers: list[str]

    def into_record(self, record: dict[str, Any]) -> dict[str, Any]:
        """Its fields in a trainer's metrics record (beside the step and version it evaluated);
        its entry for RUN_DIR/samples.jsonl."""
        record["held_out_accuracy"] = self.accuracy
        record["eval_step"], record["eval_version"] = self.step, self.policy_version
        record["eval_wall_s"] = self.wall_s
        if self.first_turn_accuracy is not None:
            record["held_out_first_turn_accuracy"] = self.first_turn_accuracy
        return {
            "step": self.step,
            "accuracy": self.accuracy,
            "samples": self.samples,
            "evaluated_by": ",".join(self.workers),
        }


def combine(step: int, chunks: list[EvaluatedChunk]) -> HeldOut:
    """The evaluation of `step` that `chunks` (every chunk of its version) make together."""
    chunks = sorted(chunks, key=lambda c: c.chunk)
    total = sum(c.num_prompts for c in chunks)

    def mean(values: list[float]) -> float:
        return sum(v * c.num_prompts for v, c in zip(values, chunks, strict=True)) / total

    firsts = [c.first_turn_accuracy for c in chunks]
    first = None if None in firsts else mean([float(f or 0.0) for f in firsts])
    wall_s = max(c.ended for c in chunks) - min(c.started for c in chunks)
    return HeldOut(
        step,
        chunks[0].policy_version,
        mean([c.accuracy for c in chunks]),
        first,
        chunks[0].samples,
        round(wall_s, 4),
        sorted({c.worker_id for c in chunks}),
    )


def parse(text: str) -> EvaluatedChunk:
    """An entry of the store's list; ValueError naming what is wrong."""
    try:
        tree = json.loads(text)
    except ValueError as err:
        raise ValueError(f"not JSON ({err})") from None
    if not isinstance(tree, dict):
        raise ValueError("not an object")
    fields = {
        "policy_version": int,
        "chunk": int,
        "num_chunks": int,
        "num_prompts": int,
        "accuracy": float,
        "started": float,
        "ended": float,
        "samples": list,
        "worker_id": str,
    }
    for name, kind in fields.items():
        value = tree.get(name)
        if isinstance(value, bool) or not isinstance(
            value, (int, float) if kind is float else kind
        ):
            raise ValueError(f"{name}: {value!r} is not {kind.__name__}")
    first = tree.get("first_turn_accuracy")
    if first is not None and (isinstance(first, bool) or not isinstance(first, (int, float))):
        raise ValueError(f"first_turn_accuracy: {first!r} is not a number")
    if not 0.0 <= tree["accuracy"] <= 1.0 or not 0 <= tree["chunk"] < tree["num_chunks"]:
        raise ValueError(f"accuracy {tree['accuracy']!r} or chunk {tree['chunk']!r} out of range")
    if tree["num_prompts"] < 1 or not all(map(math.isfinite, (tree["started"], tree["ended"]))):
        raise ValueError("num_prompts, started or ended out of range")
    samples = tree["samples"]
    if len(samples) > MAX_SAMPLES or not all(isinstance(s, dict) for s in samples):
        raise ValueError(f"samples: at most {MAX_SAMPLES} objects")
    return EvaluatedChunk(
        **{name: tree[name] for name in fields},
        first_turn_accuracy=None if first is None else float(first),
    )


def take_part(runtime: RoleRuntime, held_out: HeldOutSet, version: int) -> int:
    """Evaluate chunks of `version`'s evaluation, if one is open, with the weights of `version`
    (which the caller holds) until none is left unclaimed; the number evaluated here."""
    done = 0
    store = runtime.store
    while (index := store.claim_evaluation_chunk(version, held_out.num_chunks)) is not None:
        started = time.time()
        with runtime.keep_alive("evaluating") as phase:
            result = held_out.chunk(index, phase.report)
        chunk = EvaluatedChunk(
            version,
            index,
            held_out.num_chunks,
            min(CHUNK, len(held_out.examples) - index * CHUNK),
            result.accuracy,
            result.first_turn_accuracy,
            result.samples[:MAX_SAMPLES] if index == 0 else [],
            started,
            time.time(),
            runtime.worker_id,
        )
        store.add_evaluation(json.dumps(asdict(chunk)))
        done += 1
    return done


def shares_evaluations(config: RunConfig) -> bool:
    """Whether an async run's trainer shares its evaluations: `evaluate_on: shared`, a trainer
    whose weights are whole on rank 0 (not FSDP), and evaluation steps that fall on versions."""
    trainer = config.trainer
    return (
        trainer.evaluate_on == "shared"
        and trainer.sharding != "fsdp"
        and trainer.eval_every % config.sync.every_steps == 0
    )


class GeneratorEvaluations:
    """A generator's side: take part in the evaluation of each version it takes up for which
    the trainer opened one."""

    def __init__(self, runtime: RoleRuntime, held_out: HeldOutSet) -> None:
        self.runtime = runtime
        self.held_out = held_out

    def after_version(self, version: int) -> None:
        timer = self.runtime.timer
        was_busy = timer.running
        if not was_busy:
            timer.busy()
        started = self.runtime.clock()
        if take_part(self.runtime, self.held_out, version):
            self.runtime.count("evaluations")
            self.runtime.add_time("eval_s", started)
        if not was_busy:
            timer.idle()


class TrainerEvaluations:
    """The trainer's side: open the evaluation of each evaluation step's version (before it is
    announced), take part in it, and collect the evaluations whose every chunk has come in."""

    def __init__(self, runtime: RoleRuntime, held_out: HeldOutSet) -> None:
        self.runtime = runtime
        self.held_out = held_out
        self.opened: dict[int, int] = {}
        """Version -> the step whose evaluation it is (this process's openings only)."""
        self.seen = 0
        self.partial: dict[int, list[EvaluatedChunk]] = {}

    def open_if_due(self, step: int, version: int) -> None:
        """Open `version`'s evaluation when `step` is an evaluation step before the last."""
        trainer = self.runtime.config.trainer
        if step % trainer.eval_every == 0 and step < trainer.num_steps:
            self.runtime.store.open_evaluation(version)
            self.opened[version] = step

    def take_part(self, version: int) -> int:
        """Evaluate chunks of `version`'s evaluation, if this process opened one; how many."""
        return take_part(self.runtime, self.held_out, version) if version in self.opened else 0

    def take(self, wait_s: float = 0.0) -> list[HeldOut]:
        """The evaluations completed since the last call; with `wait_s`, first wait up to that
        long for every claimed chunk to be added (the run's last step: none is left behind)."""
        store = self.runtime.store
        deadline = time.monotonic() + wait_s
        entries = store.evaluations(self.seen)
        while (
            self.seen + len(entries) < store.claimed_evaluations() and time.monotonic() < deadline
        ):
            time.sleep(WAIT_POLL_S)
            entries = store.evaluations(self.seen)
        self.seen += len(entries)
        done = []
        for text in entries:
            try:
                chunk = parse(text)
            except ValueError as err:
                self.runtime.rejections.record("malformed_evaluation", str(err))
                continue
            step = self.opened.get(chunk.policy_version)
            if step is None:
                continue  # opened before this process resumed: not its to record
            parts = self.partial.setdefault(chunk.policy_version, [])
            parts.append(chunk)
            if len({c.chunk for c in parts}) == chunk.num_chunks:
                done.append(combine(step, self.partial.pop(chunk.policy_version)))
        return sorted(done, key=lambda h: h.step)
