"""The run's shared state as declared interfaces, one Protocol per concern.

Components ask for the narrowest one they use (a generator needs a `VersionGate`, the monitor a
`Ledger`); a process builds one `Store` (Redis across processes, memory inside one) and hands it
to them. Every implementation passes tests/contract/test_store_contract.py, which is the executable
form of the contracts written here. Each method is atomic: no caller ever sees half of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from llamarl.store.records import EvaluationClaim, Ticket, WorkerBeat, WorkerInfo


def admission_bound(policy_version: int, max_staleness: int, prompts_per_step: int) -> int:
    """How many live tickets (issued, less dropped stale and skipped) the gate admits while
    generators hold `policy_version`: every ticket up to the last step that may still train on
    rollouts of that version. The one Python form of the bound: the memory store and the
    simulator use it, and the Redis store's Lua script keeps its own copy, which the store
    contract checks against this one."""
    return (policy_version + max_staleness + 1) * prompts_per_step


class VersionGate(Protocol):
    """Policy versions and the admission gate that keeps generators within the staleness bound."""

    def policy_version(self) -> int:
        """The latest published version, or -1 before the first publish."""
        ...

    def publish_version(self, policy_version: int, meta: dict[str, Any]) -> None:
        """Make `policy_version` the latest, with `meta` (plus `policy_version` and `published_at`)
        as its metadata. A version not strictly above the current one raises StaleVersionError
        and changes nothing: versions only ever increase."""
        ...

    def set_version_offset(self, offset: int) -> None:
        """Record that published version numbers now lie `offset` above the versions actually
        trained (a resumed trainer skips numbers so that none is reused). Each resume sets it
        anew, it never accumulates; the gate counts the published version less the offset."""
        ...

    def version_meta(self) -> dict[str, str]:
        """Metadata of the latest version, every value as a string; empty before a publish."""
        ...

    def put_version_shard(self, rank: int, meta: dict[str, Any]) -> None:
        """Record the metadata (with its `policy_version`) of the newest shard a trainer rank has
        published, for rank 0 to announce with its own (a trainer of several ranks)."""
        ...

    def version_shards(self) -> dict[int, dict[str, str]]:
        """Each rank's newest shard metadata, as recorded, every value as a string."""
        ...

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
        """Up to `count` tickets leased to `worker_id` for `lease_s`, in one atomic step.

        First tickets whose lease has expired (earliest expiry first), each reissued with
        attempt + 1 and counted as `reissued`; the gate does not limit these. Then new tickets,
        numbered consecutively from 0 with attempt 0, while `issued - dropped_stale - skipped`
        (the live tickets: those ended untrained give their slot back) stays below
        `(v + max_staleness + 1) * prompts_per_step` and, when `total_tickets` > 0, below
        `total_tickets`. `v` is the published version (0 before any), lowered to the caller's
        `policy_version` when that is given and older, less the version numbers a resume skipped
        (the offset), never below 0.
        So a claim never hands out work the caller's weights are too stale for, and a publish
        reopens the gate by `prompts_per_step` tickets per version.
        """
        ...

    def renew_leases(self, tickets: Sequence[Ticket], lease_s: float) -> list[bool]:
        """Extend by `lease_s` from now the lease of each ticket whose attempt still holds it;
        False (nothing changed) for one reissued to a later attempt, ended, or holding no lease.
        A lease past its expiry but not yet reissued is still held."""
        ...


class Ledger(Protocol):
    """Ticket outcomes: every issued ticket ends exactly once, and the counts always balance."""

    def end_tickets(self, outcomes: Sequence[tuple[int, str]], heartbeat: WorkerBeat | None = None) -> list[bool]:
        """End each (ticket_id, outcome) in order, outcome one of OUTCOMES, and write `heartbeat`
        in the same step. True when this call ended the ticket (it leaves its lease); False when
        it had already ended or was compacted away, counted as `duplicate`. A ticket at or above
        the floor that was never issued raises KeyError and no ticket of the batch changes (the
        heartbeat is still written); a bad outcome raises ValueError before anything changes."""
        ...

    def reopen_ticket(self, ticket_id: int, *, requeue: bool) -> bool:
        """Put a `trained` ticket whose update a trainer crash lost back to open (trained - 1,
        reopened + 1). requeue=True gives it an already expired lease so the next claim reissues
        it; requeue=False leaves it open with no lease, since the caller holds its rollout. True
        when reopened or already open (then only the lease changes); False, changing nothing,
        for a dropped, skipped, compacted or unknown ticket."""
        ...

    def expire_leases(self) -> int:
        """Expire the lease of every open ticket that holds one, so the next claims reissue them
        (attempt + 1); how many. A resumed trainer calls it: the rollouts its predecessor held,
        or that were on their way to it, died with it, and waiting out their leases would stall
        the run. A generator still sampling one loses its lease and drops the result."""
        ...

    def compact_tickets(self, limit: int) -> int:
        """Forget the per-ticket state of every ticket below both the lowest open (or not yet
        issued) ticket and `limit`; returns the floor, which never decreases. The ledger counts
        are kept, and a compacted ticket still ends only once (as a duplicate)."""
        ...

    def ended_tickets(self) -> tuple[int, set[int]]:
        """(floor, ids at or above it that have ended): every ticket below the floor has ended."""
        ...

    def ledger(self) -> dict[str, int]:
        """Every counter in LEDGER_FIELDS (0 before its first change) plus
        `open = issued - trained - dropped_stale - skipped`."""
        ...

    def ticket_state(self, ticket_id: int) -> str | None:
        """`open` or the ticket's outcome (one of OUTCOMES); None for a ticket never issued or
        compacted."""
        ...


class Registry(Protocol):
    """Which workers exist and whether they are alive, and whether the run is still going."""

    def register_worker(self, worker_id: str, role: str, ttl_s: float, **fields: Any) -> None:
        """Replace the worker's entry with role, pid, host, status=starting, started_at,
        last_seen and `fields`, alive for `ttl_s`. Field values are str, int or float and are
        read back as strings."""
        ...

    def heartbeat(self, worker_id: str, ttl_s: float, **fields: Any) -> None:
        """Set last_seen and `fields` on the worker's entry (keeping its other fields while it is
        alive) and keep it alive for another `ttl_s`; a worker never registered is added."""
        ...

    def record_stop(self, worker_id: str) -> None:
        """The worker stopped cleanly: its entry keeps its fields, with status=stopped, and no
        longer expires; `workers()` reports it stopped (not alive) until it registers again."""
        ...

    def workers(self) -> list[WorkerInfo]:
        """Every worker ever registered, sorted by id; `alive` is False, with no fields, once
        its last registration or heartbeat is older than its TTL (stopped ones excepted)."""
        ...

    def set_run_status(self, status: str) -> None:
        """Set the run status (`running` or `finished`); workers exit when it is `finished`."""
        ...

    def run_status(self) -> str | None:
        """The last status set, or None before any."""
        ...


class RejectCounts(Protocol):
    """Counters of input a process refused, by source and reason."""

    def count_rejected(self, source: str, reason: str, count: int = 1) -> None:
        """Add `count` to the counter `<source>.<reason>`."""
        ...

    def rejected(self) -> dict[str, int]:
        """Every counter that was ever added to, keyed `<source>.<reason>`."""
        ...


class HeldOutLog(Protocol):
    """Held-out evaluations generators make for the trainer (`llamarl.roles.held_out`)."""

    def open_evaluation(self, policy_version: int) -> None:
        """Open the held-out evaluation of `policy_version` (the trainer, before announcing it)."""
        ...

    def claim_evaluation_chunk(self, policy_version: int, num_chunks: int, worker_id: str) -> EvaluationClaim | None:
        """A chunk of `policy_version`'s evaluation for `worker_id`, who holds that version's
        weights: first one whose claimer the registry no longer reports alive (its next attempt),
        else the next of the `num_chunks` never claimed (attempt 0); None when none is open or
        left. A claim records its claimer and the `pid` of its registration: a claimer that
        stopped, whose TTL lapsed or that registered again (a restart) holds it no longer, and a
        worker not alive when it claims holds a claim anyone may take."""
        ...

    def awaited_evaluations(self) -> int:
        """How many claimed chunks, every evaluation's together, are not in yet and still held
        by a live claimer (what a trainer's last step waits for)."""
        ...

    def add_evaluation(self, claim: EvaluationClaim, entry: str) -> bool:
        """Append one evaluated chunk (JSON text) when `claim` is still the chunk's current
        attempt (then the chunk is no longer awaited nor claimable); False, changing nothing, for
        an attempt claimed again meanwhile, a chunk already in or one never claimed."""
        ...

    def evaluations(self, start: int = 0) -> list[str]:
        """The entries from index `start` on, oldest first."""
        ...


class Store(VersionGate, Ledger, Registry, RejectCounts, HeldOutLog, Protocol):
    """All of a run's shared state behind one connection."""

    def ping(self) -> bool:
        """True when the store answers (a remote one retries up to its connect deadline)."""
        ...

    def close(self) -> None:
        """Release the connection; the store is not used afterwards."""
        ...
