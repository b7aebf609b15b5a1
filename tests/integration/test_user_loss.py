"""A user's own loss and advantage, named by `module:function`, train the demo: `llamarl run
--mode sync` of the small run config with the example's CISPO loss and advantage
(examples/own_algorithm.py, through counting wrappers in tests/user_losses.py), a reward that
differs between samples so every step has a gradient. The run exits 0, every step is an
optimizer step with a finite, non-zero gradient, and the user's functions are what computed
each step's loss and advantages (the wrappers note every call with its input's shape)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.integration.async_helpers import write_config
from tests.user_losses import CALLS

REPO = Path(__file__).resolve().parents[2]
NUM_STEPS = 4
PROBE_LOSS, PROBE_ADVANTAGE = "loss (2, 3)", "advantage (2, 4)"
"""What the check before the run calls each with (`llamarl.algorithms.user`)."""


def test_a_user_loss_and_advantage_by_module_function_train_the_demo(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        "user-loss",
        trainer={"num_steps": NUM_STEPS, "eval_every": NUM_STEPS},
        task={"reward": "tests.user_rewards:digit_share"},
        algorithm={
            "loss": "tests.user_losses:counted_cispo",
            "advantage": "tests.user_losses:counted_advantages",
        },
    )
    calls = tmp_path / "calls"
    # As a user runs it from their project: their modules on PYTHONPATH.
    env = {**os.environ, "PYTHONPATH": str(REPO), CALLS: str(calls)}
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "run", str(config), "--mode", "sync"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "user-loss" / "metrics.jsonl").open()]
    steps = [step for step in steps if "loss" in step]
    assert [step["step"] for step in steps] == list(range(1, NUM_STEPS + 1))
    for step in steps:
        assert step["skipped_update"] == 0 and math.isfinite(step["loss"])
        assert math.isfinite(step["grad_norm"]) and step["grad_norm"] > 0
    noted = Counter(calls.read_text().splitlines())
    checks = noted[PROBE_ADVANTAGE]
    assert checks >= 1 and noted[PROBE_LOSS] >= checks, "checked before the run (and trainer)"
    assert noted["advantage (4, 2)"] == NUM_STEPS, "each step's 4 groups of 2"
    losses = sum(n for line, n in noted.items() if line.startswith("loss "))
    assert losses >= checks + NUM_STEPS, "every step's micro-batches"
