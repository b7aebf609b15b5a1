"""The broker as a process: read config, bind, serve, exit 0 on SIGTERM or SIGINT.

Rejected frames are counted in Redis (`rejected` hash, source `broker`) when the run has a Redis
URL, and always in the broker's own counters (answered to `STATS` on the work socket).
"""

from __future__ import annotations

import argparse
import errno
import signal
import sys
from types import FrameType

import structlog
import zmq

from brokers.broker import Broker
from llamarl.config import RunConfig, apply_overrides, load_config, parse_config
from llamarl.curve import load_curve
from llamarl.errors import ConfigError
from llamarl.limits import RateLimiter, Rejections
from llamarl.net import BrokerEndpoints
from llamarl.observe.log import configure_logging
from llamarl.store import RedisStore


def build_broker(config: RunConfig, store: RedisStore | None) -> Broker:
    if config.broker.port is None:
        raise ConfigError("broker.port: a standalone broker needs a port (or LLAMARL_BROKER)")
    sink = None if store is None else (lambda r, n: store.count_rejected("broker", r, n))
    section = config.broker
    return Broker(
        BrokerEndpoints(config.broker.host, config.broker.port),
        run_id=config.run_id,
        hwm=config.broker.hwm,
        max_queue=config.broker.max_queue,
        max_message_bytes=config.broker.max_message_bytes,
        max_queue_bytes=config.broker.max_queue_bytes,
        rejections=Rejections("broker", sink, log_interval_s=section.reject_log_interval_s),
        rate_limit=RateLimiter(section.rate_limit_per_s, section.rate_burst),
        curve=load_curve(section.curve_keys),
    )


def run_broker(config: RunConfig) -> int:
    store = (
        RedisStore(config.redis.url, config.run_id, config.redis.connect_deadline_s)
        if config.redis.url
        else None
    )
    try:
        broker = build_broker(config, store)
    except zmq.ZMQError as err:
        if err.errno != errno.EADDRINUSE:
            raise
        port = int(config.broker.port or 0)
        raise ConfigError(
            f"broker.port {port}: ports {port}..{port + 3} must be free ({err.strerror}); "
            "choose another broker.port"
        ) from None

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
    parser.add_argument("overrides", nargs="*", help="section.field=value overrides")
    args = parser.parse_args(argv)
    configure_logging("broker", args.worker_id, args.log_format)
    try:
        apply_overrides(args.overrides)
        config = load_config(args.config) if args.config else parse_config({})
        return run_broker(config)
    except ConfigError as err:
        structlog.get_logger().error("config error", error=str(err))
        print(f"config error: {err}", file=sys.stderr)
        return 2
