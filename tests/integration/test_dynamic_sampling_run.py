"""Dynamic sampling in an async `llamarl run` (real Redis, broker, two generators): groups with no
signal are skipped and replaced through Redis's gate, the run finishes, and its ledger balances
with the skipped tickets counted apart."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.integration.async_helpers import (
    check_finished_run,
    launch,
    metrics_records,
    write_config,
)

HALF_FLAT = """
def score(completion, answer):
    # Even sums: one reward for every completion (no signal); odd sums: by completion length.
    return 0.5 if int(answer) % 2 == 0 else float(len(completion) % 2)
"""


def test_an_async_run_skips_groups_without_signal_and_its_ledger_balances(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "half_flat.py").write_text(HALF_FLAT)
    paths = [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))  # the reward worker imports it
    config = write_config(
        tmp_path,
        "dapo",
        task={"reward": "half_flat:score"},
        trainer={"num_steps": 6, "eval_every": 6},
        sampling={"dynamic_sampling": True, "max_draws_factor": 2},
    )
    proc = launch(config)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    steps, per_step = 6, 4
    check_finished_run(summary, tmp_path / "dapo", steps * per_step, k=1)
    skipped = [r["groups_skipped"] for r in metrics_records(tmp_path / "dapo")]
    assert all(0 <= n <= per_step for n in skipped), skipped  # (2 - 1) x 4 a step at most
    assert summary["ledger"]["skipped"] == sum(skipped) > 0, "every skip counted in its step"
