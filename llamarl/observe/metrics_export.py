"""Prometheus export of one worker's counters (`llamarl worker ROLE --metrics-port PORT`).

Read at scrape time through the function the worker hands in (its RoleRuntime's `gauges`: every
counter the role keeps, such as scored groups, generated tokens, seconds spent syncing, claiming,
training..., its busy and idle seconds and its bus time), each as a gauge `llamarl_<name>`
labelled with the run, role and worker id. It knows nothing of the roles, so `observe` stays below
them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric

from llamarl.errors import ConfigError

Gauges = Callable[[], Mapping[str, float]]
"""Each value's name to the value, as it is at the call."""


def metric_name(counter: str) -> str:
    return "llamarl_" + re.sub(r"[^a-zA-Z0-9_]", "_", counter)


class GaugeCollector:
    """The values `read` returns at each scrape, each labelled with `labels` (run_id, role,
    worker_id)."""

    def __init__(self, read: Gauges, labels: Mapping[str, str]) -> None:
        self.read = read
        self.labels = dict(labels)

    def collect(self) -> Iterator[Metric]:
        names, values = list(self.labels), list(self.labels.values())
        for name, value in sorted(self.read().items()):
            family = GaugeMetricFamily(metric_name(name), f"worker counter {name}", labels=names)
            family.add_metric(values, float(value))
            yield family


def serve_metrics(read: Gauges, labels: Mapping[str, str], port: int, host: str = "0.0.0.0") -> None:
    """Serve what `read` returns at http://host:port/metrics from a daemon thread."""
    registry = CollectorRegistry()
    registry.register(GaugeCollector(read, labels))
    try:
        start_http_server(port, addr=host, registry=registry)
    except OSError as err:
        raise ConfigError(f"--metrics-port {port}: {err.strerror}; choose another port") from None
