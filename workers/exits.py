"""How a worker process ends when it cannot go on: one line on stderr, never a traceback, and an
exit code the launcher and an orchestrator read (2: the configuration, which a restart cannot
mend; 3: Redis or the broker gone or unable past its deadline, which a restart may)."""

from __future__ import annotations

import sys

import structlog

from llamarl.errors import ConfigError

log = structlog.get_logger(__name__)


def gave_up(role: str, worker_id: str, err: Exception) -> int:
    """Say why the worker ends in one line; its exit code (2 its config, 3 Redis or the broker)."""
    if isinstance(err, ConfigError):
        print(f"config error: {err}", file=sys.stderr)
        return 2
    log.error("giving up", error=str(err))
    print(f"{role} {worker_id}: {err}", file=sys.stderr)
    return 3
