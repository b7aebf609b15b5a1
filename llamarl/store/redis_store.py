"""The run's shared state in Redis: policy version, admission gate, leases, ledger, registry.

Key schema (all under `llamarl:<run_id>:`; see docs/redis-keys.md):
  policy_version          string  latest published policy version (only ever increases)
  version_offset          string  published version less versions trained (set by each trainer resume)
  version                 hash    metadata of that version: num_bytes, checksum, transport, ...
  version_publish_id      string  id of the publish call that set it (a retried publish is a no-op)
  ledger                  hash    issued, trained, dropped_stale, skipped, reissued, duplicate,
                                  reopened
  tickets                 hash    ticket_id -> open | trained | dropped_stale | skipped (at or
                                  above the floor)
  attempts                hash    ticket_id -> attempt number (0 first, +1 per reissue)
  ticket_floor            string  every ticket below it has ended; its entries were compacted
  leases                  zset    open ticket_id scored by lease expiry (Redis time, ms)
  lease_owner             hash    ticket_id -> worker_id holding the lease
  workers                 set     every worker_id that ever registered
  worker:<worker_id>      hash    role, pid, host, status, started_at, last_seen; expires at TTL
                                  (status stopped: kept, no expiry)
  rejected                hash    <source>.<reason> -> rejected message count
  run_status              string  running | finished (set by the trainer; workers exit on it)
  evaluation_claims       hash    version -> chunks of its held-out evaluation ever claimed
  evaluation_claimers     hash    <version>:<chunk> -> JSON [attempt, claimer, its registration's pid]
                                  while the chunk is claimed and not in
  evaluations             list    JSON of each evaluated chunk
Every multi-key update is one Lua script, so concurrent workers never see a half-done change.
Calls retry a lost connection with bounded, logged backoff until `connect_deadline_s` runs out
(a Redis loading its data too); a refusal (`llamarl.store.refusals`) is one error at once. A retry
of a publish whose reply was lost is recognised by its id, not refused as stale.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis
import structlog

from llamarl.errors import StaleVersionError
from llamarl.store import lua
from llamarl.store.records import (
    LEDGER_FIELDS,
    OUTCOMES,
    EvaluationClaim,
    Ticket,
    WorkerBeat,
    WorkerInfo,
    open_tickets,
)
from llamarl.store.refusals import refusal, still_loading

log = structlog.get_logger(__name__)
T = TypeVar("T")


def without_password(url: str) -> str:
    """`url` with its password (if any) shown as ***, for printing."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


class RedisStore:
    """The `Store` on Redis: one instance per process (redis-py pools connections)."""

    def __init__(self, url: str, run_id: str, connect_deadline_s: float = 30.0, *, log_retries: bool = True) -> None:
        self.run_id = run_id
        self.url = url
        # A warning per retry suits a worker's log; a probe that says it once, in words, turns it off.
        self.log_retries = log_retries
        self.prefix = f"llamarl:{run_id}:"
        self.connect_deadline_s = connect_deadline_s
        # redis-py's stubs type every reply as bytes | str; decode_responses makes them str.
        self.client: Any = redis.Redis.from_url(url, decode_responses=True, socket_timeout=10, socket_connect_timeout=5)
        self._publish = self.client.register_script(lua.PUBLISH_VERSION)
        self._claim = self.client.register_script(lua.CLAIM_TICKETS)
        self._renew = self.client.register_script(lua.RENEW_LEASES)
        self._end = self.client.register_script(lua.END_TICKETS)
        self._reopen = self.client.register_script(lua.REOPEN_TICKET)
        self._expire = self.client.register_script(lua.EXPIRE_LEASES)
        self._compact = self.client.register_script(lua.COMPACT_TICKETS)
        self._claim_chunk = self.client.register_script(lua.CLAIM_EVALUATION_CHUNK)
        self._awaited = self.client.register_script(lua.AWAITED_EVALUATIONS)
        self._add_evaluation = self.client.register_script(lua.ADD_EVALUATION)

    def key(self, name: str) -> str:
        return self.prefix + name

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one Redis operation, retrying connection loss with backoff up to the deadline."""
        deadline = time.monotonic() + self.connect_deadline_s
        delay = 0.05
        attempt = 0
        while True:
            try:
                return fn()
            except (redis.AuthenticationError, redis.ResponseError) as err:  # a refusal, not retried
                refused = refusal(err, self.url, without_password(self.url), what)
                if refused is None:
                    raise
                raise refused from None
            except (redis.ConnectionError, redis.TimeoutError) as err:
                attempt += 1
                if time.monotonic() + delay > deadline:
                    if isinstance(err, redis.BusyLoadingError):
                        raise still_loading(without_password(self.url), self.connect_deadline_s, what) from None
                    raise ConnectionError(
                        f"redis unreachable for {self.connect_deadline_s:.0f}s during {what}: {err}"
                    ) from None
                if self.log_retries:
                    log.warning("redis retry", op=what, attempt=attempt, error=str(err)[:120])
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def ping(self) -> bool:
        return bool(self._call("ping", self.client.ping))

    def check_writes(self) -> None:
        """Raise at once what Redis answers a write with (a read-only replica, Redis out of
        memory): a SET only if the key exists (XX) of a key no run holds, which stores nothing."""
        self._call("check writes", lambda: self.client.set(self.key("write_probe"), 1, xx=True))

    def has_keys(self) -> bool:
        """Whether this Redis holds any key of the run (a wrong run id holds none)."""
        return self._call(
            "scan run keys",
            lambda: next(self.client.scan_iter(match=f"{self.prefix}*", count=1000), None) is not None,
        )

    # -- policy versions -------------------------------------------------------------------
    def policy_version(self) -> int:
        """The latest published version, or -1 before the first publish."""
        raw = self._call("get version", lambda: self.client.get(self.key("policy_version")))
        return -1 if raw is None else int(raw)

    def publish_version(self, policy_version: int, meta: dict[str, Any]) -> None:
        """Record a new version; a version not above the current one is refused atomically."""
        pairs: list[Any] = ["policy_version", policy_version, "published_at", time.time()]
        for name, value in meta.items():
            pairs += [name, value]
        keys = [self.key("policy_version"), self.key("version"), self.key("version_publish_id")]
        args = [policy_version, uuid.uuid4().hex, *pairs]  # one id for this call and its retries
        accepted = self._call("publish version", lambda: self._publish(keys=keys, args=args))
        if not accepted:
            raise StaleVersionError(f"policy version {policy_version} is not above current {self.policy_version()}")

    def set_version_offset(self, offset: int) -> None:
        """Published version numbers less this are the versions trained (see the interface)."""
        key = self.key("version_offset")
        self._call("set version offset", lambda: self.client.set(key, offset))

    def version_meta(self) -> dict[str, str]:
        return self._call("version meta", lambda: self.client.hgetall(self.key("version")))

    def put_version_shard(self, rank: int, meta: dict[str, Any]) -> None:
        """One JSON field per rank of the `version_shards` hash."""
        value = json.dumps({k: str(v) for k, v in meta.items()})
        key = self.key("version_shards")
        self._call("put version shard", lambda: self.client.hset(key, str(rank), value))

    def version_shards(self) -> dict[int, dict[str, str]]:
        key = self.key("version_shards")
        raw = self._call("version shards", lambda: self.client.hgetall(key))
        return {int(rank): json.loads(value) for rank, value in raw.items()}

    # -- admission gate, leases, ledger ---------------------------------------------------
    def claim_tickets(
        self,
        worker_id: str,
        count: int,
        *,
        lease_s: float,
        max_staleness: int,
        prompts_per_step: int,
        total_tickets: int = 0,
        policy_version: int | None = None,
    ) -> list[Ticket]:
        """Up to `count` tickets in one round trip: expired ones to redo first, then new ones while
        the staleness gate is open for `policy_version`, the version the caller has loaded
        (None: the latest published)."""
        names = ("policy_version", "ledger", "tickets", "attempts", "leases", "lease_owner")
        keys = [self.key(n) for n in (*names, "version_offset")]
        loaded = -1 if policy_version is None else policy_version
        args: list[Any] = [
            worker_id,
            int(lease_s * 1000),
            max_staleness,
            prompts_per_step,
            total_tickets,
            count,
            loaded,
        ]
        got = self._call("claim tickets", lambda: self._claim(keys=keys, args=args))
        return [Ticket(int(t), int(attempt), bool(again)) for t, attempt, again in got]

    def renew_leases(self, tickets: Sequence[Ticket], lease_s: float) -> list[bool]:
        """Extend the leases these attempts still hold, in one round trip; False for each one that
        was lost (reissued to another worker) or whose ticket has ended."""
        if not tickets:
            return []
        keys = [self.key("tickets"), self.key("attempts"), self.key("leases")]
        args: list[Any] = [int(lease_s * 1000)]
        for ticket in tickets:
            args += [ticket.ticket_id, ticket.attempt]
        got = self._call("renew leases", lambda: self._renew(keys=keys, args=args))
        return [bool(held) for held in got]

    def end_tickets(self, outcomes: Sequence[tuple[int, str]], heartbeat: WorkerBeat | None = None) -> list[bool]:
        """End tickets (one of OUTCOMES) exactly once each and, in the same round
        trip, write the caller's heartbeat. False for a ticket that had already ended (counted
        as duplicate); KeyError, before anything changes, for one that was never issued."""
        args: list[Any] = []
        for ticket_id, outcome in outcomes:
            if outcome not in OUTCOMES:
                raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
            args += [ticket_id, outcome]
        keys = [self.key(n) for n in ("tickets", "leases", "lease_owner", "ledger", "ticket_floor")]

        def write() -> list[int]:
            pipe = self.client.pipeline(transaction=False)
            if args:
                self._end(keys=keys, args=args, client=pipe)
            if heartbeat is not None:
                self._heartbeat_commands(pipe, heartbeat)
            replies = pipe.execute(raise_on_error=False)
            if args and isinstance(replies[0], redis.ResponseError):
                if "unknown ticket" not in str(replies[0]):
                    raise replies[0]
                raise KeyError(f"{str(replies[0]).split('unknown ')[-1]} was never issued")
            return list(replies[0]) if args else []

        return [result == 1 for result in self._call("end tickets", write)]

    def reopen_ticket(self, ticket_id: int, *, requeue: bool) -> bool:
        """Undo `trained` for a ticket whose update a trainer crash lost (see lua.REOPEN_TICKET)."""
        keys = [self.key(n) for n in ("tickets", "leases", "lease_owner", "ledger")]
        args = [ticket_id, int(requeue)]
        return bool(self._call("reopen ticket", lambda: self._reopen(keys=keys, args=args)))

    def expire_leases(self) -> int:
        """Expire every open ticket's lease (see lua.EXPIRE_LEASES); how many."""
        keys = [self.key(n) for n in ("tickets", "leases")]
        return int(self._call("expire leases", lambda: self._expire(keys=keys, args=[])))

    def compact_tickets(self, limit: int) -> int:
        """Drop the entries of tickets below the lowest open one and below `limit`; returns the
        new floor. Safe below the tickets a checkpoint holds: nothing there can be reopened."""
        keys = [self.key(n) for n in ("tickets", "attempts", "ledger", "ticket_floor")]
        return int(self._call("compact tickets", lambda: self._compact(keys=keys, args=[limit])))

    def ended_tickets(self) -> tuple[int, set[int]]:
        """(floor, ids at or above it that have ended): every ticket below the floor has ended."""

        def read() -> tuple[int, set[int]]:
            pipe = self.client.pipeline(transaction=True)
            pipe.get(self.key("ticket_floor"))
            pipe.hgetall(self.key("tickets"))
            floor, states = pipe.execute()
            return int(floor or 0), {int(i) for i, state in states.items() if state != "open"}

        return self._call("ended tickets", read)

    def ledger(self) -> dict[str, int]:
        raw = self._call("ledger", lambda: self.client.hgetall(self.key("ledger")))
        counts = {name: int(raw.get(name, 0)) for name in LEDGER_FIELDS}
        counts["open"] = open_tickets(counts)
        return counts

    def ticket_state(self, ticket_id: int) -> str | None:
        return self._call("ticket state", lambda: self.client.hget(self.key("tickets"), str(ticket_id)))

    # -- worker registry ------------------------------------------------------------------
    def register_worker(self, worker_id: str, role: str, ttl_s: float, **fields: Any) -> None:
        now = time.time()
        mapping = {
            "role": role,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "status": "starting",
            "started_at": now,
            "last_seen": now,
            "incarnation": secrets.token_hex(8),  # another on each start, even under the same pid
            **fields,
        }
        key = self.key(f"worker:{worker_id}")

        def write() -> None:
            pipe = self.client.pipeline()
            pipe.delete(key)
            pipe.hset(key, mapping=mapping)
            pipe.pexpire(key, int(ttl_s * 1000))
            pipe.sadd(self.key("workers"), worker_id)
            pipe.execute()

        self._call("register worker", write)

    def heartbeat(self, worker_id: str, ttl_s: float, **fields: Any) -> None:
        def write() -> None:
            pipe = self.client.pipeline()
            self._heartbeat_commands(pipe, WorkerBeat(worker_id, ttl_s, fields))
            pipe.execute()

        self._call("heartbeat", write)

    def _heartbeat_commands(self, pipe: Any, beat: WorkerBeat) -> None:
        key = self.key(f"worker:{beat.worker_id}")
        pipe.hset(key, mapping={"last_seen": time.time(), **beat.fields})
        pipe.pexpire(key, int(beat.ttl_s * 1000))
        pipe.sadd(self.key("workers"), beat.worker_id)

    def record_stop(self, worker_id: str) -> None:
        key = self.key(f"worker:{worker_id}")

        def write() -> None:
            pipe = self.client.pipeline()
            pipe.hset(key, mapping={"status": "stopped", "last_seen": time.time()})
            pipe.persist(key)
            pipe.sadd(self.key("workers"), worker_id)
            pipe.execute()

        self._call("record stop", write)

    def workers(self) -> list[WorkerInfo]:
        """Every registered worker; `alive` is False once its heartbeat key has expired or it
        recorded a stop."""

        def read() -> list[WorkerInfo]:
            ids = sorted(self.client.smembers(self.key("workers")))
            pipe = self.client.pipeline()
            for worker_id in ids:
                pipe.hgetall(self.key(f"worker:{worker_id}"))
            infos = []
            for worker_id, fields in zip(ids, pipe.execute(), strict=True):
                stopped = fields.get("status") == "stopped"
                infos.append(WorkerInfo(worker_id, bool(fields) and not stopped, fields, stopped))
            return infos

        return self._call("workers", read)

    # -- run status ------------------------------------------------------------------------
    def set_run_status(self, status: str) -> None:
        self._call("set run status", lambda: self.client.set(self.key("run_status"), status))

    def run_status(self) -> str | None:
        return self._call("run status", lambda: self.client.get(self.key("run_status")))

    # -- rejected input -------------------------------------------------------------------
    def count_rejected(self, source: str, reason: str, count: int = 1) -> None:
        self._call(
            "count rejected",
            lambda: self.client.hincrby(self.key("rejected"), f"{source}.{reason}", count),
        )

    def rejected(self) -> dict[str, int]:
        raw = self._call("rejected", lambda: self.client.hgetall(self.key("rejected")))
        return {k: int(v) for k, v in raw.items()}

    # -- held-out evaluations ---------------------------------------------------------------
    def open_evaluation(self, policy_version: int) -> None:
        key = self.key("evaluation_claims")
        self._call("open evaluation", lambda: self.client.hsetnx(key, str(policy_version), 0))

    def claim_evaluation_chunk(self, policy_version: int, num_chunks: int, worker_id: str) -> EvaluationClaim | None:
        keys = [self.key("evaluation_claims"), self.key("evaluation_claimers")]
        args: list[Any] = [self.key("worker:"), policy_version, num_chunks, worker_id]
        got = self._call("claim evaluation chunk", lambda: self._claim_chunk(keys=keys, args=args))
        return EvaluationClaim(policy_version, int(got[0]), int(got[1])) if got else None

    def awaited_evaluations(self) -> int:
        keys, args = [self.key("evaluation_claimers")], [self.key("worker:")]
        return int(self._call("awaited evaluations", lambda: self._awaited(keys=keys, args=args)))

    def add_evaluation(self, claim: EvaluationClaim, entry: str) -> bool:
        keys = [self.key("evaluation_claimers"), self.key("evaluations")]
        args: list[Any] = [claim.policy_version, claim.chunk, claim.attempt, entry]
        return bool(self._call("add evaluation", lambda: self._add_evaluation(keys=keys, args=args)))

    def evaluations(self, start: int = 0) -> list[str]:
        key = self.key("evaluations")
        return list(self._call("evaluations", lambda: self.client.lrange(key, start, -1)))

    def close(self) -> None:
        self.client.close()
