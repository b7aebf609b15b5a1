"""Held-out evaluations in async runs, made with the capacity that would idle, in chunks.

A trainer that evaluates alone stops training for as long as the evaluation takes, and its
generators, held by the staleness gate, wait with it; a generator that evaluates alone stops
generating, and the trainer waits for its rollouts. Instead (`trainer.evaluate_on: shared`, the
default) the held-out prompts are cut into chunks of one evaluation batch (`CHUNK`: a chunk is
computed the same way wherever it runs), and every process holding the version of an evaluation
step takes chunks in turn from the store until none is left (`Store.claim_evaluation_chunk`):
the trainer right after it publishes that version, and each generator that takes up exactly
that version. Both cores evaluate at once, and both go back to RL together. A claim records its
claimer; once the worker registry no longer reports that claimer alive (its heartbeats lapsed
for `workers.heartbeat_ttl_s`, it stopped, or it registered again: a restart), the next process
holding the version to ask takes the chunk over, and a generator asks again once a heartbeat
while it holds the version. Only the chunk's current claim may add its result, so each chunk is
counted once and a late result from a claimer presumed dead is refused (and counted). Each
evaluated chunk is appended to the store's list (JSON); the trainer reads the list once a step,
and once every chunk of a step is in, writes the whole evaluation into that step's metrics
record (`held_out_accuracy`, with `eval_step` and `eval_version`: the step and the one version
evaluated, and `eval_wall_s`: from the first chunk's start to the last one's end) and into
RUN_DIR/samples.jsonl. At the last step it waits (up to `sync.timeout_s`) for every chunk that a
live claimer holds; an evaluation missing a chunk whose claimer died, with no process left
holding its version to take it over, is not recorded. The evaluations before RL and after the
last step, every evaluation of a sync run, and those of a trainer that cannot share
(`shares_evaluations`) are the trainer's own, whole. An entry that is not a well-formed chunk is
refused and counted (`malformed_evaluation`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import structlog

from llamarl.config import RunConfig
from llamarl.observe.progress import Listener
from llamarl.roles.runtime import RoleRuntime
from llamarl.tasks import Example
from llamarl.training.eval_sets import EvalSet, SetSums, add_sums, set_metrics
from llamarl.training.evaluate import BATCH_SIZE, Evaluation, merged

log = structlog.get_logger(__name__)
CHUNK = BATCH_SIZE
"""Held-out prompts a chunk: one evaluation batch, so it is computed alike on every role."""
MAX_SAMPLES = 16
"""Samples an entry may carry (an evaluation shows a few)."""
WAIT_POLL_S = 0.05
OPEN = "eval_open:"
"""Prefix of an opened evaluation's version among a checkpoint's counters."""


@dataclass(frozen=True)
class HeldOutSet:
    """The task's held-out prompts and how to evaluate some of them (greedy), followed by the
    named evaluation sets' prompts (`evaluation.sets`) and how to evaluate a part of a set."""

    examples: list[Example]
    evaluate: Callable[[Sequence[Example], Listener | None], Evaluation]
    sets: tuple[EvalSet, ...] = ()
    evaluate_part: Callable[[EvalSet, int, Sequence[Example]], SetSums] | None = None
    """(set, position of the part's first prompt in the set, the part's prompts) -> sums."""

    def __call__(self, listener: Listener | None = None) -> Evaluation:
        """The whole of it, chunk by chunk (as a shared evaluation computes it)."""
        return merged([self.chunk(index, listener) for index in range(self.num_chunks)])

    @property
    def num_prompts(self) -> int:
        return len(self.examples) + sum(len(s.examples) for s in self.sets)

    @property
    def num_chunks(self) -> int:
        return math.ceil(self.num_prompts / CHUNK)

    def chunk(self, index: int, listener: Listener | None = None) -> Evaluation:
        """Prompts index * CHUNK up to the next chunk's of the held-out set and then the named
        sets, each part evaluated its own way."""
        start, end = index * CHUNK, (index + 1) * CHUNK
        held = self.examples[start:end]
        result = self.evaluate(held, listener) if held else Evaluation(0.0, [])
        offset = len(self.examples)
        for eval_set in self.sets:
            first, last = max(start - offset, 0), min(end - offset, len(eval_set.examples))
            if first < last:
                assert self.evaluate_part is not None
                part = self.evaluate_part(eval_set, first, eval_set.examples[first:last])
                result = merged([result, Evaluation(0.0, [], sets={eval_set.name: part})])
            offset += len(eval_set.examples)
        return result


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
    sets: dict[str, SetSums] = field(default_factory=dict)
    """The named evaluation sets' sums over the chunk's prompts of theirs."""


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
    sets: dict[str, SetSums]

    def into_record(self, record: dict[str, Any]) -> dict[str, Any]:
        """Its fields in a trainer's metrics record (beside the step and version it evaluated);
        its entry for RUN_DIR/samples.jsonl."""
        record["held_out_accuracy"] = self.accuracy
        record["eval_step"], record["eval_version"] = self.step, self.policy_version
        record["eval_wall_s"] = self.wall_s
        if self.first_turn_accuracy is not None:
            record["held_out_first_turn_accuracy"] = self.first_turn_accuracy
        record |= set_metrics(self.sets)
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

    firsts = [c.first_turn_accuracy for c in chunks if c.num_prompts]
    first = None if None in firsts else mean([c.first_turn_accuracy or 0.0 for c in chunks])
    wall_s = max(c.ended for c in chunks) - min(c.started for c in chunks)
    sets: dict[str, SetSums] = {}
    for chunk in chunks:
        sets = add_sums(sets, chunk.sets)
    return HeldOut(
        step,
        chunks[0].policy_version,
        mean([c.accuracy for c in chunks]),
        first,
        chunks[0].samples,
        round(wall_s, 4),
        sorted({c.worker_id for c in chunks}),
        sets,
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
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else kind):
            raise ValueError(f"{name}: {value!r} is not {kind.__name__}")
    first = tree.get("first_turn_accuracy")
    if first is not None and (isinstance(first, bool) or not isinstance(first, (int, float))):
        raise ValueError(f"first_turn_accuracy: {first!r} is not a number")
    if not 0.0 <= tree["accuracy"] <= 1.0 or not 0 <= tree["chunk"] < tree["num_chunks"]:
        raise ValueError(f"accuracy {tree['accuracy']!r} or chunk {tree['chunk']!r} out of range")
    if tree["num_prompts"] < 0 or not all(map(math.isfinite, (tree["started"], tree["ended"]))):
        raise ValueError("num_prompts, started or ended out of range")
    samples = tree["samples"]
    if len(samples) > MAX_SAMPLES or not all(isinstance(s, dict) for s in samples):
        raise ValueError(f"samples: at most {MAX_SAMPLES} objects")
    return EvaluatedChunk(
        **{name: tree[name] for name in fields},
        first_turn_accuracy=None if first is None else float(first),
        sets=_set_sums(tree.get("sets")),
    )


def _set_sums(value: Any) -> dict[str, SetSums]:
    """A chunk's `sets`: a map of set names to maps of finite numbers; ValueError otherwise."""
    if not isinstance(value, dict):
        raise ValueError(f"sets: {value!r} is not an object")
    for name, sums in value.items():
        if not isinstance(sums, dict) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in sums.values()
        ):
            raise ValueError(f"sets.{name}: not a map of numbers")
    return {name: {k: float(v) for k, v in sums.items()} for name, sums in value.items()}


def take_part(runtime: RoleRuntime, held_out: HeldOutSet, version: int) -> int:
    """Evaluate chunks of `version`'s evaluation, if one is open, with the weights of `version`
    (which the caller holds) until none is left unclaimed, taking over those of dead claimers;
    the number evaluated here and added (a chunk taken over meanwhile is refused, and counted)."""
    done = 0
    store = runtime.store
    while (claim := store.claim_evaluation_chunk(version, held_out.num_chunks, runtime.worker_id)) is not None:
        if claim.attempt:
            runtime.count("evaluation_chunks_taken_over")
        started = time.time()
        with runtime.keep_alive("evaluating") as phase:
            result = held_out.chunk(claim.chunk, phase.report)
        chunk = EvaluatedChunk(
            version,
            claim.chunk,
            held_out.num_chunks,
            result.num_prompts,
            result.accuracy,
            result.first_turn_accuracy,
            result.samples[:MAX_SAMPLES] if claim.chunk == 0 else [],
            started,
            time.time(),
            runtime.worker_id,
            result.sets,
        )
        if store.add_evaluation(claim, json.dumps(asdict(chunk))):
            done += 1
        else:  # this worker was presumed dead and the chunk claimed again
            runtime.count("evaluation_chunks_refused")
            log.warning("evaluated chunk refused: claimed again meanwhile", policy_version=version, chunk=claim.chunk)
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
    the trainer opened one, and, while it holds that version, take over the chunks of claimers
    that died."""

    def __init__(self, runtime: RoleRuntime, held_out: HeldOutSet) -> None:
        self.runtime = runtime
        self.held_out = held_out
        self.next_check = -math.inf

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

    def while_holding(self, version: int) -> None:
        """Between batches, at most once a heartbeat (`workers.heartbeat_s`): evaluate the chunks
        of `version`, which this generator holds, whose claimers the registry reports dead."""
        now = self.runtime.clock()
        if now >= self.next_check:
            self.next_check = now + self.runtime.config.workers.heartbeat_s
            self.after_version(version)


class TrainerEvaluations:
    """The trainer's side: open the evaluation of each evaluation step's version (before it is
    announced), take part in it, and collect the evaluations whose every chunk has come in."""

    def __init__(self, runtime: RoleRuntime, held_out: HeldOutSet, counters: dict[str, float] | None = None) -> None:
        self.runtime = runtime
        self.held_out = held_out
        self.opened: dict[int, int] = {
            int(key[len(OPEN) :]): int(step) for key, step in (counters or {}).items() if key.startswith(OPEN)
        }
        """Version -> the step whose evaluation it is, until it is recorded: this process's
        openings, and those a checkpoint it resumed from had not recorded yet (their chunks are
        read again from the start of the store's list)."""
        self.seen = 0
        self.partial: dict[int, list[EvaluatedChunk]] = {}

    def open_if_due(self, step: int, version: int) -> None:
        """Open `version`'s evaluation when `step` is an evaluation step before the last."""
        trainer = self.runtime.config.trainer
        if step % trainer.eval_every == 0 and step < trainer.num_steps:
            self.runtime.store.open_evaluation(version)
            self.opened[version] = step

    def counters(self) -> dict[str, float]:
        """What a checkpoint keeps: the evaluations opened and not yet recorded."""
        return {f"{OPEN}{version}": float(step) for version, step in self.opened.items()}

    def take_part(self, version: int) -> int:
        """Evaluate chunks of `version`'s evaluation, if this process opened one; how many."""
        return take_part(self.runtime, self.held_out, version) if version in self.opened else 0

    def take(self, wait_s: float = 0.0) -> list[HeldOut]:
        """The evaluations completed since the last call; with `wait_s`, first wait up to that
        long for every chunk a live claimer holds to be added (the run's last step: none is left
        behind, and none whose claimer died is waited for)."""
        store = self.runtime.store
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and store.awaited_evaluations():
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
                del self.opened[chunk.policy_version]
        return sorted(done, key=lambda h: h.step)
