"""`llamarl run CONFIG --launcher ray`: every role of an async run as a Ray actor with its
resource request, on a running Ray cluster or on a local Ray instance this launcher starts.

The design follows verl, OpenRLHF and SkyRL, kept thin: the launcher, the Supervisor and the
roles stay as they are, and only where a role's process runs changes. Per worker the launcher
creates one `RoleActor` asking for the role's threads as `num_cpus` (trainer: its threads times
`trainer.ranks`; a generator: its threads; a reward worker: 1) and one GPU per process of a role
whose device is cuda. The actor starts the role's usual command (`launch.worker_command`) as its
own child, in a session of its own and killed by the kernel should the actor die, with its output
in RUN_DIR/logs/<worker_id>.log as under the local launcher. The actor's process holds the Ray
reservation; Ray sets CUDA_VISIBLE_DEVICES for it and the child inherits it. In the launcher a
`RayProcess` stands for the child as a `launch.WorkerProcess` (poll, terminate, stop, pid), so the
Supervisor restarts and stops it as it does a local child; stopping (SIGTERM, grace, then SIGKILL
of the child's process tree) runs inside the actor, on the child's own node, and the actor is
then killed, so a finished run leaves no actors; a local Ray instance the launcher started is
shut down at the end. Cores are not pinned: placement is Ray's.

The embedded Redis and broker stay on the launcher's host. On a cluster of several nodes the
roles must reach them and share files: set `redis.url` and `broker.host`/`broker.port` (or
LLAMARL_REDIS_URL / LLAMARL_BROKER) to addresses the other nodes reach, put `run_dir` (the
launcher reads the trainer's summary there), the config and the model on a filesystem every node
mounts at the same path, and install llamarl at the same path (the command is this launcher's
`sys.executable`). The roles get the launcher's LLAMARL* variables (overrides, service addresses,
thread counts); anything else they need must be in the nodes' environment.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from llamarl.errors import ConfigError
from llamarl.launch import supervise

# Ray imports this module in every actor's process to build its RoleActor, so what imports
# torch (llamarl.launch.local, llamarl.launch.cores) is imported inside the launcher's functions: an actor
# that starts in a fraction of a second places its role seconds sooner.
if TYPE_CHECKING:
    from llamarl.config import RunConfig
    from llamarl.launch.cores import CoreSplit

log = structlog.get_logger(__name__)

PLACE_TIMEOUT_S = 300.0
"""How long a new actor may wait for a node with its resources (an autoscaling cluster may take
minutes to add one)."""
CALL_TIMEOUT_S = 30.0
"""An actor that does not answer a poll within this long counts as lost."""
STOP_MARGIN_S = 10.0
"""Beyond the grace period: the SIGKILL of the child's tree, its reaping and the call itself."""
ACTOR_LOST = -signal.SIGKILL
"""The exit code of a child whose actor died or stopped answering: the kernel SIGKILLs a child
when its actor's process goes."""
OBJECT_STORE_BYTES = 100 * 1024**2
"""A local instance's object store: roles pass nothing through Ray, so keep it small."""
NAMESPACE = "llamarl"


@dataclass(frozen=True)
class Resources:
    """What one role's actor asks Ray for."""

    num_cpus: int
    num_gpus: int
    custom: dict[str, float] = field(default_factory=dict)
    """`workers.ray_resources` of the role: resources only some nodes declare."""


def check_launcher(launcher: str, mode: str) -> None:
    """ConfigError, before anything starts, when `--launcher ray` cannot run: the one_process
    layout (`mode` sync: no roles of their own to place), or no Ray installed."""
    if launcher != "ray":
        return
    if mode == "sync":
        raise ConfigError(
            "--launcher ray starts the roles as Ray actors; --mode sync (workers.layout one_process) runs "
            "them in this process: drop one of them"
        )
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError("--launcher ray needs Ray: pip install 'llamarl[ray]'") from None


def worker_roles(config: RunConfig) -> list[tuple[str, str]]:
    """(role, worker id) of every worker of an async run, in the order they start."""
    workers = config.workers
    return [
        ("trainer", "trainer"),
        *[("generator", f"generator-{i}") for i in range(workers.num_generators)],
        *[("reward", f"reward-{i}") for i in range(workers.num_reward)],
    ]


def role_resources(config: RunConfig, split: CoreSplit, role: str) -> Resources:
    """The Ray request of one worker of `role`: its threads as CPUs, a GPU per cuda process."""
    by_role = {str(name): wanted for name, wanted in config.workers.ray_resources.items()}
    custom = dict(by_role.get(role, {}))
    if role == "trainer":
        ranks = config.trainer.ranks
        gpus = ranks if config.trainer.device == "cuda" else 0
        return Resources(split.trainer_threads * ranks, gpus, custom)
    if role == "generator":
        gpus = 1 if config.generation.device == "cuda" else 0
        return Resources(split.generator_threads, gpus, custom)
    return Resources(1, 0, custom)


def cpus_needed(config: RunConfig, split: CoreSplit) -> int:
    """CPUs every worker of the run asks for together."""
    return sum(role_resources(config, split, role).num_cpus for role, _ in worker_roles(config))


class RoleActor:
    """One role's process on a Ray node (created as `ray.remote(RoleActor)`, so this module
    imports without Ray). The actor's process holds the reservation; the child does the work."""

    def __init__(self, command: list[str], env: dict[str, str], cwd: str, log_path: str) -> None:
        # The node's environment (with what Ray set for this actor, CUDA_VISIBLE_DEVICES among
        # it) under the run's own variables. Sync actors run every call on the main thread, so
        # the child's die-with-parent arming lasts as long as the actor.
        with open(log_path, "ab") as log_file:
            self.process = supervise.start(
                command,
                env={**os.environ, **env},
                cwd=cwd,
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )

    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        return self.process.poll()

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()

    def stop(self, grace_s: float) -> int:
        """SIGTERM, `grace_s`, then SIGKILL of the child's tree (pids of this node); its code."""
        return supervise.stop(self.process, grace_s)


class RayProcess:
    """A role's child held by a `RoleActor`, seen from the launcher as a `WorkerProcess`. Once
    the child has ended (or its actor is lost) the actor is killed, freeing its resources for a
    restart; `returncode` is then the child's exit code."""

    def __init__(self, actor: Any, worker_id: str, request: Resources) -> None:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        self.actor = actor
        self.returncode: int | None = None
        self.pid = 0
        try:
            self.pid = ray.get(actor.pid.remote(), timeout=PLACE_TIMEOUT_S)
        except RayActorError as err:  # placed on a node that died before Ray knew: lost
            log.warning("role actor lost", worker_id=worker_id, error=str(err).splitlines()[0])
            self._finish(ACTOR_LOST)
        except GetTimeoutError:
            ray.kill(actor)
            raise ConfigError(
                f"workers: Ray placed no actor for {worker_id} ({request.num_cpus} CPUs, "
                f"{request.num_gpus} GPUs, resources {request.custom}) within "
                f"{PLACE_TIMEOUT_S:g} s; the cluster has {ray.cluster_resources()}: lower the "
                "threads or devices asked for, or add nodes"
            ) from None

    def _call(self, method: str, timeout_s: float, *args: Any) -> Any:
        """The actor's `method(*args)`; ACTOR_LOST when it is gone or does not answer within
        `timeout_s`."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            return ray.get(getattr(self.actor, method).remote(*args), timeout=timeout_s)
        except (RayActorError, GetTimeoutError) as err:
            log.warning("role actor lost", method=method, error=str(err).splitlines()[0])
            return ACTOR_LOST

    def _finish(self, code: int) -> int:
        import ray

        self.returncode = code
        ray.kill(self.actor)
        return code

    def poll(self) -> int | None:
        if self.returncode is None:
            code = self._call("poll", CALL_TIMEOUT_S)
            if code is not None:
                self._finish(code)
        return self.returncode

    def terminate(self) -> None:
        if self.returncode is None:
            self.actor.terminate.remote()  # stop_all stops each in turn after telling them all

    def stop(self, grace_s: float) -> int:
        if self.returncode is not None:
            return self.returncode
        return self._finish(self._call("stop", grace_s + STOP_MARGIN_S, grace_s))


class RaySpawner:
    """`spawn(role, worker_id)` of the Ray launcher: a new `RoleActor` for the worker, named
    `<run_id>.<worker_id>.<incarnation>` in the `llamarl` namespace (a restart is a new one)."""

    def __init__(self, config: RunConfig, split: CoreSplit, env: dict[str, str], config_path: str) -> None:
        self.config = config
        self.split = split
        # Only the run's own variables: the rest of this host's environment (PATH,
        # CUDA_VISIBLE_DEVICES) is not the node's to take.
        self.env = {name: value for name, value in env.items() if name.startswith("LLAMARL")}
        self.config_path = config_path
        self.cwd = os.getcwd()
        self.log_dir = Path(config.run_dir).resolve() / "logs"
        self.incarnations: dict[str, int] = {}

    def __call__(self, role: str, worker_id: str) -> RayProcess:
        import ray

        from llamarl.launch.local import worker_command

        incarnation = self.incarnations[worker_id] = self.incarnations.get(worker_id, -1) + 1
        request = role_resources(self.config, self.split, role)
        actor = (
            ray.remote(RoleActor)
            .options(
                name=f"{self.config.run_id}.{worker_id}.{incarnation}",
                namespace=NAMESPACE,
                num_cpus=request.num_cpus,
                num_gpus=request.num_gpus,
                resources=request.custom or None,
                max_restarts=0,  # the Supervisor restarts, within workers.max_restarts
            )
            .remote(
                worker_command(self.config, role, worker_id, self.config_path),
                self.env,
                self.cwd,
                str(self.log_dir / f"{worker_id}.log"),
            )
        )
        process = RayProcess(actor, worker_id, request)
        log.info(
            "role actor",
            worker_id=worker_id,
            pid=process.pid,
            incarnation=incarnation,
            num_cpus=request.num_cpus,
            num_gpus=request.num_gpus,
        )
        return process


def connect(address: str | None, num_cpus: int) -> None:
    """Join the Ray cluster at `address` ("auto" when RAY_ADDRESS is set and none is given), or
    start a local instance of `num_cpus` CPUs (`ray.shutdown()` stops it)."""
    import ray

    if address is None and "RAY_ADDRESS" in os.environ:
        address = "auto"
    sigterm = signal.getsignal(signal.SIGTERM)  # ray.init replaces the launcher's
    try:
        if address is None:
            ray.init(
                address="local",
                namespace=NAMESPACE,
                num_cpus=num_cpus,
                object_store_memory=OBJECT_STORE_BYTES,
                include_dashboard=False,
                logging_level=logging.WARNING,
            )
        else:
            ray.init(address=address, namespace=NAMESPACE, logging_level=logging.WARNING)
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    log.info("ray", address=address or "local", resources=ray.cluster_resources())


@contextmanager
def ray_spawn(
    config: RunConfig,
    split: CoreSplit,
    env: dict[str, str],
    config_path: str,
    address: str | None,
) -> Iterator[RaySpawner]:
    """The spawn function of a run on Ray, connected for the block. A local instance of this
    launcher's (as many CPUs as the machine or the roles need, whichever is more, so every actor
    is placed) is shut down at the end; a cluster's is only disconnected from."""
    import ray

    from llamarl.launch.cores import usable_cores

    connect(address, max(usable_cores(), cpus_needed(config, split)))
    try:
        yield RaySpawner(config, split, env, config_path)
    finally:
        ray.shutdown()
