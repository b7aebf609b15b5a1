"""`llamarl run` of the `one_process` layout (set, `--mode sync`, or chosen by auto), once the
launcher has prepared the run directory: the run's Redis (a private one on RUN_DIR/redis unless
`redis.url` names one), then every role in this process (`llamarl.launch.one_process`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from brokers.redis_server import RedisServer
from brokers.run_status import check_redis
from llamarl.config import RunConfig
from llamarl.launch.one_process import run_in_turn


def run_prepared(config: RunConfig, config_path: str, run_dir: Path) -> int:
    """Run `config` in its prepared `run_dir`; its summary printed as one JSON line. Exit 0 at its
    last step, 130 when a signal stopped it first (as the async launcher's Ctrl-C)."""
    server = RedisServer(run_dir / "redis").start() if config.redis.url is None else None
    try:
        url = server.url if server is not None else str(config.redis.url)
        check_redis(config, url)
        summary = run_in_turn(config, url)
    finally:
        if server is not None:
            server.stop()
    print(json.dumps(summary), flush=True)
    if summary["steps"] < config.trainer.num_steps:
        print(f"run stopped; carry on with: llamarl run {config_path} --resume", file=sys.stderr)
        return 130
    return 0
