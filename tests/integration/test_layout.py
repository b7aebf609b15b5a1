"""`workers.layout` end to end: auto profiles the config (cached by config and machine; the
cache's reuse is covered by tests/unit/test_profile_cache.py), prints its choice and starts it;
colocated runs generator and trainer in turn on every core."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.integration.async_helpers import write_config

STEPS = 4


def _run(config: Path, env: dict[str, str], *overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", "run", str(config), *overrides],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip


def test_auto_profiles_once_prints_its_choice_and_starts_it(tmp_path: Path) -> None:
    config = write_config(tmp_path, "auto", trainer={"num_steps": STEPS, "eval_every": STEPS},
                          workers={"num_generators": 1, "heartbeat_s": 0.5})  # fmt: skip
    env = os.environ | {"LLAMARL_CACHE_DIR": str(tmp_path / "cache")}
    done = _run(config, env, "workers.layout=auto")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "layout auto: best " in done.stderr
    laid = json.loads((tmp_path / "auto" / "layout.json").read_text())
    prediction = laid["prediction"]
    assert prediction["profile_cached"] is False
    chosen = prediction["chosen"]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["steps"] == STEPS
    if laid["kind"] == "lockstep":  # no layout predicted faster than the sync loop
        assert summary["mode"] == "sync"
    else:
        assert laid["kind"] == ("colocated" if chosen["colocated"] else "split")
        assert (laid["trainer_threads"], laid["max_staleness"]) == (
            chosen["trainer_threads"], chosen["max_staleness"])  # fmt: skip
        assert summary["ledger"]["trained"] == summary["ledger"]["issued"]
    profile = Path(prediction["profile"])  # cached by config and machine, under the cache dir
    assert profile.parent == tmp_path / "cache" / "profiles" and profile.is_file()


def test_colocated_takes_turns_on_every_core(tmp_path: Path) -> None:
    config = write_config(tmp_path, "colocated",
                          trainer={"num_steps": STEPS, "eval_every": STEPS},
                          staleness={"max_staleness": 2})  # fmt: skip
    done = _run(config, dict(os.environ), "workers.layout=colocated")
    assert done.returncode == 0, done.stderr[-3000:]
    laid = json.loads((tmp_path / "colocated" / "layout.json").read_text())
    cores = len(os.sched_getaffinity(0))
    assert (laid["kind"], laid["num_generators"], laid["max_staleness"]) == ("colocated", 1, 0)
    assert laid["trainer_threads"] == laid["generator_threads"] == cores
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["max_staleness"] == 0, "in turn: every group from the newest version"
    assert summary["ledger"]["trained"] == summary["ledger"]["issued"] == STEPS * 4
    assert set(summary["exit_codes"]) == {"trainer", "generator-0", "reward-0"}
