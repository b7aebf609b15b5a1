"""Named evaluation sets in a run's metrics and summary, and `llamarl eval` on the saved run:
the same held-out accuracy and set metrics, exactly (greedy, and the seeded samples too)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from llamarl.config import parse_config
from llamarl.launch.sync_run import run_sync
from tests.integration.commands import LLAMARL

MODEL = {
    "hidden_size": 32,
    "num_layers": 1,
    "num_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 32,
}


def test_a_saved_runs_evaluation_is_reproduced_by_llamarl_eval(tmp_path: Path) -> None:
    sums = tmp_path / "sums.jsonl"
    sums.write_text(
        "".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n" for a in range(3) for b in range(7))
    )
    tree = {
        "run_id": "evaluated",
        "run_dir": str(tmp_path / "run"),
        "seed": 3,
        "model": MODEL,
        "task": {"kind": "arithmetic", "num_digits": 1, "num_eval": 12},
        "generation": {"num_samples": 2, "max_new_tokens": 3},
        "trainer": {
            "prompts_per_step": 2,
            "num_steps": 2,
            "eval_every": 2,
            "sft_steps": 40,
            "sft_lr": 3e-3,
        },
        "evaluation": {
            "sets": [
                {
                    "name": "sums",
                    "path": str(sums),
                    "num_samples": 4,
                    "pass_at": [1, 4],
                    "temperature": 1.0,
                }
            ]
        },
    }
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(tree))
    summary = run_sync(parse_config(tree))
    final = summary["final_evaluations"]
    assert set(final) == {
        "eval/sums/greedy",
        "eval/sums/pass@1",
        "eval/sums/pass@4",
        "eval/sums/mean@4",
    }
    assert set(summary["initial_evaluations"]) == set(final)
    assert final["eval/sums/pass@4"] >= final["eval/sums/pass@1"]
    assert final["eval/sums/pass@1"] == final["eval/sums/mean@4"], "0/1 rewards: pass@1 is mean@n"
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert {k: records[-1][k] for k in final} == final
    assert summary["final_accuracy"] > 0, "the warm start taught it some sums: a test that can fail"

    out = tmp_path / "eval.json"
    done = subprocess.run(
        [*LLAMARL, "eval", str(config_path), "--model", str(tmp_path / "run"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert json.loads(done.stdout) == result
    assert result["model"] == str(tmp_path / "run" / "model")
    assert result["held_out_accuracy"] == summary["final_accuracy"]
    assert result["held_out_prompts"] == 12
    assert {k: result[k] for k in final} == final

    missing = subprocess.run(
        [*LLAMARL, "eval", str(config_path), "--model", str(tmp_path / "nothing")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"config error: --model {tmp_path / 'nothing'}: neither a model directory (config.json) "
        "nor a run directory (model/ or checkpoints/); give one"
    ]
