"""`llamarl run CONFIG`: a whole job on one machine.

`--mode sync` runs the synchronous baseline in this process. The default async mode starts a
private Redis and broker (when the config names no Redis URL), then the trainer, the generators
and the reward workers as child processes, each in its own session so only this launcher signals
them. It shows progress from Redis, ends when the trainer finishes, and always stops every child
(also on Ctrl-C or when a child dies: the run then exits 1 naming the role). The last stdout line
is the JSON summary, with the ledger and the largest staleness trained on.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamarl.config import RunConfig, dump_config, load_config
from llamarl.log import configure_logging
from llamarl.sync_run import run_sync
from llamarl.version_store import VersionStore
from workers.embedded import EmbeddedServices

POLL_S = 0.5
PROGRESS_S = 2.0
STOP_TIMEOUT_S = 10.0
RUN_FILES = ("metrics.jsonl", "trained.jsonl", "summary.json")


@dataclass
class Child:
    role: str
    worker_id: str
    process: subprocess.Popen[bytes]


def spawn(role: str, worker_id: str, config_path: str, env: dict[str, str], logs: Path) -> Child:
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{worker_id}.log", "ab") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "llamarl.cli", "worker", role, "--config", config_path,
             "--worker-id", worker_id, "--log-format", "json"],
            env={**os.environ, **env},
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    return Child(role, worker_id, process)


def wait_all(children: list[Child], timeout_s: float) -> None:
    """Give children that were told to stop the time to exit on their own."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(c.process.poll() is None for c in children):
        time.sleep(0.1)


def stop_all(children: list[Child]) -> dict[str, int]:
    """SIGTERM every live child, SIGKILL what is left after the timeout; their exit codes."""
    for child in children:
        if child.process.poll() is None:
            child.process.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for child in children:
        try:
            child.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait(STOP_TIMEOUT_S)
    return {child.worker_id: int(child.process.returncode) for child in children}


def progress_line(store: VersionStore, total_steps: int) -> str:
    trainer = next((w.fields for w in store.workers() if w.worker_id == "trainer"), {})
    ledger = store.ledger()
    return (
        f"step {trainer.get('step', 0)}/{total_steps}  version {trainer.get('policy_version', '-')}"
        f"  reward {float(trainer.get('reward_mean', 0)):.3f}"
        f"  held-out {float(trainer.get('held_out_accuracy', 0)):.3f}"
        f"  staleness max {trainer.get('max_staleness', 0)}"
        f"  tickets issued {ledger['issued']} trained {ledger['trained']}"
        f" stale {ledger['dropped_stale']} open {ledger['open']}"
    )


def supervise(children: list[Child], store: VersionStore, config: RunConfig) -> None:
    """Wait for the trainer to finish; raise naming the role if any child dies first."""
    last_progress = 0.0
    tty = sys.stderr.isatty()
    while True:
        for child in children:
            code = child.process.poll()
            if code is None:
                continue
            if child.role == "trainer" and code == 0:
                if tty:
                    sys.stderr.write("\n")
                return
            if code == 0 and store.run_status() == "finished":
                continue  # told to stop by the finishing trainer
            raise RuntimeError(f"{child.role} {child.worker_id} exited with code {code}")
        if time.monotonic() - last_progress > PROGRESS_S:
            last_progress = time.monotonic()
            line = progress_line(store, config.trainer.num_steps)
            sys.stderr.write(f"\r{line}" if tty else f"{line}\n")
            sys.stderr.flush()
        time.sleep(POLL_S)


def run_async(config: RunConfig, config_path: str, run_dir: Path) -> int:
    services = EmbeddedServices(run_dir, config.run_id) if config.redis.url is None else None
    if services is not None:
        shutil.rmtree(run_dir / "redis", ignore_errors=True)  # a fresh run, not a resume
        services.start()
    env = services.env() if services is not None else {}
    url = services.redis_url if services is not None else str(config.redis.url)
    store = VersionStore(url, config.run_id, config.redis.connect_deadline_s)
    children: list[Child] = []
    logs = run_dir / "logs"
    try:
        children.append(spawn("trainer", "trainer", config_path, env, logs))
        for i in range(config.workers.num_generators):
            children.append(spawn("generator", f"generator-{i}", config_path, env, logs))
        for i in range(config.workers.num_reward):
            children.append(spawn("reward", f"reward-{i}", config_path, env, logs))
        try:
            supervise(children, store, config)
        except RuntimeError as err:
            print(f"run failed: {err}; logs in {logs}", file=sys.stderr)
            return 1
        summary: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
        summary["ledger"] = store.ledger()
        summary["rejected"] = store.rejected()
        wait_all(children, 2 * config.workers.heartbeat_s + STOP_TIMEOUT_S)
        summary["exit_codes"] = stop_all(children)
        print(json.dumps(summary), flush=True)
        return 0
    finally:
        stop_all(children)
        store.close()
        if services is not None:
            services.stop()


def main(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    configure_logging("launcher", "launcher", args.log_format)
    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        (run_dir / name).unlink(missing_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(config))
    if args.mode == "sync":
        print(json.dumps(run_sync(config)), flush=True)
        return 0
    return run_async(config, args.config, run_dir)
