"""Whether a run has finished, by its Redis, asked before anything of the run is written: a
launcher or a role started again on a finished run (`docker compose up` after the end, `llamarl
run --resume`) says so in one line and leaves its files and its Redis as they are. Also the
launcher's first look at a Redis it is given (`check_redis`)."""

from __future__ import annotations

import sys
from pathlib import Path

from brokers.redis_server import RedisServer
from llamarl.config import RunConfig
from llamarl.errors import ConfigError
from llamarl.store import RedisStore, without_password
from llamarl.store.refusals import RedisUnavailableError


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


def run_finished(config: RunConfig, resume: bool) -> bool:
    """Whether the run has finished (then said in one line), by its Redis: the one `redis.url`
    names (a ConfigError without --resume: a new run cannot start there under this run_id), or
    on --resume the run's own, started alone on its data (only Redis's log is written)."""
    done = _run_finished(config, resume)
    if done:
        print(f"run {config.run_id} finished; nothing to resume (its results: {config.run_dir})", file=sys.stderr)
    return done


def _run_finished(config: RunConfig, resume: bool) -> bool:
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


def worker_finished(role: str, worker_id: str, config: RunConfig) -> bool:
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
