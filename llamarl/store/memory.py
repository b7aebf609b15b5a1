"""The `Store` in one process's memory: the semantics of llamarl/store/lua.py without a server.

For the synchronous baseline and fast tests. Every method holds one lock for its whole body, which
gives the atomicity the Lua scripts give on Redis. Lease expiry and heartbeat TTLs run on an
injectable `clock` (seconds, monotonic by default), so a test moves time instead of sleeping;
lease and TTL lengths are cut to whole milliseconds as on Redis. Values written to version
metadata and worker fields are kept as the strings Redis would return. Nothing persists, and
the lease holder's id (Redis's `lease_owner`, kept for operators) is not kept: nothing reads it.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from llamarl.errors import StaleVersionError
from llamarl.store.interfaces import admission_bound
from llamarl.store.records import (
    LEDGER_FIELDS,
    OUTCOMES,
    EvaluationClaim,
    Ticket,
    WorkerBeat,
    WorkerInfo,
    open_tickets,
)

# A requeued ticket's lease has expired before any time the clock can tell.
ALREADY_EXPIRED = float("-inf")


def _as_text(value: Any) -> str:
    """A field value as Redis stores it: redis-py takes str, bytes, int and float, not bool."""
    if isinstance(value, bool) or not isinstance(value, str | bytes | int | float):
        raise TypeError(f"store values are str, bytes, int or float, got {type(value).__name__}")
    if isinstance(value, bytes):
        return value.decode()
    return value if isinstance(value, str) else repr(value)


def _ms(seconds: float) -> float:
    """A duration cut to whole milliseconds, as RedisStore sends it."""
    return int(seconds * 1000) / 1000


class MemoryStore:
    """All of a run's shared state in dicts behind one lock; safe to share between threads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._policy_version: int | None = None
        self._version_offset = 0
        self._version_meta: dict[str, str] = {}
        self._version_shards: dict[int, dict[str, str]] = {}
        self._ledger = dict.fromkeys(LEDGER_FIELDS, 0)
        self._tickets: dict[int, str] = {}  # ticket_id -> open or its outcome
        self._attempts: dict[int, int] = {}
        self._floor = 0
        self._leases: dict[int, float] = {}  # open ticket_id -> lease expiry on `clock`
        self._workers: set[str] = set()
        self._worker_entries: dict[str, tuple[float, dict[str, str]]] = {}  # (expiry, fields)
        self._rejected: dict[str, int] = {}
        self._evaluation_claims: dict[int, int] = {}  # version -> chunks ever claimed
        # (version, chunk) -> (attempt, claimer, its registration's incarnation or None: not alive)
        self._evaluation_claimers: dict[tuple[int, int], tuple[int, str, str | None]] = {}
        self._evaluations: list[str] = []
        self._run_status: str | None = None

    def ping(self) -> bool:
        return True

    def close(self) -> None:
        """Nothing to release: the state lives as long as this object."""

    # -- policy versions -------------------------------------------------------------------
    def policy_version(self) -> int:
        with self._lock:
            return -1 if self._policy_version is None else self._policy_version

    def publish_version(self, policy_version: int, meta: dict[str, Any]) -> None:
        fields = {"policy_version": policy_version, "published_at": time.time(), **meta}
        text = {name: _as_text(value) for name, value in fields.items()}
        with self._lock:
            current = -1 if self._policy_version is None else self._policy_version
            if policy_version <= current:
                raise StaleVersionError(f"policy version {policy_version} is not above current {current}")
            self._policy_version = policy_version
            self._version_meta = text

    def set_version_offset(self, offset: int) -> None:
        with self._lock:
            self._version_offset = offset

    def version_meta(self) -> dict[str, str]:
        with self._lock:
            return dict(self._version_meta)

    def put_version_shard(self, rank: int, meta: dict[str, Any]) -> None:
        with self._lock:
            self._version_shards[rank] = {k: str(v) for k, v in meta.items()}

    def version_shards(self) -> dict[int, dict[str, str]]:
        with self._lock:
            return {rank: dict(meta) for rank, meta in self._version_shards.items()}

    # -- admission gate, leases ------------------------------------------------------------
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
        with self._lock:
            now = self.clock()
            expiry = now + _ms(lease_s)
            out = [self._reissue(ticket_id, expiry) for ticket_id in self._expired(now, count)]
            version = 0 if self._policy_version is None else self._policy_version
            if policy_version is not None and 0 <= policy_version < version:
                version = policy_version
            version = max(version - self._version_offset, 0)
            bound = admission_bound(version, max_staleness, prompts_per_step)
            while len(out) < count:
                # Dropped and skipped tickets give their slot back: neither is trained in a step.
                ledger = self._ledger
                live = ledger["issued"] - ledger["dropped_stale"] - ledger["skipped"]
                if live >= bound or (total_tickets > 0 and live >= total_tickets):
                    break
                out.append(self._issue(expiry))
            return out

    def _expired(self, now: float, count: int) -> list[int]:
        """Up to `count` tickets whose lease expired by `now`, in the order of Redis's zset:
        by expiry, then by the id's decimal string."""
        expired = [(at, str(tid)) for tid, at in self._leases.items() if at <= now]
        return [int(tid) for _, tid in sorted(expired)[: max(count, 0)]]

    def _reissue(self, ticket_id: int, expiry: float) -> Ticket:
        self._attempts[ticket_id] = self._attempts.get(ticket_id, 0) + 1
        self._leases[ticket_id] = expiry
        self._ledger["reissued"] += 1
        return Ticket(ticket_id, self._attempts[ticket_id], True)

    def _issue(self, expiry: float) -> Ticket:
        ticket_id = self._ledger["issued"]
        self._ledger["issued"] += 1
        self._tickets[ticket_id] = "open"
        self._attempts[ticket_id] = 0
        self._leases[ticket_id] = expiry
        return Ticket(ticket_id, 0, False)

    def renew_leases(self, tickets: Sequence[Ticket], lease_s: float) -> list[bool]:
        with self._lock:
            expiry = self.clock() + _ms(lease_s)
            held = []
            for ticket in tickets:
                tid = ticket.ticket_id
                holds = (
                    self._tickets.get(tid) == "open"
                    and self._attempts.get(tid) == ticket.attempt
                    and tid in self._leases
                )
                if holds:
                    self._leases[tid] = expiry
                held.append(holds)
            return held

    # -- ledger ----------------------------------------------------------------------------
    def end_tickets(self, outcomes: Sequence[tuple[int, str]], heartbeat: WorkerBeat | None = None) -> list[bool]:
        for _, outcome in outcomes:
            if outcome not in OUTCOMES:
                raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
        with self._lock:
            # As on Redis, the heartbeat is written even when the batch names an unknown ticket.
            if heartbeat is not None:
                self._beat(heartbeat.worker_id, heartbeat.ttl_s, heartbeat.fields)
            for ticket_id, _ in outcomes:
                if ticket_id not in self._tickets and ticket_id >= self._floor:
                    raise KeyError(f"ticket {ticket_id} was never issued")
            return [self._end(ticket_id, outcome) for ticket_id, outcome in outcomes]

    def _end(self, ticket_id: int, outcome: str) -> bool:
        if self._tickets.get(ticket_id) != "open":
            self._ledger["duplicate"] += 1
            return False
        self._tickets[ticket_id] = outcome
        self._leases.pop(ticket_id, None)
        self._ledger[outcome] += 1
        return True

    def reopen_ticket(self, ticket_id: int, *, requeue: bool) -> bool:
        with self._lock:
            state = self._tickets.get(ticket_id)
            if state == "trained":
                self._tickets[ticket_id] = "open"
                self._ledger["trained"] -= 1
                self._ledger["reopened"] += 1
            elif state != "open":
                return False
            if requeue:
                self._leases[ticket_id] = ALREADY_EXPIRED
            else:
                self._leases.pop(ticket_id, None)
            return True

    def expire_leases(self) -> int:
        with self._lock:
            held = [tid for tid, at in self._leases.items() if at != ALREADY_EXPIRED]
            for ticket_id in held:
                self._leases[ticket_id] = ALREADY_EXPIRED
            return len(held)

    def compact_tickets(self, limit: int) -> int:
        with self._lock:
            low = min(self._ledger["issued"], limit)
            for ticket_id, state in self._tickets.items():
                if state == "open" and ticket_id < low:
                    low = ticket_id
            for ticket_id in range(self._floor, low):
                self._tickets.pop(ticket_id, None)
                self._attempts.pop(ticket_id, None)
            self._floor = max(low, self._floor)
            return self._floor

    def ended_tickets(self) -> tuple[int, set[int]]:
        with self._lock:
            ended = {tid for tid, state in self._tickets.items() if state != "open"}
            return self._floor, ended

    def ledger(self) -> dict[str, int]:
        with self._lock:
            counts = dict(self._ledger)
        counts["open"] = open_tickets(counts)
        return counts

    def ticket_state(self, ticket_id: int) -> str | None:
        with self._lock:
            return self._tickets.get(ticket_id)

    # -- worker registry -------------------------------------------------------------------
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
        text = {name: _as_text(value) for name, value in mapping.items()}
        with self._lock:
            self._worker_entries[worker_id] = (self.clock() + _ms(ttl_s), text)
            self._workers.add(worker_id)

    def heartbeat(self, worker_id: str, ttl_s: float, **fields: Any) -> None:
        with self._lock:
            self._beat(worker_id, ttl_s, fields)

    def _beat(self, worker_id: str, ttl_s: float, fields: dict[str, Any]) -> None:
        text = {name: _as_text(value) for name, value in {"last_seen": time.time(), **fields}.items()}
        now = self.clock()
        kept = self._live_fields(worker_id, now) or {}
        self._worker_entries[worker_id] = (now + _ms(ttl_s), {**kept, **text})
        self._workers.add(worker_id)

    def _live_fields(self, worker_id: str, now: float) -> dict[str, str] | None:
        """The worker's fields while its TTL runs, else None (and the entry is dropped)."""
        entry = self._worker_entries.get(worker_id)
        if entry is None:
            return None
        if entry[0] <= now:
            del self._worker_entries[worker_id]
            return None
        return entry[1]

    def record_stop(self, worker_id: str) -> None:
        with self._lock:
            kept = self._live_fields(worker_id, self.clock()) or {}
            stop = {"status": "stopped", "last_seen": _as_text(time.time())}
            self._worker_entries[worker_id] = (float("inf"), {**kept, **stop})
            self._workers.add(worker_id)

    def workers(self) -> list[WorkerInfo]:
        with self._lock:
            now = self.clock()
            infos = []
            for worker_id in sorted(self._workers):
                fields = dict(self._live_fields(worker_id, now) or {})
                stopped = fields.get("status") == "stopped"
                infos.append(WorkerInfo(worker_id, bool(fields) and not stopped, fields, stopped))
            return infos

    # -- run status ------------------------------------------------------------------------
    def set_run_status(self, status: str) -> None:
        text = _as_text(status)
        with self._lock:
            self._run_status = text

    def run_status(self) -> str | None:
        with self._lock:
            return self._run_status

    # -- rejected input --------------------------------------------------------------------
    def count_rejected(self, source: str, reason: str, count: int = 1) -> None:
        name = f"{source}.{reason}"
        with self._lock:
            self._rejected[name] = self._rejected.get(name, 0) + count

    def rejected(self) -> dict[str, int]:
        with self._lock:
            return dict(self._rejected)

    # -- held-out evaluations ----------------------------------------------------------------
    def open_evaluation(self, policy_version: int) -> None:
        with self._lock:
            self._evaluation_claims.setdefault(policy_version, 0)

    def claim_evaluation_chunk(self, policy_version: int, num_chunks: int, worker_id: str) -> EvaluationClaim | None:
        with self._lock:
            taken = self._evaluation_claims.get(policy_version)
            if taken is None:
                return None
            now = self.clock()
            claimer = (worker_id, self._incarnation(worker_id, now))
            for chunk in range(min(taken, num_chunks)):
                held = self._evaluation_claimers.get((policy_version, chunk))
                if held is not None and not self._holds(held, now):
                    claim = EvaluationClaim(policy_version, chunk, held[0] + 1)
                    self._evaluation_claimers[(policy_version, chunk)] = (claim.attempt, *claimer)
                    return claim
            if taken >= num_chunks:
                return None
            self._evaluation_claims[policy_version] = taken + 1
            self._evaluation_claimers[(policy_version, taken)] = (0, *claimer)
            return EvaluationClaim(policy_version, taken, 0)

    def _holds(self, held: tuple[int, str, str | None], now: float) -> bool:
        """Whether a claim's claimer still holds it: alive, under the registration it claimed in."""
        return held[2] is not None and self._incarnation(held[1], now) == held[2]

    def _incarnation(self, worker_id: str, now: float) -> str | None:
        """The worker's registration (its `incarnation`) while the registry reports it alive, else
        None."""
        fields = self._live_fields(worker_id, now)
        if not fields or fields.get("status") == "stopped":
            return None
        return fields.get("incarnation", "")

    def awaited_evaluations(self) -> int:
        with self._lock:
            now = self.clock()
            return sum(self._holds(held, now) for held in self._evaluation_claimers.values())

    def add_evaluation(self, claim: EvaluationClaim, entry: str) -> bool:
        with self._lock:
            key = (claim.policy_version, claim.chunk)
            held = self._evaluation_claimers.get(key)
            if held is None or held[0] != claim.attempt:
                return False
            del self._evaluation_claimers[key]
            self._evaluations.append(entry)
            return True

    def evaluations(self, start: int = 0) -> list[str]:
        with self._lock:
            return self._evaluations[start:]
