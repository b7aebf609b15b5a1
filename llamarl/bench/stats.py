"""Small summaries the benchmarks report: median with min and max of repeated measurements."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def spread(values: Sequence[float], digits: int = 3) -> dict[str, float]:
    """{median, min, max} of the measurements, rounded."""
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


def median(values: Sequence[float | None]) -> float | None:
    """The median of the values that exist; None when none does."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def median_time(values: Sequence[float | None]) -> float | None:
    """The median of times to reach something, where None means never reached (longer than any
    time); None when the median run never reached it."""
    ordered = sorted(values, key=lambda v: float("inf") if v is None else v)
    middle = len(ordered) // 2
    halves = ordered[middle : middle + 1] if len(ordered) % 2 else ordered[middle - 1 : middle + 1]
    if not halves or any(v is None for v in halves):
        return None
    return statistics.mean(v for v in halves if v is not None)
