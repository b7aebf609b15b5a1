"""`llamarl plot RUN_DIR... --out DIR`: PNG figures of one run or several overlaid (async against
sync, one seed against another), from the files every run writes.

- learning.png: reward (mean over the last SMOOTH steps) and held-out accuracy, against step and
  against RL wall time (seconds since RL started, warm start excluded);
- mismatch.png: each step's behaviour log-probs against the trainer's recomputation (mean and
  max |Δ|, KL estimate): the generator's engine and the staleness of what it trains on;
- staleness.png: how many trained groups had each staleness (RUN_DIR/trained.jsonl);
- roles.png: busy and idle seconds of every worker (RUN_DIR/timers/);
- timeline.png: when each worker was busy, against seconds since the run's first busy span
  (async runs overlap their roles; a sync run's roles take turns);
- evaluations.png (runs with `evaluation.sets`): each set's greedy accuracy, pass@k and mean@n
  against the step evaluated;
- episodes.md (runs with an environment): held-out episodes turn by turn, at the first and the
  last evaluation (`llamarl.observe.episodes_view`); learning.png then also draws the accuracy
  at the model's first turn (dashed).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure  # the object API: files only, no display or pyplot state

from llamarl.errors import ConfigError
from llamarl.observe.episodes_view import write_episodes

SMOOTH = 10
FIGURES = ("learning.png", "mismatch.png", "staleness.png", "roles.png", "timeline.png")
MISMATCH = (
    ("mismatch_abs_mean", "mean |Δ log-prob|"),
    ("mismatch_abs_max", "max |Δ log-prob|"),
    ("mismatch_kl", "KL estimate"),
)
"""The trainer-versus-generator log-prob figures of each step, and their axis labels."""


def _rolling_mean(values: list[float]) -> list[float]:
    return [sum(values[max(0, i - SMOOTH + 1) : i + 1]) / min(i + 1, SMOOTH) for i in range(len(values))]


@dataclass(frozen=True)
class Run:
    name: str
    records: list[dict[str, Any]]
    staleness: Counter[int]
    timers: dict[str, dict[str, Any]]


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def load_run(run_dir: Path) -> Run:
    records = _jsonl(run_dir / "metrics.jsonl")
    if not records:
        raise ConfigError(f"{run_dir}: no metrics.jsonl with a step in it; give a run directory")
    summary = run_dir / "summary.json"
    mode = json.loads(summary.read_text()).get("mode") if summary.exists() else None
    staleness = Counter(int(e["staleness"]) for e in _jsonl(run_dir / "trained.jsonl"))
    timers = {p.stem: json.loads(p.read_text()) for p in sorted((run_dir / "timers").glob("*.json"))}
    name = f"{run_dir.name} ({mode})" if mode else run_dir.name
    return Run(name, records, staleness, timers)


def _at(record: dict[str, Any], x: str) -> float:
    """Where an evaluation goes on the x axis: the step it evaluated (a generator's evaluation
    reaches the trainer's record some steps later), or the record's RL seconds."""
    return float(record.get("eval_step", record["step"]) if x == "step" else record.get(x, 0))


def _learning(runs: list[Run], out: Path) -> None:
    figure = Figure(figsize=(11, 8))
    axes = figure.subplots(2, 2, sharey="row")
    for run in runs:
        evaluated = [r for r in run.records if "held_out_accuracy" in r]
        for column, x in enumerate(("step", "rl_s")):
            rewards = _rolling_mean([r["reward_mean"] for r in run.records])
            axes[0][column].plot([r.get(x, 0) for r in run.records], rewards, label=run.name)
            axes[1][column].plot(
                [_at(r, x) for r in evaluated], [r["held_out_accuracy"] for r in evaluated], marker="o", label=run.name
            )
            first = [r for r in evaluated if "held_out_first_turn_accuracy" in r]
            if first:  # episodes: right at the first turn, against right by the last
                axes[1][column].plot(
                    [_at(r, x) for r in first],
                    [r["held_out_first_turn_accuracy"] for r in first],
                    linestyle="--",
                    marker=".",
                    label=f"{run.name}, first turn",
                )
    for row, quantity in enumerate((f"reward (mean of {SMOOTH} steps)", "held-out accuracy")):
        axes[row][0].set_ylabel(quantity)
        for column, x_label in enumerate(("step", "RL wall time, s")):
            axes[row][column].set_xlabel(x_label)
            axes[row][column].grid(alpha=0.3)
    axes[0][0].legend()
    figure.tight_layout()
    figure.savefig(out / "learning.png")


def _mismatch(runs: list[Run], out: Path) -> None:
    """mismatch.png: each step's behaviour log-probs (the generator's engine) against the
    trainer's recomputation on its tokens: mean and max |Δ| and the KL estimate."""
    figure = Figure(figsize=(7, 7))
    axes = figure.subplots(len(MISMATCH), 1, sharex=True)
    for axis, (key, label) in zip(axes, MISMATCH, strict=True):
        for run in runs:
            logged = [r for r in run.records if key in r]
            axis.plot([_at(r, "step") for r in logged], [r[key] for r in logged], label=run.name)
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(out / "mismatch.png")


def _evaluations(runs: list[Run], out: Path) -> Path | None:
    """evaluations.png: each named evaluation set's metrics against step (None: no sets)."""
    names = sorted({k for run in runs for r in run.records for k in r if k.startswith("eval/")})
    if not names:
        return None
    figure = Figure(figsize=(7, 1 + 2.5 * len(names)))
    axes = figure.subplots(len(names), 1, squeeze=False)
    for axis, name in zip(axes[:, 0], names, strict=True):
        for run in runs:
            evaluated = [r for r in run.records if name in r]
            steps = [_at(r, "step") for r in evaluated]
            axis.plot(steps, [r[name] for r in evaluated], marker="o", label=run.name)
        axis.set_ylabel(name[len("eval/") :])
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    axes[0][0].legend()
    figure.tight_layout()
    figure.savefig(out / "evaluations.png")
    return out / "evaluations.png"


def _staleness(runs: list[Run], out: Path) -> None:
    figure = Figure(figsize=(7, 4))
    axis = figure.subplots()
    width = 0.8 / len(runs)
    for index, run in enumerate(runs):
        lags = sorted(run.staleness)
        axis.bar(
            [lag + index * width for lag in lags], [run.staleness[lag] for lag in lags], width=width, label=run.name
        )
    axis.set_xlabel("staleness of a trained group (versions)")
    axis.set_ylabel("trained groups")
    axis.legend()
    figure.tight_layout()
    figure.savefig(out / "staleness.png")


def _roles(runs: list[Run], out: Path) -> None:
    bars = [
        (f"{run.name}: {worker}", timer["busy_s"], timer["idle_s"])
        for run in runs
        for worker, timer in run.timers.items()
    ]
    figure = Figure(figsize=(9, 1 + 0.4 * max(len(bars), 1)))
    axis = figure.subplots()
    labels = [label for label, _, _ in bars]
    busy = [b for _, b, _ in bars]
    axis.barh(labels, busy, label="busy")
    axis.barh(labels, [i for _, _, i in bars], left=busy, label="idle")
    axis.set_xlabel("seconds")
    axis.legend()
    figure.tight_layout()
    figure.savefig(out / "roles.png")


def _timeline(runs: list[Run], out: Path) -> None:
    rows: list[tuple[str, list[tuple[float, float]]]] = []
    for run in runs:
        spans = {worker: timer.get("busy_spans", []) for worker, timer in run.timers.items()}
        origin = min((s[0][0] for s in spans.values() if s), default=0.0)
        for worker, busy in spans.items():
            rows.append((f"{run.name}: {worker}", [(a - origin, b - a) for a, b in busy]))
    figure = Figure(figsize=(11, 1 + 0.5 * max(len(rows), 1)))
    axis = figure.subplots()
    for row, (_, bars) in enumerate(rows):
        axis.broken_barh(bars, (row - 0.4, 0.8))
    axis.set_yticks(range(len(rows)), [label for label, _ in rows])
    axis.set_xlabel("seconds since the run's first busy span")
    axis.invert_yaxis()
    figure.tight_layout()
    figure.savefig(out / "timeline.png")


def plot(run_dirs: list[Path], out: Path) -> list[Path]:
    """Write the figures of these runs into `out`; the files written."""
    runs = [load_run(run_dir) for run_dir in run_dirs]
    out.mkdir(parents=True, exist_ok=True)
    _learning(runs, out)
    _mismatch(runs, out)
    _staleness(runs, out)
    _roles(runs, out)
    _timeline(runs, out)
    extra = [_evaluations(runs, out), write_episodes(run_dirs, out)]
    return [out / name for name in FIGURES] + [path for path in extra if path is not None]
