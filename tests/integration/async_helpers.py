"""Helpers for tests that run `llamarl run` end to end: configs, process lookup, results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis
import yaml

from llamarl.launch import supervise
from llamarl.store import RedisStore

SMALL_RUN: dict[str, Any] = {
    "model": {
        "hidden_size": 32,
        "num_layers": 1,
        "num_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 32,
    },
    "generation": {"num_samples": 2, "max_new_tokens": 4, "prompts_per_batch": 2},
    "trainer": {"prompts_per_step": 4, "num_steps": 12, "eval_every": 6, "sft_steps": 0},
    "task": {"num_eval": 20},
    "workers": {"num_generators": 2, "num_reward": 1, "heartbeat_s": 0.5},
}


def worker_argv(role: str, worker_id: str, config: Path) -> list[str]:
    """The command line that starts one role by hand, as on a machine of its own."""
    command = ["worker", role, "--config", str(config), "--worker-id", worker_id, "--log-format", "json"]
    return [sys.executable, "-m", "workers.cli", *command]


def write_config(directory: Path, run_id: str, **overrides: Any) -> Path:
    tree = json.loads(json.dumps(SMALL_RUN))
    for section, values in overrides.items():
        tree.setdefault(section, {}).update(values)
    tree |= {"run_id": run_id, "run_dir": str(directory / run_id)}
    path = directory / f"{run_id}.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


FIRST_PORTS_TAKEN = Path(__file__).parent / "first_ports_taken"


def first_ports_taken(notes: Path) -> dict[str, str]:
    """The environment in which every process of a run finds the first block of ports it picks
    taken (tests/integration/first_ports_taken/sitecustomize.py), each noted in `notes`."""
    path = os.pathsep.join(filter(None, [str(FIRST_PORTS_TAKEN), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "LLAMARL_TEST_TAKEN_PORTS": str(notes)}


def launch(config: Path, *options: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "run", str(config), *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def run_redis_url(launcher_pid: int) -> str:
    """The Redis URL `llamarl run` gave its children: it is in their environment."""
    for pid in supervise.children(launcher_pid):
        try:
            pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue  # exited meanwhile
        environ = dict(item.decode().split("=", 1) for item in pairs if b"=" in item)
        if "LLAMARL_REDIS_URL" in environ:
            return environ["LLAMARL_REDIS_URL"]
    raise AssertionError(f"no child of {launcher_pid} was given a Redis URL")


def worker_pids(launcher_pid: int, run_id: str) -> dict[str, int]:
    """worker id -> pid of each worker of the run that is registered and alive in its Redis and
    is a child of the launcher (a registration can outlive its process by the heartbeat TTL)."""
    store = RedisStore(run_redis_url(launcher_pid), run_id, connect_deadline_s=5)
    try:
        registered = {w.worker_id: int(w.fields["pid"]) for w in store.workers() if w.alive}
    finally:
        store.close()
    children = supervise.children(launcher_pid)
    return {worker_id: pid for worker_id, pid in registered.items() if pid in children}


def service_pids(launcher_pid: int, run_id: str) -> tuple[int, int]:
    """(redis-server, broker) pids of an embedded run: Redis reports its own pid; the broker is
    the launcher's one live child that is neither Redis nor a registered worker."""
    client = redis.Redis.from_url(run_redis_url(launcher_pid))
    try:
        redis_pid = int(client.info("server")["process_id"])
    finally:
        client.close()
    workers = set(worker_pids(launcher_pid, run_id).values())
    children = [pid for pid in supervise.children(launcher_pid) if supervise.alive(pid)]
    (broker_pid,) = [pid for pid in children if pid not in workers and pid != redis_pid]
    return redis_pid, broker_pid


def metrics_records(run_dir: Path) -> list[dict[str, Any]]:
    """The run's per-step metrics so far (a line still being written is skipped)."""
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.endswith("}")]


def wait_for_steps(
    run_dir: Path,
    steps: int,
    launcher: subprocess.Popen[str] | None = None,
    timeout_s: float = 120,
) -> list[dict[str, Any]]:
    """The metrics once the run has recorded `steps` steps; fails if the launcher exits first."""
    deadline = time.monotonic() + timeout_s
    while len(records := metrics_records(run_dir)) < steps:
        assert launcher is None or launcher.poll() is None, "run ended early"
        assert time.monotonic() < deadline, f"run did not reach step {steps}"
        time.sleep(0.1)
    return records


def trained_entries(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "trained.jsonl").open()]


def check_resumed_run(out: str, run_dir: Path, steps: int) -> dict[str, Any]:
    """The summary a resumed run of `steps` steps (4 groups each) printed, checked: a finished
    run, every step recorded once, versions strictly rising."""
    summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    check_finished_run(summary, run_dir, steps * 4, k=1)
    records = metrics_records(run_dir)
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    versions = [r["policy_version"] for r in records]
    assert versions == sorted(set(versions)), "versions must strictly increase"
    return summary


def check_finished_run(summary: dict[str, Any], run_dir: Path, num_groups: int, k: int) -> None:
    """The guarantees of a finished run: each ticket and rollout trained once, staleness <= k,
    and a balanced ledger with nothing left open."""
    entries = trained_entries(run_dir)
    assert len(entries) == num_groups
    assert len({e["rollout_id"] for e in entries}) == num_groups, "a rollout trained twice"
    assert len({e["ticket_id"] for e in entries}) == num_groups, "a ticket trained twice"
    assert max(e["staleness"] for e in entries) <= k
    ledger = summary["ledger"]
    ended = ledger["trained"] + ledger["skipped"] + ledger["dropped_stale"]
    assert ledger["issued"] == ended + ledger["open"]
    assert ledger["open"] == 0 and ledger["trained"] == num_groups


def check_reissued_run(
    proc: subprocess.Popen[str], out: str, err: str, run_dir: Path, num_groups: int
) -> dict[str, Any]:
    """The summary of a finished run one of whose generators was killed, checked: it ended
    well, kept check_finished_run's guarantees (k=1), and trained a reissued ticket."""
    assert proc.returncode == 0, err[-3000:]
    summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    check_finished_run(summary, run_dir, num_groups, k=1)
    attempts = [int(e["rollout_id"].split(".")[1]) for e in trained_entries(run_dir)]
    assert max(attempts) >= 1, "no ticket of the killed generator was reissued"
    return summary
