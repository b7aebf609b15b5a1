"""The optional metric sinks write what the trainer logs: TensorBoard event files read back with
TensorBoard's own reader, and a W&B offline run directory (no network), carried on by a resume."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from llamarl.config import parse_config
from llamarl.errors import ConfigError
from llamarl.launch.local import preflight
from llamarl.observe.metric_sinks import WANDB_ID_FILE, check_sinks, make_metrics

RECORDS = [{"step": s, "reward_mean": s / 10, "policy_version": s, "note": "text"} for s in (1, 2, 3)]


def test_tensorboard_gets_every_numeric_metric_at_its_step(tmp_path: Path) -> None:
    config = parse_config({"run_dir": str(tmp_path), "logging": {"tensorboard": True}})
    metrics = make_metrics(config)
    for record in RECORDS:
        metrics.write(record)
    metrics.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["policy_version", "reward_mean"]
    scalars = [(e.step, round(e.value, 6)) for e in events.Scalars("reward_mean")]
    assert scalars == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3, "jsonl stays"


def test_wandb_offline_writes_a_local_run_that_a_resume_continues(tmp_path: Path) -> None:
    config = parse_config(
        {"run_id": "sinks", "run_dir": str(tmp_path), "logging": {"wandb": "offline", "wandb_project": "test"}}
    )
    started = 0
    for records in (RECORDS[:2], RECORDS[2:]):  # a run, then its resume
        # wandb names an offline run's directory by the second it starts: a resume in the same
        # second as its run would share the directory, so it starts in the next second.
        while int(time.time()) <= started:
            time.sleep(0.01)
        metrics = make_metrics(config)
        started = int(time.time())  # at or after the second its directory is named by
        for record in records:
            metrics.write(record)
        metrics.close()
    run_id = (tmp_path / WANDB_ID_FILE).read_text().strip()
    runs = sorted((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(runs) == 2, "both parts logged under the one W&B run id"
    assert all(next(run.glob("*.wandb")).stat().st_size > 0 for run in runs)


def test_a_sink_without_its_package_is_refused_before_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    config = parse_config({"run_dir": str(tmp_path), "logging": {"wandb": "offline"}})
    message = "logging.wandb: the wandb package is not installed; pip install 'llamarl[wandb]'"
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        preflight(config, "sync")
    check_sinks(parse_config({"logging": {"tensorboard": True}}).logging)  # installed: no error
