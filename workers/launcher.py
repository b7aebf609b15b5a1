"""`llamarl run CONFIG`: a whole job on one machine.

`--mode sync` runs the synchronous baseline in this process. The default async mode starts a
private Redis and broker (when the config names no Redis URL), then the trainer, the generators
and the reward workers as child processes, each in its own session so only this launcher signals
them. It shows progress from Redis, ends when the trainer finishes, and always stops every child
(also on Ctrl-C). A dead worker is restarted under the same id, up to `workers.max_restarts`
times each (the trainer resumes from its latest checkpoint); one restart too many ends the run
with exit code 1 naming the role. A launch is a fresh run: it clears the run directory's
results, checkpoints and embedded Redis data; `--resume` instead keeps them and carries on a run
that was stopped (Ctrl-C, SIGTERM) or whose machine went down: Redis comes back from its AOF and
the trainer from its newest checkpoint. The last stdout line
is the JSON summary, with the ledger and the largest staleness trained on.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import structlog
import torch

from llamarl.config import RunConfig, dump_config, load_config
from llamarl.cores import plan_threads, set_affinity, usable_cores
from llamarl.log import configure_logging
from llamarl.monitor import progress_line
from llamarl.sync_run import run_sync
from llamarl.version_store import VersionStore
from workers.embedded import EmbeddedServices

log = structlog.get_logger(__name__)

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


class Supervisor:
    """Watches the children: restarts a dead one (up to `workers.max_restarts` times each) and
    ends the run when the trainer finishes."""

    def __init__(self, config: RunConfig, config_path: str, env: dict[str, str], logs: Path,
                 pins: dict[str, list[int]]) -> None:  # fmt: skip
        self.config = config
        self.config_path = config_path
        self.env = env
        self.logs = logs
        self.pins = pins
        self.children: list[Child] = []
        self.restarts: dict[str, int] = {}

    def _spawn(self, role: str, worker_id: str) -> Child:
        child = spawn(role, worker_id, self.config_path, self.env, self.logs)
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

    def wait_for_trainer(self, store: VersionStore) -> None:
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


def run_async(config: RunConfig, config_path: str, run_dir: Path, resume: bool) -> int:
    services = (
        EmbeddedServices(run_dir, config.run_id, config.broker.curve_keys)
        if config.redis.url is None
        else None
    )
    if services is not None:
        if not resume:
            shutil.rmtree(run_dir / "redis", ignore_errors=True)
        services.start()
    env = services.env() if services is not None else {}
    split = plan_threads(config)
    env |= {"LLAMARL__WORKERS__TRAINER_THREADS": str(split.trainer_threads),
            "LLAMARL__WORKERS__GENERATOR_THREADS": str(split.generator_threads)}  # fmt: skip
    log.info("cores split", trainer_threads=split.trainer_threads,
             generator_threads=split.generator_threads, trainer_share=split.trainer_share,
             pins=split.pins)  # fmt: skip
    url = services.redis_url if services is not None else str(config.redis.url)
    store = VersionStore(url, config.run_id, config.redis.connect_deadline_s)
    supervisor = Supervisor(config, config_path, env, run_dir / "logs", split.pins)
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
            if services is not None:
                services.stop()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(args: argparse.Namespace) -> int:
    # SIGTERM, and SIGINT even where the shell ignores it (background jobs), stop every child.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    config = load_config(args.config)
    configure_logging("launcher", "launcher", args.log_format)
    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    resume = args.mode == "async" and args.resume
    if not resume:
        for name in RUN_FILES:
            (run_dir / name).unlink(missing_ok=True)
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    (run_dir / "config.yaml").write_text(dump_config(config))
    if args.mode == "sync":
        torch.set_num_threads(config.workers.num_cores or usable_cores())
        print(json.dumps(run_sync(config)), flush=True)
        return 0
    try:
        return run_async(config, args.config, run_dir, resume)
    except KeyboardInterrupt:
        print(f"run stopped; carry on with: llamarl run {args.config} --resume", file=sys.stderr)
        raise
