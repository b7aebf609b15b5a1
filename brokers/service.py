"""The broker as a process: read config, bind, serve, exit 0 on SIGTERM or SIGINT.

Rejected frames are counted in Redis (`rejected` hash, source `broker`) when the run has a Redis
URL, and always in the broker's own counters (answered to `STATS` on the work socket).
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
from pathlib import Path
from types import FrameType

import structlog
import zmq

from brokers.broker import Broker
from llamarl.config import RunConfig, apply_overrides, load_config, parse_config
from llamarl.curve import load_curve
from llamarl.errors import ConfigError
from llamarl.limits import RateLimiter, Rejections
from llamarl.net import BrokerEndpoints, free_port_block
from llamarl.observe.log import configure_logging
from llamarl.store import RedisStore

BIND_ATTEMPTS = 20
"""Blocks a broker without a port tries before it gives up (each bind is the check itself)."""


def build_broker(config: RunConfig, store: RedisStore | None, port: int) -> Broker:
    sink = None if store is None else (lambda r, n: store.count_rejected("broker", r, n))
    section = config.broker
    return Broker(
        BrokerEndpoints(section.host, port),
        run_id=config.run_id,
        hwm=section.hwm,
        max_queue=section.max_queue,
        max_message_bytes=section.max_message_bytes,
        max_queue_bytes=section.max_queue_bytes,
        rejections=Rejections("broker", sink, log_interval_s=section.reject_log_interval_s),
        rate_limit=RateLimiter(section.rate_limit_per_s, section.rate_burst),
        curve=load_curve(section.curve_keys),
    )


def _port_taken(err: zmq.ZMQError) -> bool:
    return err.errno == errno.EADDRINUSE


def bind_broker(config: RunConfig, store: RedisStore | None, port_file: Path | None) -> Broker:
    """The broker bound on `broker.port`; with none set and a `port_file` to report in, on the
    first free block it binds itself (no window between choosing a port and binding it), whose
    base port it then writes to `port_file`."""
    port = config.broker.port
    if port is not None:
        try:
            return build_broker(config, store, port)
        except zmq.ZMQError as err:
            if not _port_taken(err):
                raise
            raise ConfigError(
                f"broker.port {port}: ports {port}..{port + 3} must be free "
                f"({os.strerror(errno.EADDRINUSE)}); "
                "choose another broker.port"
            ) from None
    if port_file is None:
        raise ConfigError("broker.port: a standalone broker needs a port (or LLAMARL_BROKER)")
    for _ in range(BIND_ATTEMPTS):
        try:
            broker = build_broker(config, store, free_port_block(config.broker.host))
        except zmq.ZMQError as err:
            if not _port_taken(err):
                raise
            continue
        staged = port_file.with_suffix(".partial")
        staged.write_text(str(broker.endpoints.port))
        staged.replace(port_file)  # whole or absent: the launcher never reads half a number
        return broker
    raise OSError(f"no free block of 4 ports on {config.broker.host} in {BIND_ATTEMPTS} tries")


def run_broker(config: RunConfig, port_file: Path | None = None) -> int:
    store = RedisStore(config.redis.url, config.run_id, config.redis.connect_deadline_s) if config.redis.url else None
    broker = bind_broker(config, store, port_file)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        broker.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    broker.serve()
    if store is not None:
        store.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llamarl worker broker", description=__doc__)
    parser.add_argument("--config", help="run config YAML (defaults apply when omitted)")
    parser.add_argument("--worker-id", default="broker")
    parser.add_argument("--log-format", choices=["auto", "console", "json"], default="auto")
    parser.add_argument(
        "--port-file",
        type=Path,
        help="with no broker.port: bind a free block and write its base port to this file",
    )
    parser.add_argument("overrides", nargs="*", help="section.field=value overrides")
    args = parser.parse_args(argv)
    configure_logging("broker", args.worker_id, args.log_format)
    try:
        apply_overrides(args.overrides)
        config = load_config(args.config) if args.config else parse_config({})
        return run_broker(config, args.port_file)
    except ConfigError as err:
        structlog.get_logger().error("config error", error=str(err))
        print(f"config error: {err}", file=sys.stderr)
        return 2
