"""`llamarl run CONFIG`: everything on one machine.

`--mode sync` runs the synchronous baseline in this process (all cores). The async mode starts a
private Redis and broker for the run in its run directory (when the config names no Redis URL),
checks that both answer, and stops them at the end. Either way the last stdout line is a JSON
summary.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from llamarl.bus import query_broker_stats
from llamarl.config import RunConfig, dump_config, load_config
from llamarl.log import configure_logging
from llamarl.sync_run import run_sync
from llamarl.version_store import VersionStore
from workers.embedded import EmbeddedServices


def health(services: EmbeddedServices, config: RunConfig) -> dict[str, object]:
    store = VersionStore(services.redis_url, config.run_id, config.redis.connect_deadline_s)
    try:
        return {
            "redis_url": services.redis_url,
            "redis_ok": store.ping(),
            "broker": str(services.endpoints),
            "broker_stats": query_broker_stats(services.endpoints),
        }
    finally:
        store.close()


def main(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    configure_logging("launcher", "launcher", args.log_format)
    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(config))
    if args.mode == "sync":
        print(json.dumps(run_sync(config)), flush=True)
        return 0
    with EmbeddedServices(run_dir, config.run_id) as services:
        print(json.dumps(health(services, config)), flush=True)
    return 0
