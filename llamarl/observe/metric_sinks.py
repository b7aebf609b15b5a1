"""Optional metric sinks next to metrics.jsonl: TensorBoard event files and Weights & Biases
(offline or online), chosen by the `logging` config section. Each needs its own package
(`llamarl[tensorboard]`, `llamarl[wandb]`); a run that asks for one that is not installed is
refused before it starts (`check_sinks`)."""

from __future__ import annotations

import importlib.util
import math
import os
import secrets
from pathlib import Path
from typing import Any

from llamarl.config import LoggingConfig, RunConfig
from llamarl.errors import ConfigError
from llamarl.observe.metrics import JsonlSink, MetricSink, MetricsWriter

WANDB_ID_FILE = "wandb-id"
"""RUN_DIR file holding the W&B run id, so a resumed run logs into the same W&B run."""


def numeric(record: dict[str, Any]) -> dict[str, float]:
    """The record's finite numbers (booleans and text left out), without `step`."""
    return {
        key: float(value)
        for key, value in record.items()
        if key != "step" and isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    }


class TensorBoardSink:
    def __init__(self, directory: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(directory), flush_secs=10)

    def write(self, record: dict[str, Any]) -> None:
        for key, value in numeric(record).items():
            self.writer.add_scalar(key, value, global_step=int(record["step"]))

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, config: RunConfig) -> None:
        import wandb

        run_dir = Path(config.run_dir)
        id_file = run_dir / WANDB_ID_FILE
        if not id_file.exists():
            id_file.write_text(secrets.token_hex(4))  # the form of a W&B run id
        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(
            mode="offline" if config.logging.wandb == "offline" else "online",
            project=config.logging.wandb_project,
            name=config.run_id,
            id=id_file.read_text().strip(),
            resume="allow",
            dir=str(run_dir),
            config=config.model_dump(mode="json"),
        )

    def write(self, record: dict[str, Any]) -> None:
        self.run.log(numeric(record), step=int(record["step"]))

    def close(self) -> None:
        self.run.finish()


def check_sinks(config: LoggingConfig) -> None:
    """ConfigError naming the field when a sink it asks for has no package installed."""
    wanted = {"tensorboard": config.tensorboard, "wandb": config.wandb != "off"}
    for name, on in wanted.items():
        if on and importlib.util.find_spec(name) is None:
            raise ConfigError(
                f"logging.{name}: the {name} package is not installed; pip install 'llamarl[{name}]' or switch it off"
            )


def make_metrics(config: RunConfig) -> MetricsWriter:
    """metrics.jsonl and the sinks `config.logging` asks for, under RUN_DIR."""
    check_sinks(config.logging)
    run_dir = Path(config.run_dir)
    sinks: list[MetricSink] = [JsonlSink(run_dir / "metrics.jsonl")]
    if config.logging.tensorboard:
        sinks.append(TensorBoardSink(run_dir / "tensorboard"))
    if config.logging.wandb != "off":
        sinks.append(WandbSink(config))
    return MetricsWriter(sinks)
