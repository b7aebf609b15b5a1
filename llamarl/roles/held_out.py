"""Held-out evaluations off the trainer's critical path (`trainer.evaluate_on: generator`, the
default for async runs).

A trainer that evaluates stops training for as long as the evaluation takes, and its generators,
held by the staleness gate, wait with it (in the demo, 40% of an async run). Instead, the
generator that first takes up a version at or past an evaluation step (every
`trainer.eval_every` steps, before the last) claims that step's evaluation in the store,
evaluates the version it holds (greedy, with its own weights: `generation.dtype`) and appends
the result to the store's list; the trainer reads the list once a step and writes each result
into that step's metrics record (`held_out_accuracy`, with `eval_step` and `eval_version`: the
step and version that were evaluated) and into RUN_DIR/samples.jsonl; at the last step it waits
(up to `sync.timeout_s`) for every claimed evaluation, so none is left behind. The evaluation
before RL and the one after the last step stay the trainer's, as does every evaluation of a sync
run. An entry that is not a well-formed evaluation is refused and counted
(`malformed_evaluation`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from llamarl.observe.progress import Listener
from llamarl.roles.runtime import RoleRuntime
from llamarl.store import Store
from llamarl.training.evaluate import Evaluation

MAX_SAMPLES = 16
"""Samples an entry may carry (an evaluation shows a few)."""
WAIT_POLL_S = 0.05


@dataclass(frozen=True)
class HeldOut:
    """One evaluation a generator made."""

    step: int
    policy_version: int
    accuracy: float
    first_turn_accuracy: float | None
    samples: list[dict[str, Any]]
    eval_s: float
    worker_id: str

    def into_record(self, record: dict[str, Any]) -> dict[str, Any]:
        """Its fields in a trainer's metrics record (beside the step and version it evaluated);
        its entry for RUN_DIR/samples.jsonl."""
        record["held_out_accuracy"] = self.accuracy
        record["eval_step"], record["eval_version"] = self.step, self.policy_version
        if self.first_turn_accuracy is not None:
            record["held_out_first_turn_accuracy"] = self.first_turn_accuracy
        return {"step": self.step, "accuracy": self.accuracy, "samples": self.samples,
                "evaluated_by": self.worker_id}  # fmt: skip


def due_step(version: int, every_steps: int, eval_every: int, num_steps: int,
             last_step: int) -> int | None:  # fmt: skip
    """The evaluation step that taking up `version` reaches (its step, when that crosses an
    `eval_every` boundary past `last_step` and is before the last step), else None."""
    step = version * every_steps
    if step >= num_steps or step // eval_every <= last_step // eval_every:
        return None
    return step


def parse(text: str) -> HeldOut:
    """An entry of the store's list; ValueError naming what is wrong."""
    try:
        tree = json.loads(text)
    except ValueError as err:
        raise ValueError(f"not JSON ({err})") from None
    if not isinstance(tree, dict):
        raise ValueError("not an object")
    fields = {"step": int, "policy_version": int, "accuracy": float, "eval_s": float,
              "samples": list, "worker_id": str}  # fmt: skip
    for name, kind in fields.items():
        value = tree.get(name)
        if isinstance(value, bool) or not isinstance(
            value, (int, float) if kind is float else kind
        ):
            raise ValueError(f"{name}: {value!r} is not {kind.__name__}")
    first = tree.get("first_turn_accuracy")
    if first is not None and (isinstance(first, bool) or not isinstance(first, (int, float))):
        raise ValueError(f"first_turn_accuracy: {first!r} is not a number")
    if not 0.0 <= tree["accuracy"] <= 1.0 or not math.isfinite(tree["eval_s"]):
        raise ValueError(f"accuracy {tree['accuracy']!r} or eval_s {tree['eval_s']!r} out of range")
    samples = tree["samples"]
    if len(samples) > MAX_SAMPLES or not all(isinstance(s, dict) for s in samples):
        raise ValueError(f"samples: at most {MAX_SAMPLES} objects")
    return HeldOut(tree["step"], tree["policy_version"], float(tree["accuracy"]),
                   None if first is None else float(first), samples, float(tree["eval_s"]),
                   tree["worker_id"])  # fmt: skip


class GeneratorEvaluations:
    """A generator's side: evaluate the versions it takes up that reach an evaluation step,
    when it is the first to claim that step."""

    def __init__(self, runtime: RoleRuntime,
                 evaluation: Callable[[Listener | None], Evaluation]) -> None:  # fmt: skip
        self.runtime = runtime
        self.evaluation = evaluation
        self.last_step = 0

    def after_version(self, version: int) -> None:
        runtime = self.runtime
        trainer, every_steps = runtime.config.trainer, runtime.config.sync.every_steps
        step = due_step(version, every_steps, trainer.eval_every, trainer.num_steps,
                        self.last_step)  # fmt: skip
        if step is None:
            return
        self.last_step = step
        if not runtime.store.claim_evaluation(step, runtime.worker_id):
            return
        timer = runtime.timer
        was_busy = timer.running
        if not was_busy:
            timer.busy()
        started = runtime.clock()
        with runtime.keep_alive("evaluating") as phase:
            result = self.evaluation(phase.report)
        seconds = runtime.add_time("eval_s", started)
        if not was_busy:
            timer.idle()
        held_out = HeldOut(step, version, result.accuracy, result.first_turn_accuracy,
                           result.samples[:MAX_SAMPLES], seconds, runtime.worker_id)  # fmt: skip
        runtime.store.add_evaluation(json.dumps(asdict(held_out)))
        runtime.count("evaluations")


class EvaluationIntake:
    """The trainer's side: the evaluations generators have added since the last look (none
    from before `after_step`, the step a resumed trainer starts from)."""

    def __init__(self, store: Store, refuse: Callable[[str, str], None], after_step: int) -> None:
        self.store = store
        self.refuse = refuse
        self.after_step = after_step
        self.seen = 0

    def take(self, wait_s: float = 0.0) -> list[HeldOut]:
        """The entries added since the last call; with `wait_s`, first wait up to that long for
        every claimed evaluation to be added (the run's last step: none is left behind)."""
        deadline = time.monotonic() + wait_s
        entries = self.store.evaluations(self.seen)
        while (self.seen + len(entries) < self.store.claimed_evaluations()
               and time.monotonic() < deadline):  # fmt: skip
            time.sleep(WAIT_POLL_S)
            entries = self.store.evaluations(self.seen)
        self.seen += len(entries)
        taken = []
        for text in entries:
            try:
                held_out = parse(text)
            except ValueError as err:
                self.refuse("malformed_evaluation", str(err))
                continue
            if held_out.step > self.after_step:
                taken.append(held_out)
        return taken
