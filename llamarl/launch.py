"""The body of `llamarl run` in async mode: start the roles as child processes, restart the dead,
show progress from the store, end when the trainer finishes, and always stop every child.

How a child is started (its command line, its environment) is the caller's: `spawn(role,
worker_id)` returns the started process. A dead worker is restarted under the same id, up to
`workers.max_restarts` times each (the trainer resumes from its latest checkpoint); one restart
too many ends the run, naming the role. Each child runs in its own session, so only the launcher
signals it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from llamarl import supervise
from llamarl.config import RunConfig, dump_config
from llamarl.cores import CoreSplit, set_affinity
from llamarl.monitor import progress_line
from llamarl.store import RedisStore, Store

log = structlog.get_logger(__name__)

POLL_S = 0.5
PROGRESS_S = 2.0
STOP_TIMEOUT_S = 10.0
RUN_FILES = ("metrics.jsonl", "trained.jsonl", "summary.json")
Spawn = Callable[[str, str], subprocess.Popen[bytes]]


def prepare_run_dir(config: RunConfig, resume: bool) -> Path:
    """The run directory, emptied of a previous run's results, checkpoints and embedded Redis
    data unless resuming, with the resolved config written into it."""
    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        for name in RUN_FILES:
            (run_dir / name).unlink(missing_ok=True)
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        shutil.rmtree(run_dir / "redis", ignore_errors=True)
    (run_dir / "config.yaml").write_text(dump_config(config))
    (run_dir / "logs").mkdir(exist_ok=True)
    return run_dir


@dataclass
class Child:
    role: str
    worker_id: str
    process: subprocess.Popen[bytes]


def wait_all(children: list[Child], timeout_s: float) -> None:
    """Give children that were told to stop the time to exit on their own."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(c.process.poll() is None for c in children):
        time.sleep(0.1)


def stop_all(children: list[Child]) -> dict[str, int]:
    """SIGTERM every live child at once, SIGKILL (with what it started) what is left after the
    timeout; their exit codes."""
    for child in children:
        if child.process.poll() is None:
            child.process.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    return {
        child.worker_id: supervise.stop(child.process, max(0.1, deadline - time.monotonic()))
        for child in children
    }


class Supervisor:
    """Watches the children: restarts a dead one (up to `workers.max_restarts` times each) and
    ends the run when the trainer finishes."""

    def __init__(self, config: RunConfig, spawn: Spawn, pins: dict[str, list[int]]) -> None:
        self.config = config
        self.spawn = spawn
        self.pins = pins
        self.children: list[Child] = []
        self.restarts: dict[str, int] = {}

    def _spawn(self, role: str, worker_id: str) -> Child:
        child = Child(role, worker_id, self.spawn(role, worker_id))
        if worker_id in self.pins:  # before it starts its thread pools, which inherit it
            set_affinity(child.process.pid, self.pins[worker_id])
        return child

    def start(self, role: str, worker_id: str) -> None:
        self.children.append(self._spawn(role, worker_id))

    def _restart(self, index: int, code: int) -> None:
        child = self.children[index]
        count = self.restarts.get(child.worker_id, 0)
        if count >= self.config.workers.max_restarts:
            tries = f" after {count} restarts" if count else ""
            raise RuntimeError(f"{child.role} {child.worker_id} exited with code {code}{tries}")
        self.restarts[child.worker_id] = count + 1
        log.warning("restarting worker", worker=child.worker_id, exit_code=code, restart=count + 1)
        self.children[index] = self._spawn(child.role, child.worker_id)

    def wait_for_trainer(self, store: Store) -> None:
        """Return when the trainer exits 0; raise naming the role when a child cannot go on."""
        last_progress = 0.0
        tty = sys.stderr.isatty()
        while True:
            for index, child in enumerate(self.children):
                code = child.process.poll()
                if code is None:
                    continue
                if child.role == "trainer" and code == 0:
                    if tty:
                        sys.stderr.write("\n")
                    return
                if code == 0 and store.run_status() == "finished":
                    continue  # told to stop by the finishing trainer
                self._restart(index, code)
            if time.monotonic() - last_progress > PROGRESS_S:
                last_progress = time.monotonic()
                line = progress_line(store, self.config.trainer.num_steps)
                sys.stderr.write(f"\r{line}" if tty else f"{line}\n")
                sys.stderr.flush()
            time.sleep(POLL_S)


def run_roles(config: RunConfig, redis_url: str, spawn: Spawn, split: CoreSplit) -> int:
    """Start the trainer, generators and reward workers, supervise them to the end, print the
    JSON summary (with the ledger and the restarts) as the last stdout line. Exit code."""
    run_dir = Path(config.run_dir)
    store = RedisStore(redis_url, config.run_id, config.redis.connect_deadline_s)
    supervisor = Supervisor(config, spawn, split.pins)
    try:
        supervisor.start("trainer", "trainer")
        for i in range(config.workers.num_generators):
            supervisor.start("generator", f"generator-{i}")
        for i in range(config.workers.num_reward):
            supervisor.start("reward", f"reward-{i}")
        try:
            supervisor.wait_for_trainer(store)
        except RuntimeError as err:
            print(f"run failed: {err}; logs in {run_dir / 'logs'}", file=sys.stderr)
            return 1
        summary: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
        summary["ledger"] = store.ledger()
        summary["rejected"] = store.rejected()
        summary["restarts"] = supervisor.restarts
        wait_all(supervisor.children, 2 * config.workers.heartbeat_s + STOP_TIMEOUT_S)
        summary["exit_codes"] = stop_all(supervisor.children)
        print(json.dumps(summary), flush=True)
        return 0
    finally:
        try:
            stop_all(supervisor.children)
        finally:
            store.close()
