"""What only RedisStore has: atomic claims across processes, its keys, and connection loss.

The semantics every store shares are in tests/contract/test_store_contract.py.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import pytest
import redis

from llamarl.errors import StaleVersionError
from llamarl.net import free_port_block
from llamarl.store import RedisStore

GATE: dict[str, Any] = {"lease_s": 60.0, "max_staleness": 1, "prompts_per_step": 5}


def claim_all(url: str, worker_id: str, out: Any) -> None:
    """Claim one ticket at a time until the gate refuses; nothing frees a slot meanwhile."""
    store = RedisStore(url, "test")
    got = []
    while batch := store.claim_tickets(worker_id, 1, **GATE):
        got += [ticket.ticket_id for ticket in batch]
    out.put(got)
    store.close()


def _claim_in_processes(url: str, num_procs: int = 4) -> list[int]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=claim_all, args=(url, f"w{i}", out)) for i in range(num_procs)]
    for proc in procs:
        proc.start()
    claimed = [ticket for _ in procs for ticket in out.get(timeout=60)]
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    return claimed


def test_concurrent_claims_from_processes_never_exceed_the_gate(redis_server, store: RedisStore) -> None:
    store.publish_version(2, {})
    claimed = _claim_in_processes(redis_server.url)
    bound = (2 + GATE["max_staleness"] + 1) * GATE["prompts_per_step"]
    assert sorted(claimed) == list(range(bound))
    store.publish_version(3, {})
    claimed = _claim_in_processes(redis_server.url)
    assert sorted(claimed) == list(range(bound, bound + GATE["prompts_per_step"]))
    assert store.ledger()["issued"] == bound + GATE["prompts_per_step"]


def test_compaction_deletes_the_per_ticket_entries(store: RedisStore) -> None:
    tickets = store.claim_tickets("g0", 4, **GATE)
    store.end_tickets([(ticket.ticket_id, "trained") for ticket in tickets[:3]])
    assert store.compact_tickets(limit=100) == 3
    assert store.client.hkeys(store.key("tickets")) == ["3"]
    assert store.client.hkeys(store.key("attempts")) == ["3"]
    assert store.client.hkeys(store.key("lease_owner")) == ["3"]


def test_unreachable_redis_fails_after_the_deadline() -> None:
    store = RedisStore(f"redis://127.0.0.1:{free_port_block(size=1)}/0", "test", 1.0)
    with pytest.raises(ConnectionError, match="redis unreachable for 1s during ping"):
        store.ping()


def test_a_publish_retried_after_its_reply_was_lost_is_accepted_once(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis applied the publish, then the connection dropped before the reply (a Redis
    restart): the store's retry must not be refused as stale, and nothing is written twice."""
    store.publish_version(1, {"checksum": "a"})
    applied = store._publish
    calls = []

    def reply_lost_once(**kwargs: Any) -> Any:
        calls.append(applied(**kwargs))
        if len(calls) == 1:
            raise redis.ConnectionError("connection closed by server")
        return calls[-1]

    monkeypatch.setattr(store, "_publish", reply_lost_once)
    store.publish_version(2, {"checksum": "b"})
    assert calls == [1, 1], "applied by the first call, recognised by the retry"
    assert store.policy_version() == 2 and store.version_meta()["checksum"] == "b"
    with pytest.raises(StaleVersionError, match="2 is not above current 2"):
        store.publish_version(2, {"checksum": "c"})  # another publish of that number is stale
