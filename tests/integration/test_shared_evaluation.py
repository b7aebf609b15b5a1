"""An async run's evaluation, shared in chunks between the trainer and its generators, is the
greedy accuracy of the one version it names: on the demo from its warm start, the held-out
accuracy recorded for step 6 equals a direct evaluation of the checkpoint of step 6 (whose
weights are version 6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from llamarl.config import load_config
from llamarl.roles.build import checkpoint_store, held_out_evaluation
from tests.conftest import TINY
from tests.integration.async_helpers import launch, metrics_records

pytestmark = pytest.mark.long  # a whole run of a minute or more: `make test-long`


def test_a_shared_evaluation_equals_a_direct_evaluation_of_its_version(tmp_path: Path, tiny_warm_start: Path) -> None:
    tree = yaml.safe_load(Path(TINY).read_text())
    tree["run_id"], tree["run_dir"] = "shared", str(tmp_path / "shared")
    tree["model"]["path"] = str(tiny_warm_start)
    tree["task"]["num_eval"] = 250  # three chunks: 100, 100, 50
    tree["trainer"] |= {"num_steps": 12, "eval_every": 6, "sft_steps": 0}
    tree["trainer"] |= {"checkpoint_every": 6, "keep_checkpoints": 5}
    config_path = tmp_path / "shared.yaml"
    config_path.write_text(yaml.safe_dump(tree))
    proc = launch(config_path)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    run_dir = tmp_path / "shared"
    (shared,) = [r for r in metrics_records(run_dir) if "eval_step" in r]
    assert (shared["eval_step"], shared["eval_version"]) == (6, 6)
    assert shared["eval_wall_s"] > 0
    logged = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    (entry,) = [e for e in logged if "evaluated_by" in e]
    assert "trainer" in entry["evaluated_by"].split(","), entry["evaluated_by"]

    config = load_config(config_path)
    checkpoints = checkpoint_store(config)
    direct = held_out_evaluation(config, checkpoints.policy_of(checkpoints.target(6)))()
    assert 0.1 < direct.accuracy < 1.0, "a version that gets some right and some wrong"
    assert shared["held_out_accuracy"] == direct.accuracy
