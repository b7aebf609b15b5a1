"""The plain values the store hands out and takes in, shared by every store implementation.

`OUTCOMES` are the ways a ticket ends (trained; dropped as too stale; skipped by dynamic
sampling as a group with no signal); `LEDGER_FIELDS` are the run's ticket counters. The
records are frozen dataclasses with no behaviour, so a store backend is the only thing that
decides what they mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OUTCOMES = ("trained", "dropped_stale", "skipped")
LEDGER_FIELDS = (
    "issued",
    "trained",
    "dropped_stale",
    "skipped",
    "reissued",
    "duplicate",
    "reopened",
)


def open_tickets(counts: dict[str, int]) -> int:
    """Issued tickets that have not ended, from the ledger's counts."""
    return counts["issued"] - sum(counts[outcome] for outcome in OUTCOMES)


@dataclass(frozen=True)
class Ticket:
    """A claimed prompt: ticket_id doubles as the data cursor (prompt index)."""

    ticket_id: int
    attempt: int
    reissued: bool


@dataclass(frozen=True)
class WorkerBeat:
    """A worker's liveness and status fields, written to its registry hash with a TTL."""

    worker_id: str
    ttl_s: float
    fields: dict[str, Any]


@dataclass(frozen=True)
class WorkerInfo:
    """A registered worker as the registry reports it: `alive` while its heartbeats come within
    their TTL; `stopped` (not alive, fields kept) once it recorded a clean stop; otherwise dead,
    with empty `fields`."""

    worker_id: str
    alive: bool
    fields: dict[str, str]
    stopped: bool = False

    @property
    def state(self) -> str:
        """alive, done (stopped cleanly) or dead."""
        return "alive" if self.alive else "done" if self.stopped else "dead"


@dataclass(frozen=True)
class EvaluationClaim:
    """A chunk of a held-out evaluation claimed by one worker: the attempt (0 first, +1 each
    time a dead claimer's chunk is claimed again) is what its result must name to be added."""

    policy_version: int
    chunk: int
    attempt: int
