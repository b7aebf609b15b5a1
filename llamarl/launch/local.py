"""The body of `llamarl run` in async mode: start the roles as child processes, restart the dead,
show progress from the store, end when the trainer finishes, and always stop every child.

How a child is started (its command line, its environment) is the caller's: `spawn(role,
worker_id)` returns the started process, a `WorkerProcess`: a child of the launcher, or one a Ray
actor holds (`llamarl.launch.ray_actors`). A dead worker is restarted under the same id, up to
`workers.max_restarts` times each (the trainer resumes from its latest checkpoint); one restart
too many ends the run, naming the role. Each child runs in its own session, so only the launcher
signals it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog
import torch

from llamarl.algorithms.user import check_user_functions
from llamarl.config import (
    RunConfig,
    dump_config,
    unwritable_run_dir,
    writable_run_dir,
)
from llamarl.curve import load_curve
from llamarl.engine.model import check_model_path
from llamarl.envs.registry import environment_class, make_tools
from llamarl.errors import ConfigError
from llamarl.launch import supervise
from llamarl.launch.agent_checks import check_agent
from llamarl.launch.cores import CoreSplit, set_affinity
from llamarl.launch.data_checks import check_data_and_rewards
from llamarl.launch.engine_checks import check_engine
from llamarl.observe.metric_sinks import check_sinks
from llamarl.observe.monitor import progress_line
from llamarl.rewards.judge import check_judge
from llamarl.rewards.reward_model import check_reward_model_path
from llamarl.roles.trainer_durability import SAMPLES_LOG
from llamarl.store import RedisStore, Store, without_password
from llamarl.training.export import FINAL_MODEL
from llamarl.training.memory_check import check_memory
from llamarl.weightsync import check_crosses_processes

log = structlog.get_logger(__name__)

POLL_S = 0.5
PROGRESS_S = 2.0
STOP_TIMEOUT_S = 10.0
WATCH_DEADLINE_S = 1.0
CONFIG_EXIT = 2
"""A worker's exit code for a configuration it refuses (bad model path, transport, ...)."""
RUN_FILES = ("metrics.jsonl", "trained.jsonl", "summary.json", SAMPLES_LOG)


class WorkerProcess(Protocol):
    """A started role process as the Supervisor sees it: a child of this process
    (`LocalProcess`) or one a Ray actor holds (`llamarl.launch.ray_actors.RayProcess`)."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def terminate(self) -> None: ...

    def stop(self, grace_s: float) -> int:
        """SIGTERM, up to `grace_s`, then SIGKILL of it and what it started; its exit code."""
        ...


@dataclass
class LocalProcess:
    """A role process started on this host by `supervise.start`."""

    popen: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def terminate(self) -> None:
        self.popen.terminate()

    def stop(self, grace_s: float) -> int:
        return supervise.stop(self.popen, grace_s)


Spawn = Callable[[str, str], WorkerProcess]


def local_spawn(config: RunConfig, run_dir: Path, env: dict[str, str], config_path: str) -> Spawn:
    """Start each role as a child of this process, its output in RUN_DIR/logs/<worker_id>.log:
    in a session of its own (only the launcher signals it), and killed by the kernel should
    the launcher die without stopping it."""

    def spawn(role: str, worker_id: str) -> LocalProcess:
        with open(run_dir / "logs" / f"{worker_id}.log", "ab") as log_file:
            return LocalProcess(
                supervise.start(
                    worker_command(config, role, worker_id, config_path),
                    env=env,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                )
            )

    return spawn


class Services(Protocol):
    """The run's own Redis and broker, when the launcher started them (brokers.embedded)."""

    def dead(self) -> list[str]: ...

    def restart(self, name: str) -> None: ...


def prepare_run_dir(config: RunConfig, resume: bool) -> Path:
    """The run directory, emptied of a previous run's results, checkpoints and embedded Redis
    data unless resuming, with the resolved config written into it."""
    run_dir = writable_run_dir(config)
    try:
        if not resume:
            for name in RUN_FILES:
                (run_dir / name).unlink(missing_ok=True)
            shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
            shutil.rmtree(run_dir / "redis", ignore_errors=True)
            shutil.rmtree(run_dir / FINAL_MODEL, ignore_errors=True)
        (run_dir / "config.yaml").write_text(dump_config(config))
        (run_dir / "logs").mkdir(exist_ok=True)
    except OSError as err:
        raise unwritable_run_dir(run_dir, err) from None
    return run_dir


def worker_env(split: CoreSplit, services: dict[str, str]) -> dict[str, str]:
    """The environment of every worker process: this one's, the embedded services' addresses
    and the thread counts of the cores split."""
    log.info(
        "cores split", trainer_threads=split.trainer_threads, generator_threads=split.generator_threads, pins=split.pins
    )
    return {
        **os.environ,
        **services,
        "LLAMARL__WORKERS__TRAINER_THREADS": str(split.trainer_threads),
        "LLAMARL__WORKERS__GENERATOR_THREADS": str(split.generator_threads),
    }


def worker_command(config: RunConfig, role: str, worker_id: str, config_path: str) -> list[str]:
    """The command line of one role's process: `python -m workers.<role>`, or for a trainer of
    several ranks that under torchrun (`--standalone`: its own rendezvous on a free port)."""
    command = ["-m", f"workers.{role}", "--config", config_path, "--worker-id", worker_id, "--log-format", "json"]
    ranks = config.trainer.ranks
    if role == "trainer" and ranks > 1:
        torchrun = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
        return [sys.executable, *torchrun, *command]
    return [sys.executable, *command]


def check_devices(config: RunConfig, mode: str, launcher: str = "local") -> None:
    """ConfigError naming the field when a role of a local launch asks for CUDA on a machine
    without it, or a trainer for more CUDA ranks than this machine has GPUs (under Ray the roles
    run on the cluster's nodes, and Ray tells when none can hold them); or the synchronous
    one_process layout (`mode` sync) for several trainer ranks or generators unlike its trainer."""
    if launcher == "local":
        check_local_gpus(config)
    if mode == "sync" and config.trainer.ranks > 1:
        raise ConfigError(
            "trainer.ranks: one_process (--mode sync) runs one trainer process; set it to 1 or another workers.layout"
        )
    gen = config.generation
    if mode == "sync" and (gen.device, gen.dtype) != (config.trainer.device, config.trainer.dtype):
        raise ConfigError(
            "generation.device, generation.dtype: one_process (--mode sync) generates with the "
            "trainer's own weights; set them as trainer.device and trainer.dtype, or another workers.layout"
        )


def check_local_gpus(config: RunConfig) -> None:
    """ConfigError naming the field when this machine lacks the GPUs the roles ask for."""
    for field, device in (("trainer.device", config.trainer.device), ("generation.device", config.generation.device)):
        if device == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"{field}: cuda, but this machine has no CUDA device; set cpu")
    ranks, gpus = config.trainer.ranks, torch.cuda.device_count()
    if config.trainer.device == "cuda" and ranks > gpus:
        raise ConfigError(
            f"trainer.ranks: {ranks} ranks on cuda need a GPU each and this machine has {gpus}; "
            f"set trainer.ranks to at most {gpus}, or trainer.device to cpu"
        )


def preflight(config: RunConfig, mode: str, launcher: str = "local") -> None:
    """What a launch can tell is wrong before it starts anything (ConfigError naming the field):
    a loss or advantage of the user's that returns nonsense (`llamarl.algorithms.user`); bad
    data, or a reward function that returns nonsense (`data_checks`); a model, reward-model
    or judge path that is not a model directory; a vLLM engine this machine or model cannot
    run (`engine_checks`); CURVE keys that are not
    there; a metrics sink whose package is missing; an environment class or agent function that cannot be imported
    (`agent_checks`), or a
    Python tool whose limits this host cannot apply; an async run on the in-process transport; a device
    this machine lacks, or a trainer (with the generators' weights, async) its memory cannot
    hold (`launcher` local; Ray places the roles on its own nodes)."""
    check_devices(config, mode, launcher)
    check_user_functions(config.algorithm)
    check_model_path(config.model)
    check_engine(config)
    check_data_and_rewards(config)
    load_curve(config.broker.curve_keys)
    if config.task.reward_model is not None:
        check_reward_model_path(config.task.reward_model)
    if config.task.judge is not None:
        check_judge(config.task.judge)
    check_sinks(config.logging)
    if config.environment.kind == "agent":
        check_agent(config)
    elif config.environment.kind is not None:  # imports a custom class; the Python tool probes
        make_tools(config.environment)
        environment_class(config.environment.kind)
    if mode == "async":
        check_crosses_processes(config.sync)
    if launcher == "local":
        check_memory(config, generators=mode == "async")


@dataclass
class Child:
    role: str
    worker_id: str
    process: WorkerProcess


def wait_all(children: list[Child], timeout_s: float) -> None:
    """Give children that were told to stop the time to exit on their own."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(c.process.poll() is None for c in children):
        time.sleep(0.1)


def stop_grace_s(role: str, config: RunConfig) -> float:
    """How long a child told to stop may take before it is SIGKILLed: STOP_TIMEOUT_S; the trainer
    also waits up to `sync.timeout_s` for its stop checkpoint to be written and as long again for
    its last version to be published (a big model's checkpoint takes longer than
    STOP_TIMEOUT_S, and one cut short loses the steps since the last periodic checkpoint)."""
    return STOP_TIMEOUT_S + (2 * config.sync.timeout_s if role == "trainer" else 0.0)


def stop_all(children: list[Child], config: RunConfig) -> dict[str, int]:
    """SIGTERM every live child at once, SIGKILL (with what it started) each one still there
    after its grace (`stop_grace_s`); their exit codes. Each is stopped where it runs
    (`WorkerProcess.stop`)."""
    for child in children:
        if child.process.poll() is None:
            child.process.terminate()
    started = time.monotonic()
    codes = {}
    for child in sorted(children, key=lambda c: stop_grace_s(c.role, config)):
        deadline = started + stop_grace_s(child.role, config)
        codes[child.worker_id] = child.process.stop(max(0.1, deadline - time.monotonic()))
    return {child.worker_id: codes[child.worker_id] for child in children}


class Supervisor:
    """Watches the children: restarts a dead one (up to `workers.max_restarts` times each) and
    ends the run when the trainer finishes."""

    def __init__(
        self,
        config: RunConfig,
        spawn: Spawn,
        pins: dict[str, list[int]],
        clock: Callable[[], float] = time.monotonic,
        services: Services | None = None,
    ) -> None:
        self.config = config
        self.services = services
        self.clock = clock
        self.spawn = spawn
        self.pins = pins
        self.children: list[Child] = []
        self.restarts: dict[str, int] = {}
        """Restarts of each worker over the whole run (reported in the summary)."""
        self._recent: dict[str, deque[float]] = {}

    def _spawn(self, role: str, worker_id: str) -> Child:
        child = Child(role, worker_id, self.spawn(role, worker_id))
        if worker_id in self.pins:  # before it starts its thread pools, which inherit it
            set_affinity(child.process.pid, self.pins[worker_id])
        return child

    def start(self, role: str, worker_id: str) -> None:
        self.children.append(self._spawn(role, worker_id))

    def _charge(self, name: str, what: str) -> None:
        """Count a restart of `name` against its budget; RuntimeError saying `what` happened
        when the budget of the window is spent."""
        workers = self.config.workers
        now = self.clock()
        recent = self._recent.setdefault(name, deque())
        while recent and now - recent[0] > workers.restart_window_s:
            recent.popleft()
        if len(recent) >= workers.max_restarts:
            window = f" after {len(recent)} restarts in {workers.restart_window_s:g} s"
            raise RuntimeError(what + (window if recent else ""))
        recent.append(now)
        count = self.restarts[name] = self.restarts.get(name, 0) + 1
        log.warning("restarting", what=what, restart=count)

    def restart_services(self) -> None:
        """Restart the run's own Redis or broker if it died (same budget as a worker)."""
        if self.services is None:
            return
        for name in self.services.dead():
            self._charge(name, f"the run's {name} died")
            self.services.restart(name)

    def restart(self, index: int, code: int) -> None:
        """Restart a dead child, unless it already used up its restarts in the last window."""
        child = self.children[index]
        if code == CONFIG_EXIT:  # restarting cannot help a worker its config is wrong for
            raise RuntimeError(
                f"{child.role} {child.worker_id} refused its configuration (exit {code}); "
                f"its log says why: logs/{child.worker_id}.log"
            )
        self._charge(child.worker_id, f"{child.role} {child.worker_id} exited with code {code}")
        self.children[index] = self._spawn(child.role, child.worker_id)

    def wait_for_trainer(self, store: Store) -> None:
        """Return when the trainer exits 0; raise naming the role when a child cannot go on.
        The progress line is shown every PROGRESS_S and once more at the end."""
        last_progress = 0.0
        while True:
            self.restart_services()
            for index, child in enumerate(self.children):
                code = child.process.poll()
                if code is None:
                    continue
                if child.role == "trainer" and code == 0:
                    self._show_progress(store, last=True)
                    return
                if code == 0 and _finished(store):
                    continue  # told to stop by the finishing trainer
                self.restart(index, code)
            if time.monotonic() - last_progress > PROGRESS_S:
                last_progress = time.monotonic()
                self._show_progress(store)
            time.sleep(POLL_S)

    def _show_progress(self, store: Store, last: bool = False) -> None:
        """The progress line, rewritten in place on a terminal, a line each time elsewhere."""
        try:
            line = progress_line(store, self.config.trainer.num_steps)
        except ConnectionError:  # Redis is down: restarted on the next turn
            line = "redis unreachable"
        tty = sys.stderr.isatty()
        sys.stderr.write((f"\r{line}" if tty else f"{line}\n") + ("\n" if tty and last else ""))
        sys.stderr.flush()


def _finished(store: Store) -> bool:
    try:
        return store.run_status() == "finished"
    except ConnectionError:
        return False


def run_roles(
    config: RunConfig,
    redis_url: str,
    spawn: Spawn,
    split: CoreSplit,
    services: Services | None = None,
) -> int:
    """Start the trainer, generators and reward workers, supervise them to the end, print the
    JSON summary (with the ledger and the restarts) as the last stdout line. Exit code."""
    run_dir = Path(config.run_dir)
    print(
        f"run {config.run_id}: Redis at {without_password(redis_url)}; watch it with "
        f"LLAMARL_REDIS_URL={without_password(redis_url)} LLAMARL_RUN_ID={config.run_id} "
        "llamarl monitor",
        file=sys.stderr,
        flush=True,
    )
    store = RedisStore(redis_url, config.run_id, config.redis.connect_deadline_s)
    # The watch loop's reads give up fast, so a dead Redis of the run's own is restarted soon.
    watch = RedisStore(redis_url, config.run_id, connect_deadline_s=WATCH_DEADLINE_S)
    supervisor = Supervisor(config, spawn, split.pins, services=services)
    try:
        supervisor.start("trainer", "trainer")
        for i in range(config.workers.num_generators):
            supervisor.start("generator", f"generator-{i}")
        for i in range(config.workers.num_reward):
            supervisor.start("reward", f"reward-{i}")
        try:
            supervisor.wait_for_trainer(watch)
        except RuntimeError as err:
            print(f"run failed: {err}; logs in {run_dir / 'logs'}", file=sys.stderr)
            return 1
        summary: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
        summary["ledger"] = store.ledger()
        summary["rejected"] = store.rejected()
        summary["restarts"] = supervisor.restarts
        wait_all(supervisor.children, 2 * config.workers.heartbeat_s + STOP_TIMEOUT_S)
        summary["exit_codes"] = stop_all(supervisor.children, config)
        print(json.dumps(summary), flush=True)
        return 0
    finally:
        try:
            stop_all(supervisor.children, config)
        finally:
            store.close()
            watch.close()
