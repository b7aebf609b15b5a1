"""What the trainer keeps of its evaluations, its own and the shared ones
(`llamarl.roles.held_out`): the first and the latest held-out accuracy (and, for episodes, the
first-turn accuracy), the named evaluation sets' metrics before RL and at the latest
evaluation, and RUN_DIR/samples.jsonl (a few completions of each evaluation). The first
accuracy and the sets' first metrics travel in the checkpoint's counters, so a resumed run's
summary still compares against the start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import structlog

from llamarl.roles.held_out import HeldOut
from llamarl.roles.trainer_durability import SAMPLES_LOG
from llamarl.training.eval_sets import SET_PREFIX, SetSums, set_metrics
from llamarl.training.evaluate import Evaluation

log = structlog.get_logger(__name__)
INITIAL = "initial:"
"""Prefix of the sets' first metrics among the checkpoint's counters."""
INITIAL_FIRST_TURN = "initial_first_turn_accuracy"


class EvaluationLog:
    def __init__(self, run_dir: Path, counters: dict[str, float]) -> None:
        self.initial_accuracy: float | None = counters.get("initial_accuracy")
        self.initial_sets = {k[len(INITIAL) :]: v for k, v in counters.items() if k.startswith(INITIAL)}
        self.final_accuracy: float | None = None
        self.final_sets: dict[str, float] = {}
        self.first_turn_accuracy: float | None = None
        """Episodes: the latest evaluation's accuracy at the model's first turn."""
        first_turn = counters.get(INITIAL_FIRST_TURN)
        self.first_turn_accuracies: list[float | None] = [] if first_turn is None else [first_turn]
        """The evaluations' first-turn accuracies, the one before RL first (kept by a resume)."""
        self.samples_log = (run_dir / SAMPLES_LOG).open("a")

    def own(self, step: int, result: Evaluation, before_rl: bool = False) -> dict[str, float]:
        """The trainer's own evaluation at `step` (`before_rl`: the run's first): its fields for
        the step's metrics record."""
        log.info("samples", step=step, accuracy=result.accuracy, samples=result.samples)
        self._write({"step": step, "accuracy": result.accuracy, "samples": result.samples})
        fields = _fields(result.accuracy, result.first_turn_accuracy, result.sets)
        self._latest(fields)
        if before_rl:
            self.initial_accuracy = result.accuracy
            self.initial_sets = dict(self.final_sets)
        return fields

    def shared(self, record: dict[str, Any], held_out: HeldOut) -> None:
        """A shared evaluation into this step's `record`."""
        self._write(held_out.into_record(record))
        self._latest(_fields(held_out.accuracy, held_out.first_turn_accuracy, held_out.sets))

    def resumed(self) -> None:
        """The latest evaluation of a resumed run, until it makes one: the first."""
        self.final_accuracy = self.initial_accuracy
        self.final_sets = dict(self.initial_sets)

    def _latest(self, fields: dict[str, float]) -> None:
        self.final_accuracy = fields["held_out_accuracy"]
        self.final_sets = {k: v for k, v in fields.items() if k.startswith(SET_PREFIX)}
        self.first_turn_accuracy = fields.get("held_out_first_turn_accuracy")
        self.first_turn_accuracies.append(self.first_turn_accuracy)

    def counters(self) -> dict[str, float]:
        """What a checkpoint keeps: the evaluation before RL."""
        if self.initial_accuracy is None:
            return {}
        kept = {"initial_accuracy": self.initial_accuracy}
        if self.first_turn_accuracies and self.first_turn_accuracies[0] is not None:
            kept[INITIAL_FIRST_TURN] = self.first_turn_accuracies[0]
        return kept | {INITIAL + k: v for k, v in self.initial_sets.items()}

    def summary(self) -> dict[str, Any]:
        """The run summary's evaluation fields."""
        out: dict[str, Any] = {
            "initial_accuracy": self.initial_accuracy,
            "final_accuracy": self.final_accuracy,
        }
        if self.first_turn_accuracy is not None:
            out["initial_first_turn_accuracy"] = self.first_turn_accuracies[0]
            out["final_first_turn_accuracy"] = self.first_turn_accuracy
        if self.final_sets:
            out["initial_evaluations"] = self.initial_sets
            out["final_evaluations"] = self.final_sets
        return out

    def _write(self, entry: dict[str, Any]) -> None:
        self.samples_log.write(json.dumps(entry) + "\n")
        self.samples_log.flush()

    def close(self) -> None:
        self.samples_log.close()


def _fields(accuracy: float, first_turn: float | None, sets: dict[str, SetSums]) -> dict[str, float]:
    """An evaluation's fields in a metrics record."""
    fields = {"held_out_accuracy": accuracy} | set_metrics(sets)
    if first_turn is not None:
        fields["held_out_first_turn_accuracy"] = first_turn
    return fields
