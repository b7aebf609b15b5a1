"""`llamarl bench grid` keeps what it measured: the JSON so far is written after each shape, so a
shape that fails (its model not imported) leaves the shapes before it on disk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llamarl.bench import grid


def test_a_shape_that_fails_leaves_the_shapes_before_it_in_the_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def shape(name: str, config: str, pairs: int, work_dir: Path) -> dict[str, Any]:
        if name == "train_heavy":
            raise RuntimeError("profile of configs/bench_train_heavy.yaml failed")
        return {"config": config, "pairs": pairs}

    monkeypatch.setattr(grid, "shape", shape)
    monkeypatch.setenv("LLAMARL_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "grid.json"
    with pytest.raises(RuntimeError, match="bench_train_heavy"):
        grid.bench(["demo", "generation_heavy", "train_heavy", "variable_length"], 3, tmp_path / "work", out)
    kept = json.loads(out.read_text())
    assert list(kept["shapes"]) == ["demo", "generation_heavy"]
    assert kept["shapes"]["demo"] == {"config": grid.SHAPES["demo"], "pairs": 3} and kept["pairs"] == 3


def test_sync_and_the_default_swap_places_round_by_round(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine whose speed drifts within a round would favour whichever arm runs first: sync
    leads in even rounds, the default in odd ones; the alternative follows the default whose
    layout it is checked against."""
    order: list[str] = []

    def run(tree: dict[str, Any], mode: str, layout: str | None, name: str, work_dir: Path, warmup: int) -> dict:
        order.append(name)
        chosen = {"kind": "one_process", "num_generators": 0, "trainer_threads": 2, "generator_threads": 2}
        return {
            "s_per_step": 1.0,
            "generate_s": 0.5,
            "train_s": 0.5,
            "layout": chosen | {"max_staleness": 0, "prediction": None},
        }

    monkeypatch.setattr(grid, "_run", run)
    monkeypatch.setattr(grid, "profile_config", lambda config, fresh=False: 0.1)
    row = grid.shape("demo", grid.SHAPES["demo"], 4, tmp_path)
    assert order == [
        *("demo-sync-0", "demo-default-0", "demo-split-0"),
        *("demo-default-1", "demo-sync-1", "demo-split-1"),
        *("demo-sync-2", "demo-default-2", "demo-split-2"),
        *("demo-default-3", "demo-sync-3", "demo-split-3"),
    ]
    assert row["default_over_sync"]["median"] == 1.0
