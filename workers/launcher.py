"""`llamarl run CONFIG`: a whole job on one machine. The roles are laid out (`llamarl.launch.layout`);
one_process (also `--mode sync`) runs them all in this process (workers/one_process.py). Otherwise
a private Redis and broker start (when the config names no Redis URL), then each role as
`python -m workers.<role>` under `llamarl.launch.local`, or with `--launcher ray` in a Ray actor
(`llamarl.launch.ray_actors`). A launch is a fresh run: it clears the run directory's results,
checkpoints and embedded Redis data; `--resume` keeps them and carries on a stopped run (Redis from
its AOF, the trainer from its newest checkpoint); on a finished run it says so in one line, exits 0
and changes nothing.
"""

from __future__ import annotations

import argparse
import signal
import sys
from types import FrameType

from brokers.embedded import EmbeddedServices
from brokers.run_status import check_redis, run_finished
from llamarl.config import load_config
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
from llamarl.observe.log import configure_logging
from workers.one_process import run_prepared


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(args: argparse.Namespace) -> int:
    # SIGTERM, and SIGINT even where the shell ignores it (background jobs), stop every child.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    config = load_config(args.config)
    configure_logging("launcher", "launcher", args.log_format)
    if args.mode == "sync":  # the same program as the one_process layout
        config = config.model_copy(update={"workers": config.workers.model_copy(update={"layout": "one_process"})})
    mode = "sync" if config.workers.layout == "one_process" else "async"
    check_launcher(args.launcher, mode)
    preflight(config, mode, args.launcher)  # before any process starts, let alone restarts
    services = None
    try:  # a service that does not start is one line (llamarl.commands), never a traceback
        if run_finished(config, args.resume):  # says so, before anything of the run is written
            return 0
        run_dir = prepare_run_dir(config, resume=args.resume)
        plan = plan_layout(config, args.config, args.launcher)
        if plan.kind == "one_process":  # set, --mode sync, or auto's choice: in this process
            return run_prepared(plan.config, args.config, run_dir)
        config, split = plan.config, plan.split
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
