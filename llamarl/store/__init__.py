"""The run's shared state: declared interfaces, the records they pass, and two implementations.

`RedisStore` shares state between processes through one redis-server; `MemoryStore` keeps it in
one process (the synchronous baseline, fast tests). Both satisfy `Store` and the same contract
tests; components take the narrowest interface they need.
"""

from llamarl.store.interfaces import (
    Ledger,
    Registry,
    RejectCounts,
    Store,
    VersionGate,
    admission_bound,
)
from llamarl.store.memory import MemoryStore
from llamarl.store.records import LEDGER_FIELDS, OUTCOMES, EvaluationClaim, Ticket, WorkerBeat, WorkerInfo
from llamarl.store.redis_store import RedisStore, without_password

__all__ = [
    "LEDGER_FIELDS",
    "OUTCOMES",
    "EvaluationClaim",
    "Ledger",
    "MemoryStore",
    "RedisStore",
    "Registry",
    "RejectCounts",
    "Store",
    "Ticket",
    "VersionGate",
    "WorkerBeat",
    "WorkerInfo",
    "admission_bound",
    "without_password",
]
