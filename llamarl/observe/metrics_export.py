"""Prometheus export of one worker's counters (`llamarl worker ROLE --metrics-port PORT`).

Read at scrape time from the worker's RoleRuntime: every counter the role keeps (scored groups,
generated tokens, seconds spent syncing, claiming, training...), its busy and idle seconds and its
bus time, each as a gauge `llamarl_<name>` labelled with the run, role and worker id.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric

from llamarl.errors import ConfigError
from llamarl.roles.runtime import RoleRuntime

LABELS = ["run_id", "role", "worker_id"]


def metric_name(counter: str) -> str:
    return "llamarl_" + re.sub(r"[^a-zA-Z0-9_]", "_", counter)


class RuntimeCollector:
    """The runtime's counters as they are at each scrape."""

    def __init__(self, runtime: RoleRuntime) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[Metric]:
        runtime = self.runtime
        values = {
            "busy_s": runtime.timer.busy_s,
            "idle_s": runtime.timer.idle_s,
            "bus_s": runtime.bus.busy_s,
            **dict(runtime.counters),
        }
        labels = [runtime.config.run_id, runtime.role, runtime.worker_id]
        for name, value in sorted(values.items()):
            family = GaugeMetricFamily(metric_name(name), f"worker counter {name}", labels=LABELS)
            family.add_metric(labels, float(value))
            yield family


def serve_metrics(runtime: RoleRuntime, port: int, host: str = "0.0.0.0") -> None:
    """Serve the runtime's counters at http://host:port/metrics from a daemon thread."""
    registry = CollectorRegistry()
    registry.register(RuntimeCollector(runtime))
    try:
        start_http_server(port, addr=host, registry=registry)
    except OSError as err:
        raise ConfigError(f"--metrics-port {port}: {err.strerror}; choose another port") from None
