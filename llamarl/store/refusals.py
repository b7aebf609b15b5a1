"""What a Redis that answers a client without serving it means, in one line with what to do.

redis-py raises these answers as ResponseError or ConnectionError subclasses: DENIED (protected
mode: no password, a client from another host), NOAUTH and WRONGPASS (the password), NOPERM (an
ACL user not allowed a command), READONLY (a replica), OOM (used memory above maxmemory), MISCONF
and MASTERDOWN (writes refused for now) and LOADING (the data set still loading; retried like a
lost connection until the deadline). Left alone, one would end a worker in a traceback or be
called unreachable. A mistake in the settings of Redis or of redis.url becomes a ConfigError
(exit 2: starting again cannot help); a Redis unable to serve for now a `RedisUnavailableError`,
a ConnectionError (exit 3 for a worker, as an unreachable one).
"""

from __future__ import annotations

from urllib.parse import urlsplit

import redis

from llamarl.errors import ConfigError, LlamarlError


class RedisUnavailableError(LlamarlError, ConnectionError):
    """Redis answered, but cannot serve for now: out of memory, or still loading its data."""


def refusal(err: redis.RedisError, url: str, shown: str, what: str) -> LlamarlError | None:
    """The error to raise for Redis's answer `err` to a call (`what`) on `url` (`shown` without
    its password); None for an answer that is not a refusal (a script's error, a bug)."""
    if isinstance(err, redis.AuthenticationError):
        if urlsplit(url).password is None:
            return ConfigError(
                f"redis.url {shown}: Redis asks for a password (NOAUTH) and redis.url has none; "
                "put it there: redis://:PASSWORD@host:port/db"
            )
        return ConfigError(f"redis.url {shown}: Redis refused the password (WRONGPASS); set the right one in redis.url")
    if str(err).startswith("DENIED"):
        return ConfigError(
            f"redis.url {shown}: Redis refused this client (DENIED: protected mode, which serves only its own "
            "host while Redis has no password); give Redis a password (requirepass) and put it in redis.url"
        )
    if isinstance(err, redis.ReadOnlyError):
        return ConfigError(f"redis.url {shown}: a read-only replica (READONLY); point redis.url at its primary")
    if isinstance(err, redis.exceptions.NoPermissionError):
        return ConfigError(
            f"redis.url {shown}: its user may not run {what} (NOPERM: the ACL); allow it every command llamarl "
            "uses (docs/security.md) or use another user"
        )
    if str(err).startswith("MISCONF") or isinstance(err, redis.exceptions.MasterDownError):
        return RedisUnavailableError(
            f"redis.url {shown}: Redis refuses writes for now ({str(err)[:80]}) during {what}; see its log"
        )
    if isinstance(err, redis.exceptions.OutOfMemoryError):
        return RedisUnavailableError(
            f"redis.url {shown}: Redis is out of memory (OOM: used memory above its maxmemory) during {what}; "
            "free memory there or raise its maxmemory"
        )
    return None


def still_loading(shown: str, deadline_s: float, what: str) -> RedisUnavailableError:
    """A Redis that answered LOADING to every try of `what` until the deadline."""
    return RedisUnavailableError(
        f"redis.url {shown}: Redis was still loading its data after {deadline_s:g} s during {what}; "
        "start again once it has (a worker waits redis.connect_deadline_s for it)"
    )
