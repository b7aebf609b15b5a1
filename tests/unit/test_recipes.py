"""Recipes and includes (`llamarl.config.recipes`, `config.run.read_tree`): each preset file in
configs/recipes is the demo with its algorithm options; what a config or an override sets wins
over the preset; `--recipe` reaches the config; an unknown recipe and an include cycle are
refused in one line with exit code 2 before anything starts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llamarl.config import load_config, parse_config
from llamarl.config.recipes import RECIPES

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_each_recipe_file_is_the_demo_with_its_preset(name: str) -> None:
    config = load_config(REPO / "configs" / "recipes" / f"{name}.yaml", environ={})
    demo = load_config(REPO / "configs" / "tiny.yaml", environ={})
    assert config.recipe == name
    for field, value in RECIPES[name]["algorithm"].items():
        assert getattr(config.algorithm, field) == value, field
    if name == "dapo":
        assert config.sampling.dynamic_sampling and config.sampling.overlong == "off"
    assert config.run_id != demo.run_id and config.run_dir != demo.run_dir
    assert config.model == demo.model and config.trainer == demo.trainer
    assert config.generation == demo.generation and config.task == demo.task
    assert config.algorithm != demo.algorithm


def test_the_config_and_its_overrides_win_over_the_preset() -> None:
    tree = {"recipe": "dapo", "algorithm": {"clip_high": 1.5}}
    config = parse_config(tree, environ={"LLAMARL__ALGORITHM__CLIP_LOW": "0.7"})
    assert (config.algorithm.loss, config.algorithm.clip_low, config.algorithm.clip_high) == ("ppo_clip", 0.7, 1.5)
    assert parse_config({"recipe": "dapo"}, environ={}).algorithm.clip_high == 1.28
    # The resolved config (as a run writes it for its workers) parses to itself.
    config = parse_config({"recipe": "gspo"}, environ={})
    assert parse_config(config.model_dump(mode="json"), environ={}) == config


def test_the_recipe_option_and_override_reach_the_config(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.cli import main

    monkeypatch.setattr(os, "environ", dict(os.environ))
    tiny = str(REPO / "configs" / "tiny.yaml")
    assert main(["config", "check", tiny, "recipe=dr_grpo"]) == 0
    assert "grpo_scale_by_std: false" in capsys.readouterr().out
    # `run --recipe dapo` lays DAPO's clip range under the config: with aipo asked for on top,
    # the run is refused before anything starts, naming the fields (without the recipe, only the
    # bad num_steps would be named).
    args = ["--mode", "sync", "algorithm.loss=aipo", "trainer.num_steps=0"]
    assert main(["run", tiny, "--recipe", "dapo", *args]) == 2
    assert "the clip range is ppo_clip's, not aipo's" in capsys.readouterr().err
    assert main(["config", "check", tiny, "recipe=nope"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("config error: recipe: unknown 'nope'; use one")


def test_an_include_cycle_and_a_missing_include_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workers.cli import main

    (tmp_path / "a.yaml").write_text("include: b.yaml\nrun_id: a\n")
    (tmp_path / "b.yaml").write_text("include: a.yaml\n")
    (tmp_path / "c.yaml").write_text("include: missing.yaml\n")
    for name, message in [("a", "closes a cycle of includes"), ("c", "missing.yaml: cannot read")]:
        assert main(["config", "check", str(tmp_path / f"{name}.yaml")]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], lines
