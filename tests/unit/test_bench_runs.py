"""A bench's finished runs keep their records and lose their weights (`drop_weights`); a pair's
two runs alternate their order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llamarl.bench import async_vs_sync
from llamarl.bench.async_vs_sync import WEIGHTS, drop_weights


def test_a_finished_runs_weights_go_and_its_records_stay(tmp_path: Path) -> None:
    run_dir = tmp_path / "async-0"
    for name in WEIGHTS:
        (run_dir / name / "sub").mkdir(parents=True)
        (run_dir / name / "sub" / "model.safetensors").write_bytes(b"\0" * 64)
    records = ["metrics.jsonl", "summary.json", "timers/trainer.json", "logs/trainer.log", "layout.json"]
    for record in records:
        (run_dir / record).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / record).write_text("{}\n")

    drop_weights(run_dir)

    assert sorted(p.name for p in run_dir.iterdir()) == sorted({Path(r).parts[0] for r in records})
    assert all((run_dir / record).read_text() == "{}\n" for record in records)


def test_a_run_without_weights_is_left_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    drop_weights(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]


def test_the_two_runs_of_a_pair_swap_places_pair_by_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sync runs first in even pairs, async in odd ones: a machine whose speed drifts within a
    pair favours neither arm."""
    order: list[str] = []

    def run_once(tree: dict[str, Any], mode: str, name: str, work_dir: Path) -> str:
        order.append(name)
        return mode

    def describe(result: str, mode: str, target: float) -> dict[str, Any]:
        role = {"busy_s_per_step": 0.5, "bus_s_per_step": 0.0, "idle_fraction": 0.0, "processes": 1}
        return {
            "s_per_step": 1.0,
            "run_s_per_step": 1.0,
            "eval_s_per_step": 0.0,
            "trained_tokens": 8,
            "generated_tokens": 8,
            "discarded_tokens": 0,
            "initial_accuracy": 0.0,
            "final_accuracy": 0.0,
            "s_to_target": None,
            "roles": {"trainer": role},
        }

    config = tmp_path / "run.yaml"
    config.write_text("trainer: {num_steps: 2}\n")
    monkeypatch.setattr(async_vs_sync, "warm_start", lambda tree, work_dir: tree)
    monkeypatch.setattr(async_vs_sync, "run_once", run_once)
    monkeypatch.setattr(async_vs_sync, "describe", describe)
    monkeypatch.setattr(async_vs_sync, "solo_times", lambda tree, name, work_dir: {"generate": 0.5, "train": 0.5})
    result = async_vs_sync.bench(config, [0, 1, 2], 0.5, tmp_path / "work")
    assert order == ["sync-0", "async-0", "async-1", "sync-1", "sync-2", "async-2"]
    assert [pair["seed"] for pair in result["pairs"]] == [0, 1, 2] and result["speedup_median"] == 1.0
