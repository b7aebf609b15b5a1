"""`workers.layout` end to end: auto profiles the config (cached by config and machine; the
cache's reuse is covered by tests/unit/test_profile_cache.py), prints its choice and starts it;
colocated runs generator and trainer processes in turn on every core; where taking turns is
predicted fastest, auto starts one_process, whose run a SIGKILL does not lose; a tie between
taking turns and a split goes to taking turns."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llamarl.bench.profile import cache_key, machine
from llamarl.config import RunConfig, parse_config
from llamarl.config.run import read_tree
from llamarl.launch import supervise
from llamarl.launch.layout import SPLIT_FLOOR, auto
from llamarl.sim.costs import Costs, ThreadCosts
from llamarl.sim.predict import TIE, layout_of, lengths_of
from llamarl.sim.rl import simulate_sync
from tests.integration.async_helpers import (
    check_resumed_run,
    metrics_records,
    wait_for_steps,
    write_config,
)

STEPS = 4
REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"


def _run(config: Path, env: dict[str, str], *overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", "run", str(config), *overrides],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )


def test_auto_profiles_once_prints_its_choice_and_starts_it(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        "auto",
        trainer={"num_steps": STEPS, "eval_every": STEPS},
        workers={"num_generators": 1, "heartbeat_s": 0.5},
    )
    env = os.environ | {"LLAMARL_CACHE_DIR": str(tmp_path / "cache")}
    done = _run(config, env, "workers.layout=auto")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "layout auto: best " in done.stderr, done.stderr[-3000:]
    laid = json.loads((tmp_path / "auto" / "layout.json").read_text())
    prediction = laid["prediction"]
    assert prediction["profile_cached"] is False
    chosen = prediction["chosen"]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["steps"] == STEPS
    assert prediction["turns_s_per_step"] > 0, "taking turns was run for real"
    assert set(prediction["calibration"]) == {"generate", "train"}, "its phases calibrated the simulator"
    kind = "one_process" if chosen.get("one_process") else "split"
    assert laid["kind"] == kind and not chosen["colocated"], "taking turns is one_process's"
    assert summary["mode"] == ("sync" if kind == "one_process" else "async")
    assert (laid["trainer_threads"], laid["max_staleness"]) == (chosen["trainer_threads"], chosen["max_staleness"])
    assert summary["ledger"]["trained"] == summary["ledger"]["issued"]
    profile = Path(prediction["profile"])  # cached by config and machine, under the cache dir
    assert profile.parent == tmp_path / "cache" / "profiles" and profile.is_file()


def test_colocated_takes_turns_on_every_core(tmp_path: Path) -> None:
    config = write_config(
        tmp_path, "colocated", trainer={"num_steps": STEPS, "eval_every": STEPS}, staleness={"max_staleness": 2}
    )
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


def _write_trainer_bound_profile(config: Path, cache: Path) -> None:
    """The cached profile auto reads for `config`: training 0.2 s a step (0.1 on two threads or more),
    decoding 10 ms a position (5 on two threads), threads beyond the cores 1.5x slower than their
    share (real profiles measure 1.4-2.2x): a split's trainer, on one thread or sharing the cores
    with a generator, is predicted slower than taking turns beyond the tie. It stands in for a
    measurement (what profiles are made of is tests/unit/test_profile_cache.py's and the test
    above's)."""
    threads = {
        1: ThreadCosts(decode_s=1e-2, decode_s_per_seq=0.0, train_s=0.2, train_s_per_token=0.0),
        2: ThreadCosts(decode_s=5e-3, decode_s_per_seq=0.0, train_s=0.1, train_s_per_token=0.0),
    }
    costs = Costs(
        threads=threads,
        score_s_per_group=0.0,
        stage_s=0.001,
        pull_s=0.001,
        prompt_tokens=8.0,
        corun_slowdown={},
        cores=machine()["cores"],
        oversubscribed_slowdown=1.5,
    )
    run_config = parse_config(read_tree(config))
    path = cache / "profiles" / f"{cache_key(run_config)}.json"
    costs.save(path, {"config": str(config), "machine": machine(), "others_cores": 0.0})
    _add_lockstep_phases(path, run_config, machine()["cores"])


def _add_lockstep_phases(path: Path, run_config: RunConfig, cores: int) -> None:
    """Give the cached profile at `path` the turns probe's phases as the simulator's own lock-step
    run of its costs predicts them: the calibration then leaves the costs as written (scales 1),
    and auto trusts the profile (one without phases is measured again)."""
    costs = Costs.load(path)
    lengths = lengths_of(run_config, None, 0.0, costs.completion_lengths)
    lockstep = simulate_sync(layout_of(run_config, cores, costs), costs, lengths, 60)
    phases = {phase: lockstep.s_per_step * (1 - lockstep.idle_fraction[phase]) for phase in ("generate", "train")}
    path.write_text(json.dumps(json.loads(path.read_text()) | {"turns_phase_s": phases}))


@pytest.mark.long
def test_auto_takes_turns_in_one_process_for_a_trainer_bound_config_and_a_killed_run_resumes(
    tmp_path: Path,
) -> None:
    """A trainer-bound profile: auto starts one_process and says so; the launcher's process group
    SIGKILLed mid-run (no stop checkpoint: the steps since the newest are lost), `--resume` carries
    the run on from its Redis AOF and checkpoint, and every ticket is trained exactly once."""
    steps = 16
    config = write_config(
        tmp_path,
        "turns",
        trainer={"num_steps": steps, "eval_every": steps, "checkpoint_every": 7},
        staleness={"lease_s": 2.0},
    )
    run_dir = tmp_path / "turns"
    _write_trainer_bound_profile(config, tmp_path / "cache")
    env = os.environ | {"LLAMARL_CACHE_DIR": str(tmp_path / "cache")}
    command = [sys.executable, "-m", "workers.cli", "run", str(config), "workers.layout=auto"]
    with open(tmp_path / "err.txt", "w") as err:  # a pipe no one reads would fill and block it
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True)
    try:
        wait_for_steps(run_dir, 9, proc)
        tree = supervise.descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        supervise.stop(proc)
    assert supervise.wait_gone(tree, timeout_s=10) == [], "children outlived the launcher"
    assert "layout auto: best one_process (" in (tmp_path / "err.txt").read_text()
    laid = json.loads((run_dir / "layout.json").read_text())
    assert laid["kind"] == "one_process" and laid["prediction"]["chosen"]["one_process"] is True
    assert len(metrics_records(run_dir)) < steps, "killed mid-run"

    done = subprocess.run([*command, "--resume"], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = check_resumed_run(done.stdout, run_dir, steps)
    assert summary["mode"] == "sync" and summary["max_staleness"] == 0
    # Killed past step 9, its newest checkpoint at step 7: a step's tickets or more were trained
    # again from the checkpoint's weights, each ended once.
    assert summary["ledger"]["reopened"] >= 4, summary["ledger"]


def test_auto_gives_a_tie_between_taking_turns_and_a_split_to_taking_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`configs/bench_train_heavy.yaml`'s profile as measured on the project's 2-core machine
    (tests/integration/data): taking turns and the best split are predicted within the
    profile's spread of each other. A split starts only where it is predicted faster by more
    than that: here auto takes turns in one process, the lock-step loop itself."""
    config = REPO / "configs" / "bench_train_heavy.yaml"
    measured = json.loads((DATA / "profile_train_heavy.json").read_text())
    profiles = tmp_path / "cache" / "profiles"
    profiles.mkdir(parents=True)
    tree = read_tree(config)
    run_config = parse_config(tree | {"workers": tree.get("workers", {}) | {"num_cores": 2}})
    path = profiles / f"{cache_key(parse_config(tree))}.json"
    path.write_text(json.dumps(measured | {"machine": machine(), "others_cores": 0.0}))
    # It predates the turns probe's phases: given the simulator's own lock-step phases, the
    # calibration leaves its costs as measured (scales 1), which the tie below is about.
    _add_lockstep_phases(path, run_config, 2)
    monkeypatch.setenv("LLAMARL_CACHE_DIR", str(tmp_path / "cache"))
    plan = auto(run_config, str(config))
    assert plan.prediction is not None and plan.prediction["profile_cached"] is True
    chosen = plan.prediction["chosen"]
    # The profile's own spread (its repeats' largest coefficient of variation), at least the floor.
    assert plan.prediction["margin"] == round(max(SPLIT_FLOOR, *measured["jitter_cv"].values()), 4) > TIE
    split = min(plan.prediction["alternatives"], key=lambda row: row["s_per_step"])
    assert split["s_per_step"] >= chosen["s_per_step"] * (1 - plan.prediction["margin"]), "the two tie"
    assert plan.prediction["calibration"] == {"generate": 1.0, "train": 1.0}
    assert plan.kind == "one_process" and chosen["one_process"] is True
    assert chosen["s_per_step"] == plan.prediction["sync_s_per_step"]
