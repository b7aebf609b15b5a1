"""Process wiring shared by the role entry points (exit codes too); the roles are in llamarl.roles."""

from __future__ import annotations

import argparse
import os
import signal
import socket
from collections.abc import Callable

import structlog
import torch

from brokers.run_status import worker_finished
from llamarl.config import RunConfig, apply_overrides, load_config, parse_config
from llamarl.errors import ConfigError
from llamarl.launch import allocator, cores
from llamarl.observe.log import configure_logging
from llamarl.observe.metrics_export import serve_metrics
from llamarl.roles.base import RoleResult
from llamarl.roles.build import connect
from llamarl.roles.runtime import RoleRuntime
from llamarl.training.memory_check import trainer_memory
from workers.exits import gave_up

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


def run_worker(role: str, argv: list[str] | None, body: Callable[[RoleRuntime], RoleResult]) -> int:
    """Connect the role's runtime, run `body`, always close. Exit codes (one line each): 0 done or
    finished before; 2 bad config, or Redis refusing us (`llamarl.store.refusals`); 3 Redis or the
    broker gone past its deadline or unable for now, or a push blocked past its timeout."""
    args = parse_worker_args(role, argv)
    worker_id = args.worker_id or f"{role}-{socket.gethostname()[:32]}-{os.getpid()}"
    configure_logging(role, worker_id, args.log_format)
    try:
        config = load_worker_config(role, args)
        if worker_finished(role, worker_id, config):
            return 0
        runtime = connect(role, config, worker_id)
        runtime.register()  # refused: nothing of it to close in Redis
        if args.metrics_port is not None:
            serve_metrics(runtime.gauges, runtime.identity(), args.metrics_port)
    except (ConfigError, ConnectionError) as err:
        return gave_up(role, worker_id, err)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda num, _: runtime.request_stop(signal.Signals(num).name))
    try:
        log.info("finished", units=body(runtime).units)
    except (ConfigError, ConnectionError, TimeoutError) as err:  # a model path; Redis gone too long
        return gave_up(role, worker_id, err)
    finally:
        runtime.close()
        runtime.store.close()
    return 0
