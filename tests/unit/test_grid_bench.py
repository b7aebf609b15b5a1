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
