"""docs/benchmarks.md's layout grid from `llamarl bench grid`: each shape's layout, its step times
against sync's, and what holds and what does not."""

from __future__ import annotations

from typing import Any

from tables.figures import load, rounded, spread

NOT_SLOWER = 1.03
"""The default may take at most this many times sync's seconds per step on any shape (median)."""
WIN, WHERE_LIMIT = 1.3, 1.5
"""The speed-up asked of the default where the phase limit is at least WHERE_LIMIT."""
PREDICTION = 0.15
"""How far the simulator's prediction may be from the default's measured step."""

NAMES = {
    "demo": "demo (`tiny.yaml`)",
    "generation_heavy": "`bench_generation_heavy`",
    "train_heavy": "`bench_train_heavy`",
    "variable_length": "`bench_variable_length`",
    "smollm2_train_heavy": "`bench_smollm2_train_heavy`",
    "smollm2_generation_heavy": "`bench_smollm2_generation_heavy`",
}


def _layout(chosen: dict[str, Any]) -> str:
    if chosen["kind"] != "split":
        return f"{chosen['kind']} (taking turns)"
    return (
        f"{chosen['num_generators']} gen x {chosen['generator_threads']}, trainer {chosen['trainer_threads']}, "
        f"k={chosen['max_staleness']}"
    )


def _shapes(source: str) -> dict[str, dict[str, Any]]:
    shapes: dict[str, dict[str, Any]] = load(source)["shapes"]
    return shapes


def table(source: str = "grid.json") -> list[str]:
    """One row per shape: the chosen layout and every arm's seconds per step, median (min-max)."""
    lines = [
        "| shape | layout auto chose | sync s/step | default s/step | default / sync speed-up | phase limit "
        "| other layout / sync | predicted s/step (error) | profile s, fresh / cached |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, shape in _shapes(source).items():
        steps, other = shape["s_per_step"], "colocated" if shape["chosen"]["kind"] == "split" else "split"
        predicted = shape["predicted_s_per_step"]
        guess = f"{predicted:.3f} ({100 * shape['prediction_error']:+.0f}%)" if predicted else "none"
        profile = shape["profile_s"]
        lines.append(
            f"| {NAMES.get(name, name)} | {_layout(shape['chosen'])} | {spread(steps['sync'], 3, '')} "
            f"| {spread(steps['default'], 3, '')} | {spread(shape['default_over_sync'])} "
            f"| {spread(shape['phase_limit'])} | {other} {spread(shape['other_over_sync'])} | {guess} "
            f"| {profile['fresh_s']:.0f} / {profile['cached_s']:.1f} |"
        )
    return lines


def _names(shapes: dict[str, dict[str, Any]]) -> str:
    return ", ".join(NAMES.get(name, name) for name in shapes) or "none"


def verdicts(source: str = "grid.json") -> list[str]:
    """What holds and what does not, each claim computed from the grid's JSON."""
    shapes = _shapes(source)
    over = {name: shape["default_over_sync"] for name, shape in shapes.items()}
    slower = {name: f for name, f in over.items() if f["median"] < 1 / NOT_SLOWER}
    lowest = min(over, key=lambda name: over[name]["min"])
    asked = {name: s for name, s in shapes.items() if s["phase_limit"]["median"] >= WHERE_LIMIT}
    missed = {name: s for name, s in asked.items() if s["default_over_sync"]["median"] < WIN}
    errors = [s["prediction_error"] for s in shapes.values() if s["prediction_error"] is not None]
    fresh = sorted(s["profile_s"]["fresh_s"] for s in shapes.values())
    return [
        f"- **Never slower than sync** (at most {NOT_SLOWER}x sync's seconds per step, medians): "
        f"{'holds on every shape' if not slower else 'fails on ' + _names(slower)}. The medians of default over "
        f"sync run from {rounded(min(f['median'] for f in over.values()))}x to "
        f"{rounded(max(f['median'] for f in over.values()))}x; the lowest single round is "
        f"{rounded(over[lowest]['min'])}x, on {NAMES.get(lowest, lowest)}.",
        f"- **At least {WIN}x where the phase limit is at least {WHERE_LIMIT}**: asked of {_names(asked)}; "
        f"{'met on all of them' if not missed else 'not met on ' + _names(missed)}.",
        f"- **The chosen layout the fastest measured** (against the other kind of layout, within the rounds' "
        f"spread): on {sum(s['chose_fastest'] for s in shapes.values())} of {len(shapes)} shapes.",
        f"- **Predictions**: from {100 * min(errors):+.0f}% to {100 * max(errors):+.0f}% of the measured step "
        f"({'within' if max(map(abs, errors)) <= PREDICTION else 'not all within'} the {PREDICTION:.0%} asked).",
        f"- **Profile time**: {fresh[0]:.0f}-{fresh[-1]:.0f} s fresh, measured before each shape's runs.",
    ]
