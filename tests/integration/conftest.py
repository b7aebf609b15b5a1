"""The demo's warm start, made once per test session and shared by the runs that learn."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "tiny.yaml")


@pytest.fixture(scope="session")
def tiny_warm_start(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`llamarl sft configs/tiny.yaml`: the demo's supervised warm start (its 200 steps, as a run
    does them before RL), written once as a checkpoint that learning runs start from
    (`model.path`, `trainer.sft_steps: 0`) instead of each repeating it. Under pytest-xdist the
    workers share one session directory and take turns on a lock: the first makes it."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out = shared / "tiny-warm-start"
    with open(shared / "tiny-warm-start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (out / "config.json").exists():
            done = subprocess.run(
                [sys.executable, "-m", "workers.cli", "sft", TINY, "--out", str(out)],
                capture_output=True, text=True, timeout=1200,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr[-3000:]
    return out
