"""Per-step metrics: RUN_DIR/metrics.jsonl, one JSON object a step (always written), and the
sinks `logging` adds beside it (TensorBoard, Weights & Biases: llamarl/observe/metric_sinks.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol


class MetricSink(Protocol):
    def write(self, record: dict[str, Any]) -> None:
        """One step's record (its `step` field says which)."""
        ...

    def close(self) -> None: ...


class JsonlSink:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class MetricsWriter:
    """Every step's record to each sink, in order."""

    def __init__(self, sinks: Sequence[MetricSink]) -> None:
        self.sinks = list(sinks)

    def write(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.write(record)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
