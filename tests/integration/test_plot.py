"""`llamarl plot` draws real figures from real run directories, several runs overlaid."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image

from llamarl.config import parse_config
from llamarl.errors import ConfigError
from llamarl.launch.sync_run import run_sync
from llamarl.observe.plot import plot
from llamarl.roles import runtime
from llamarl.roles import trainer as trainer_module

MODEL = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32, "max_position_embeddings": 32}


def _run(run_dir: Path, seed: int) -> Path:
    run_sync(
        parse_config(
            {
                "run_id": f"plot{seed}",
                "run_dir": str(run_dir),
                "seed": seed,
                "model": MODEL,
                "task": {"kind": "arithmetic", "num_digits": 1, "num_eval": 4},
                "generation": {"num_samples": 2, "max_new_tokens": 3, "min_new_tokens": 3},
                "trainer": {"prompts_per_step": 2, "num_steps": 4, "eval_every": 2, "sft_steps": 0},
            }
        )
    )
    return run_dir


def test_plot_writes_png_figures_with_content_for_overlaid_runs(tmp_path: Path) -> None:
    runs = [_run(tmp_path / "a", 0), _run(tmp_path / "b", 1)]
    written = plot(runs, tmp_path / "plots")
    assert [p.name for p in written] == ["learning.png", "mismatch.png", "staleness.png", "roles.png", "timeline.png"]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        pixels = image.imread(path)
        assert pixels.shape[0] > 200 and pixels.shape[1] > 400
        assert float(np.std(pixels)) > 0.01, f"{path.name} is blank"


def test_a_sync_runs_roles_take_turns_on_the_timeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Unmerged spans: a merged one may cover another role's short span in its gap. One process
    # runs the roles in turn, so each span closes before the next role's opens, whatever the
    # machine's speed or load (what the run loop guarantees, not a tolerance on seconds).
    monkeypatch.setattr(runtime, "SPAN_MERGE_S", 0.0)
    run = _run(tmp_path / "sync", 0)
    spans = {
        w: json.loads((run / "timers" / f"{w}.json").read_text())["busy_spans"]
        for w in ("trainer", "generator-0", "reward-0")
    }
    assert all(spans.values()), spans
    for first, second in itertools.combinations(spans, 2):
        for a_start, a_end in spans[first]:
            for b_start, b_end in spans[second]:
                assert a_end <= b_start or b_end <= a_start, (
                    f"{first} {a_start}-{a_end} and {second} {b_start}-{b_end} overlap"
                )


def test_plot_of_a_directory_that_is_not_a_run_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no metrics.jsonl"):
        plot([tmp_path], tmp_path / "plots")


def test_plot_shows_a_runs_episodes_turn_by_turn(tmp_path: Path) -> None:
    """A sync run of two-turn episodes whose environment raises on every third prompt: those
    groups are refused (ended skipped) and the run goes on; episodes.md shows each held-out
    episode's turns, who wrote them, how it ended and its reward."""
    summary = run_sync(
        parse_config(
            {
                "run_id": "plot-episodes",
                "run_dir": str(tmp_path / "episodes"),
                "model": MODEL,
                "task": {"kind": "arithmetic", "num_digits": 1, "num_eval": 4},
                "environment": {"kind": "tests.episode_envs:RaisingEnv", "max_turns": 2, "max_tokens": 12},
                "generation": {"num_samples": 2, "max_new_tokens": 3},
                "trainer": {"prompts_per_step": 2, "num_steps": 4, "eval_every": 2, "sft_steps": 0},
            }
        )
    )
    assert summary["steps"] == 4
    trained = [json.loads(line) for line in (tmp_path / "episodes" / "trained.jsonl").open()]
    assert len(trained) == 8 and all(entry["ticket_id"] % 3 for entry in trained)
    trainer = json.loads((tmp_path / "episodes" / "timers" / "trainer.json").read_text())
    assert trainer["groups_env_error"] >= 2  # tickets 0 and 3 at least
    written = plot([tmp_path / "episodes"], tmp_path / "plots")
    assert written[-1].name == "episodes.md"
    page = written[-1].read_text()
    assert "| 2 | tool | = 7  |" in page and "| 1 | model |" in page
    assert "ended: env_error" in page and "ended: done" in page


def test_an_environment_that_always_raises_ends_the_run_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trainer_module, "ENV_FAILURES_IN_A_ROW", 3)
    config = parse_config(
        {
            "run_id": "broken-env",
            "run_dir": str(tmp_path / "broken"),
            "model": MODEL,
            "task": {"kind": "arithmetic", "num_digits": 1, "num_eval": 2},
            "environment": {"kind": "tests.episode_envs:AlwaysRaisingEnv", "max_tokens": 12},
            "generation": {"num_samples": 2, "max_new_tokens": 3},
            "trainer": {"prompts_per_step": 2, "num_steps": 2, "eval_every": 2, "sft_steps": 0},
        }
    )
    with pytest.raises(
        ConfigError,
        match="AlwaysRaisingEnv: it raised in 3 episode groups in a row .the last: RuntimeError: always broken",
    ):
        run_sync(config)
