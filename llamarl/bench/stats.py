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
