"""`llamarl worker trainer`: gather scored groups, enforce staleness, train, publish versions
(`llamarl.roles.trainer`); writes RUN_DIR/summary.json and the final model when it ends.

Started by torchrun with several ranks (`trainer.ranks`), rank 0 is that trainer and every other
rank follows it (`llamarl.roles.trainer_follower`)."""

from __future__ import annotations

import os
import signal

import structlog

from brokers.run_status import worker_finished
from llamarl.errors import ConfigError
from llamarl.launch import supervise
from llamarl.launch.allocator import keep_freed_memory
from llamarl.observe.log import configure_logging
from llamarl.roles import build
from llamarl.roles.base import RoleResult, run_role
from llamarl.roles.runtime import RoleRuntime
from llamarl.store import RedisStore
from llamarl.training.parallel import TrainerRanks, leaving
from workers.common import load_worker_config, parse_worker_args, run_worker
from workers.exits import gave_up

log = structlog.get_logger(__name__)


def train(runtime: RoleRuntime) -> RoleResult:
    config = runtime.config
    ranks = TrainerRanks.from_env(config.trainer.device, config.trainer.ranks_timeout_s, config.run_id)
    with leaving(ranks):
        return run_role(build.trainer(runtime, ranks=ranks))


def run_rank(argv: list[str] | None) -> int:
    """A rank other than 0: follow rank 0 until it says stop (on a finished run, exit 0 at once,
    as rank 0 does). SIGTERM does not end it: torchrun signals every rank, and rank 0 then stops
    the others once it has checkpointed."""
    args = parse_worker_args("trainer", argv)
    rank = int(os.environ["RANK"])
    worker_id = f"{args.worker_id or 'trainer'}-rank{rank}"
    configure_logging("trainer", worker_id, args.log_format)
    try:
        config = load_worker_config("trainer", args)
        if worker_finished("trainer", worker_id, config):  # before meeting the other ranks
            return 0
    except (ConfigError, ConnectionError) as err:
        return gave_up("trainer", worker_id, err)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(
            signum, lambda num, _: log.info("signal; waiting for rank 0 to stop", signal=signal.Signals(num).name)
        )
    ranks = TrainerRanks.from_env(config.trainer.device, config.trainer.ranks_timeout_s, config.run_id)
    assert ranks is not None, "RANK > 0 under a world of one"
    assert config.redis.url is not None, "the launcher gives every trainer rank redis.url"
    store = RedisStore(config.redis.url, config.run_id, config.redis.connect_deadline_s)
    try:
        with leaving(ranks):
            run_role(build.trainer_follower(config, ranks, store))
    finally:
        store.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    keep_freed_memory()  # before training allocates (llamarl/launch/allocator.py)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        supervise.die_with_parent()  # torchrun's: a SIGKILLed torchrun leaves no rank behind
    if int(os.environ.get("RANK", "0")) > 0:
        return run_rank(argv)
    return run_worker("trainer", argv, train)


if __name__ == "__main__":
    raise SystemExit(main())
