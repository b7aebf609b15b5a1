"""How a figure is read from docs/results and written on a page: rounding as a person rounds, a
median with its min-max, and the spread of one key over a bench's pairs."""

from __future__ import annotations

import json
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "results"


def load(name: str) -> dict[str, Any]:
    """The JSON a bench wrote with `--out`, committed as docs/results/`name`."""
    result: dict[str, Any] = json.loads((RESULTS / name).read_text())
    return result


def rounded(value: float, digits: int = 2) -> str:
    """`value` to `digits` decimals, halves up as a person rounds (1.255 -> 1.26)."""
    step = Decimal(1).scaleb(-digits)
    return str(Decimal(str(value)).quantize(step, rounding=ROUND_HALF_UP))


def spread(figure: dict[str, float], digits: int = 2, unit: str = "x") -> str:
    """A median with its min-max, as the docs write them."""
    median, low, high = (rounded(figure[key], digits) for key in ("median", "min", "max"))
    return f"{median}{unit} ({low}-{high})"


def of(values: list[float]) -> dict[str, float]:
    """The median (the middle value; the upper of the two middles) and the min-max of `values`."""
    ordered = sorted(values)
    return {"median": ordered[len(ordered) // 2], "min": ordered[0], "max": ordered[-1]}


def per_pair(result: dict[str, Any], mode: str, key: str) -> dict[str, float]:
    """The spread of `key` of one mode over an async-vs-sync bench's pairs."""
    return of([pair[mode][key] for pair in result["pairs"]])


def thousands(value: float) -> str:
    """A count with thousands separated, as the docs write them (422,400)."""
    return f"{round(value):,}"


def counted(figure: dict[str, float]) -> str:
    """A median count with its min-max, thousands separated (82,214 (73,205-86,637))."""
    median, low, high = (thousands(figure[key]) for key in ("median", "min", "max"))
    return f"{median} ({low}-{high})"
