"""`llamarl run` in async mode with real Redis, broker, workers and weight sync."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from llamarl.curve import generate_keys
from llamarl.launch import supervise
from tests.integration.async_helpers import (
    check_finished_run,
    check_resumed_run,
    first_ports_taken,
    launch,
    metrics_records,
    wait_for_steps,
    worker_pids,
    write_config,
)


@pytest.mark.parametrize(
    ("max_staleness", "transport", "curve"),
    [(0, "shm", False), (1, "gloo", True), (2, "shm", False)],
)
def test_staleness_bound_and_balanced_ledger(tmp_path: Path, max_staleness: int, transport: str, curve: bool) -> None:
    """With CURVE on (k=1) every bus and weight-sync socket of the run is encrypted. The trainer
    warm-starts in the run (a few steps: the learning tests start from a made checkpoint)."""
    keys = str(generate_keys(tmp_path / "keys")[0].parent) if curve else None
    config = write_config(
        tmp_path,
        f"k{max_staleness}",
        staleness={"max_staleness": max_staleness},
        sync={"transport": transport},
        broker={"curve_keys": keys},
        trainer={"sft_steps": 3},
    )
    proc = launch(config)
    wait_for_steps(tmp_path / f"k{max_staleness}", 1, proc)
    tree = supervise.descendants(proc.pid)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert f"run k{max_staleness}: Redis at redis://127.0.0.1:" in err, "the run says its Redis"
    progress = [line for line in err.splitlines() if line.startswith(("step ", "trainer "))]
    assert progress[-1].startswith("step 12/12 "), progress[-3:]
    summary = json.loads(out.strip().splitlines()[-1])
    steps, per_step = 12, 4
    assert summary["mode"] == "async" and summary["steps"] == steps
    assert summary["max_staleness"] <= max_staleness
    assert set(summary["exit_codes"].values()) == {0}, summary["exit_codes"]
    check_finished_run(summary, tmp_path / f"k{max_staleness}", steps * per_step, max_staleness)
    assert supervise.wait_gone(tree, timeout_s=10) == []
    # Every generator pulled versions over the configured transport and swapped them in.
    syncs = [
        json.loads(p.read_text())["syncs"] for p in (tmp_path / f"k{max_staleness}" / "timers").glob("generator-*.json")
    ]
    assert len(syncs) == 2 and min(syncs) >= 2
    # Step 6's evaluation was shared (its one chunk taken by whoever held version 6 first), its
    # result in a later step's record; after the last step the trainer evaluated alone.
    run_dir = tmp_path / f"k{max_staleness}"
    records = metrics_records(run_dir)
    shared = [r for r in records if "eval_step" in r]
    assert [(r["eval_step"], r["eval_version"]) for r in shared] == [(6, 6)], shared
    assert 6 < shared[0]["step"] < steps and 0.0 <= shared[0]["held_out_accuracy"] <= 1.0
    assert [r["step"] for r in records if "eval_s" in r] in ([6, steps], [steps])
    logged = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    evaluators = [entry["evaluated_by"] for entry in logged if "evaluated_by" in entry]
    assert evaluators in (["trainer"], ["generator-0"], ["generator-1"]), evaluators


def test_sigint_leaves_no_child_behind(tmp_path: Path) -> None:
    config = write_config(tmp_path, "sigint", trainer={"num_steps": 100_000})
    proc = launch(config)
    wait_for_steps(tmp_path / "sigint", 1, proc)
    tree = supervise.descendants(proc.pid)
    assert len(tree) >= 6  # Redis, broker, trainer, 2 generators, reward
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert supervise.wait_gone(tree, timeout_s=10) == []


def test_child_crash_ends_the_run_naming_the_role(tmp_path: Path) -> None:
    config = write_config(tmp_path, "crash", trainer={"num_steps": 100_000}, workers={"max_restarts": 0})
    proc = launch(config)
    wait_for_steps(tmp_path / "crash", 1, proc)
    tree = supervise.descendants(proc.pid)
    os.kill(worker_pids(proc.pid, "crash")["generator-1"], signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "run failed: generator generator-1 exited with code -9" in err
    assert supervise.wait_gone(tree, timeout_s=10) == []


@pytest.mark.long
def test_stopped_run_resumes_with_nothing_lost(tmp_path: Path) -> None:
    """Ctrl-C a run, then `llamarl run --resume`: Redis comes back from its AOF, the trainer from
    the checkpoint it wrote on the stop; the run completes as if never stopped. Every first
    choice of ports in every process of both starts is taken by someone else
    (tests/integration/first_ports_taken): each service binds another and says where."""
    steps = 150
    config = write_config(
        tmp_path,
        "resume",
        trainer={"num_steps": steps, "checkpoint_every": 7},
        staleness={"max_staleness": 1, "lease_s": 2.0},
    )
    run_dir = tmp_path / "resume"
    taken = tmp_path / "taken.txt"
    env = first_ports_taken(taken)
    proc = launch(config, env=env)
    wait_for_steps(run_dir, 40, proc)
    tree = supervise.descendants(proc.pid)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert f"llamarl run {config} --resume" in err
    assert supervise.wait_gone(tree, timeout_s=10) == []
    stopped_at = len(metrics_records(run_dir))
    assert stopped_at < steps

    proc = launch(config, "--resume", env=env)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    summary = check_resumed_run(out, run_dir, steps)
    # Each start lost its first Redis port (the launcher's choice) and its first broker block
    # (the broker's own), and went on.
    sizes = sorted(int(line.split()[1]) for line in taken.read_text().splitlines())
    assert sizes == [1, 1, 4, 4], taken.read_text()
    assert summary["ledger"]["reopened"] == 0, "the stop checkpoint loses no step"
    # The resumed trainer publishes a version number ahead of its model; the gate discounts it,
    # so generators do not run ahead and waste work (without the offset a third was dropped).
    ledger = summary["ledger"]
    assert ledger["dropped_stale"] < 0.1 * ledger["trained"], ledger
