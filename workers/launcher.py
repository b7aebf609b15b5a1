"""`llamarl run CONFIG`: a whole job on one machine.

`--mode sync` runs the synchronous baseline in this process (`llamarl.launch.sync_run`). The default async
mode lays the roles out (`llamarl.launch.layout`), starts a private Redis and broker (when the config
names no Redis URL), then each role as `python -m workers.<role>` under `llamarl.launch.local`; with
`--launcher ray` each role's process is held by a Ray actor instead (`llamarl.launch.ray_actors`).
A launch is a fresh run: it clears the run directory's results, checkpoints and embedded Redis data;
`--resume` keeps them and carries on a stopped run (Redis from its AOF, the trainer from its newest
checkpoint); on a finished run it says so in one line, exits 0 and changes nothing.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType

from brokers.embedded import EmbeddedServices
from brokers.redis_server import RedisServer
from llamarl.config import RunConfig, load_config
from llamarl.errors import ConfigError
from llamarl.launch.layout import plan_layout
from llamarl.launch.local import (
    local_spawn,
    preflight,
    prepare_run_dir,
    run_roles,
    worker_env,
)
from llamarl.launch.ray_actors import check_launcher, ray_spawn
from llamarl.launch.startup import startup_summary
from llamarl.launch.sync_run import run_sync_here
from llamarl.observe.log import configure_logging
from llamarl.store import RedisStore, without_password
from llamarl.store.refusals import RedisUnavailableError


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def check_redis(config: RunConfig, url: str, timeout_s: float = 3.0) -> None:
    """ConnectionError naming `redis.url` unless Redis answers within `timeout_s`, or when it
    cannot serve for now (`RedisUnavailableError`); ConfigError when it refuses this client or
    its writes (`llamarl.store.refusals`)."""
    probe = RedisStore(url, config.run_id, connect_deadline_s=timeout_s, log_retries=False)
    try:
        probe.ping()
        probe.check_writes()
    except RedisUnavailableError:
        raise
    except ConnectionError as err:
        raise ConnectionError(
            f"redis.url {without_password(url)}: no answer within {timeout_s:g} s ({err}); start Redis there or fix "
            "redis.url"
        ) from None
    finally:
        probe.close()


def _finished_at(config: RunConfig, url: str) -> bool:
    """Whether the Redis at `url` says the run finished, once `check_redis` passes."""
    check_redis(config, url)
    probe = RedisStore(url, config.run_id, connect_deadline_s=3.0, log_retries=False)
    try:
        return probe.run_status() == "finished"
    finally:
        probe.close()


def finished(config: RunConfig, resume: bool) -> bool:
    """Whether the run has finished, by its Redis: the one `redis.url` names (a ConfigError
    without --resume: a new run cannot start there under this run_id), or on --resume the run's
    own, started alone on its data (only Redis's log is written)."""
    if config.redis.url is not None:
        url = str(config.redis.url)
        done = _finished_at(config, url)
        if done and not resume:
            raise ConfigError(
                f"run_id {config.run_id}: that run finished in the Redis at {without_password(url)}; "
                "set another run_id (or LLAMARL_RUN_ID) to start a new run there"
            )
        return done
    directory = Path(config.run_dir) / "redis"
    if not resume or not directory.is_dir():
        return False  # a new run: its Redis data is cleared
    server = RedisServer(directory).start()
    try:
        return _finished_at(config, server.url)
    finally:
        server.stop()


def main(args: argparse.Namespace) -> int:
    # SIGTERM, and SIGINT even where the shell ignores it (background jobs), stop every child.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    config = load_config(args.config)
    configure_logging("launcher", "launcher", args.log_format)
    check_launcher(args.launcher, args.mode)
    preflight(config, args.mode, args.launcher)  # before any process starts, let alone restarts
    if args.mode == "sync":  # the lock-step loop, for benchmarks (no checkpoints, no ledger)
        return run_sync_here(config, args.resume)
    try:
        if finished(config, args.resume):  # before anything of the run is written
            print(f"run {config.run_id} finished; nothing to resume (its results: {config.run_dir})", file=sys.stderr)
            return 0
    except ConnectionError as err:
        print(f"run failed: {err}", file=sys.stderr)
        return 1
    run_dir = prepare_run_dir(config, resume=args.resume)
    plan = plan_layout(config, args.config, args.launcher)
    config, split = plan.config, plan.split
    services = None
    try:  # a service that does not start is one line (llamarl.commands), never a traceback
        if config.redis.url is None:
            services = EmbeddedServices.for_run(config, run_dir).start()
        env = worker_env(split, (services.env() if services is not None else {}) | plan.overrides)
        url = services.redis_url if services is not None else str(config.redis.url)
        check_redis(config, url)
        # What will run, once it can: a bad input before this point is its one line alone.
        print(startup_summary(config, plan.kind), file=sys.stderr, flush=True)
        if args.launcher == "ray":
            with ray_spawn(config, split, env, args.config, args.ray_address) as actors:
                return run_roles(config, url, actors, split, services)
        spawn = local_spawn(config, run_dir, env, args.config)
        return run_roles(config, url, spawn, split, services)
    except ConnectionError as err:
        print(f"run failed: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"run stopped; carry on with: llamarl run {args.config} --resume", file=sys.stderr)
        raise
    finally:
        if services is not None:
            services.stop()
