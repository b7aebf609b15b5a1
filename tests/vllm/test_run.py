"""`llamarl run` with vLLM generators, end to end over Redis, the broker and real worker
processes, on a small model saved as a Hugging Face directory: a generator SIGKILLed mid-run has
its tickets reissued and the ledger balances; a sync run takes up every version (the float32
engine's log-probs stay the trainer's); an engine config vLLM cannot serve is one line, exit 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.integration.async_helpers import (
    check_reissued_run,
    launch,
    metrics_records,
    wait_for_steps,
    worker_pids,
    write_config,
)

STEPS = 8
VLLM = {"engine": "vllm", "vllm": {"dtype": "float32", "kv_cache_gb": 0.25}}


def _config(tmp_path: Path, run_id: str, model_dir: Path, **sections: dict) -> Path:
    return write_config(
        tmp_path,
        run_id,
        model={"path": str(model_dir)},
        generation={"num_samples": 2, "max_new_tokens": 4, "prompts_per_batch": 2, **VLLM},
        **sections,
    )


def test_a_killed_vllm_generator_has_its_tickets_reissued(tmp_path: Path, small_model_dir: Path) -> None:
    config = _config(
        tmp_path,
        "vllm-kill",
        small_model_dir,
        trainer={"num_steps": STEPS, "eval_every": STEPS},
        task={"num_eval": 4},
        staleness={"max_staleness": 1, "lease_s": 2.0},
        workers={"max_restarts": 1},
    )
    run_dir = tmp_path / "vllm-kill"
    proc = launch(config)
    try:
        wait_for_steps(run_dir, 2, proc, timeout_s=240)
        os.kill(worker_pids(proc.pid, "vllm-kill")["generator-0"], signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    check_reissued_run(proc, out, err, run_dir, STEPS * 4)
    generator = json.loads((run_dir / "timers" / "generator-1.json").read_text())
    assert generator["engine_load_s"] > 0 and generator["syncs"] >= 2


def test_a_sync_run_takes_up_every_version(tmp_path: Path, small_model_dir: Path) -> None:
    config = _config(
        tmp_path,
        "vllm-sync",
        small_model_dir,
        trainer={"num_steps": 4, "eval_every": 4, "lr": 3e-3},
        task={"num_eval": 4, "reward": "tests.user_rewards:digit_share"},
    )
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "run", str(config), "--mode", "sync"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = metrics_records(tmp_path / "vllm-sync")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(r["grad_norm"] > 0 for r in records), "no step moved the model"
    # On-policy in float32: were a version not loaded into vLLM, its samples' log-probs would
    # be an older model's, and this lr moves the model well past 1e-3 a step.
    assert all(r["mismatch_abs_mean"] < 1e-3 for r in records), records
    assert all(r["mismatch_abs_max"] >= r["mismatch_abs_mean"] for r in records)


def test_an_engine_config_vllm_cannot_serve_is_one_line(tmp_path: Path, small_model_dir: Path) -> None:
    config = _config(tmp_path, "vllm-bad", small_model_dir)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "workers.cli",
            "run",
            str(config),
            "generation.vllm.tensor_parallel_size=2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr[-2000:]
    assert lines == [
        "config error: generation.vllm.tensor_parallel_size: 2 needs CUDA GPUs; set it to 1 with generation.device: cpu"
    ]
