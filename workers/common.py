"""Process wiring shared by the role entry points (exit codes too); the roles are in llamarl.roles."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from collections.abc import Callable

import structlog
import torch

from llamarl.config import RunConfig, apply_overrides, load_config, parse_config
from llamarl.errors import ConfigError
from llamarl.launch import allocator, cores
from llamarl.observe.log import configure_logging
from llamarl.observe.metrics_export import serve_metrics
from llamarl.roles.base import RoleResult
from llamarl.roles.build import connect
from llamarl.roles.runtime import RoleRuntime
from llamarl.store import RedisStore
from llamarl.training.memory_check import trainer_memory

log = structlog.get_logger(__name__)


def parse_worker_args(role: str, argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"llamarl worker {role}")
    parser.add_argument("--config", help="run config YAML (defaults apply when omitted)")
    parser.add_argument("--worker-id", default=os.environ.get("LLAMARL_WORKER_ID"))
    parser.add_argument("--log-format", choices=["auto", "console", "json"], default="auto")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    parser.add_argument("overrides", nargs="*", help="section.field=value overrides")
    return parser.parse_args(argv)


def load_worker_config(role: str, args: argparse.Namespace) -> RunConfig:
    """The config the worker's arguments name, with their overrides; sets torch's threads to the
    role's (a trainer's shared by its ranks). ConfigError when invalid, or a trainer won't fit."""
    apply_overrides(args.overrides)
    config = load_config(args.config) if args.config else parse_config({})
    torch.set_num_threads(cores.role_threads(config, role))
    return trainer_memory(config, allocator.return_freed_memory) if role == "trainer" else config


def finished(role: str, worker_id: str, config: RunConfig) -> bool:
    """Whether the run's Redis says it finished, then said in one line: a role started on a
    finished run leaves it as it is (its files, its Redis) instead of starting it again."""
    if config.redis.url is None:  # connect() says what is missing
        return False
    store = RedisStore(config.redis.url, config.run_id, config.redis.connect_deadline_s)
    try:
        done = store.run_status() == "finished"
    finally:
        store.close()
    if done:
        print(f"{role} {worker_id}: run {config.run_id} finished; nothing to do", file=sys.stderr)
    return done


def run_worker(role: str, argv: list[str] | None, body: Callable[[RoleRuntime], RoleResult]) -> int:
    """Connect the role's runtime, run `body`, always close. Exit codes (one line each): 0 done,
    or the run had finished already; 2 bad config, or Redis refused this client or its writes
    (`llamarl.store.refusals`); 3 Redis or the broker gone past its deadline, Redis unable to
    serve for now, or a push blocked past its timeout."""
    args = parse_worker_args(role, argv)
    worker_id = args.worker_id or f"{role}-{socket.gethostname()[:32]}-{os.getpid()}"
    configure_logging(role, worker_id, args.log_format)
    try:
        config = load_worker_config(role, args)
        if finished(role, worker_id, config):
            return 0
        runtime = connect(role, config, worker_id)
        runtime.register()
        if args.metrics_port is not None:
            serve_metrics(runtime.gauges, runtime.identity(), args.metrics_port)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    except ConnectionError as err:
        print(f"{role} {worker_id}: {err}", file=sys.stderr)
        return 3
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda num, _: runtime.request_stop(signal.Signals(num).name))
    try:
        log.info("finished", units=body(runtime).units)
    except ConfigError as err:  # found while building the role (a model path, a transport)
        print(f"config error: {err}", file=sys.stderr)
        return 2
    except (ConnectionError, TimeoutError) as err:  # Redis or the broker gone for too long
        log.error("giving up", error=str(err))
        print(f"{role} {worker_id}: {err}", file=sys.stderr)
        return 3
    finally:
        runtime.close()
        runtime.store.close()
    return 0
