"""Config validation: every shipped config loads; bad keys and values name the field, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llamarl.config import load_config, parse_config
from llamarl.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


def test_configs_directory_is_not_empty() -> None:
    assert len(CONFIGS) >= 2


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_loads(path: Path) -> None:
    config = load_config(path, environ={})
    assert config.run_id


def test_misspelt_key_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^trainer\.lrr: Extra inputs"):
        parse_config({"trainer": {"lrr": 0.1}}, environ={})


def test_out_of_range_value_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^generation\.top_p: Input should be less than"):
        parse_config({"generation": {"top_p": 1.5}}, environ={})


def test_env_overrides_apply_and_are_validated() -> None:
    env = {
        "LLAMARL_REDIS_URL": "redis://example:6380/1",
        "LLAMARL_BROKER": "10.0.0.5:7000",
        "LLAMARL__TRAINER__LR": "0.001",
    }
    config = parse_config({}, environ=env)
    assert config.redis.url == "redis://example:6380/1"
    assert (config.broker.host, config.broker.port) == ("10.0.0.5", 7000)
    assert config.trainer.lr == 0.001
    with pytest.raises(ConfigError, match=r"^trainer\.lr"):
        parse_config({}, environ={"LLAMARL__TRAINER__LR": "-1"})
    with pytest.raises(ConfigError, match="LLAMARL_BROKER"):
        parse_config({}, environ={"LLAMARL_BROKER": "nohostport"})


def _check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llamarl.cli", "config", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_config_check_prints_resolved_config() -> None:
    done = _check(REPO / "configs" / "tiny.yaml")
    assert done.returncode == 0, done.stderr
    assert "run_id: tiny" in done.stdout and "max_staleness: 1" in done.stdout


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("trainer:\n  lrr: 0.1\n", "trainer.lrr"),
        ("staleness:\n  max_staleness: -1\n", "staleness.max_staleness"),
    ],
)
def test_config_check_bad_file_exits_2_with_one_line(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    done = _check(path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"config error: {field}:")


def test_worked_answers_with_a_whole_answer_verifier_are_refused() -> None:
    with pytest.raises(ConfigError, match="task: Value error, verifier exact_int .* use final_int"):
        parse_config({"task": {"show_work": True}})
    assert parse_config({"task": {"show_work": True, "verifier": "final_int"}}).task.show_work
