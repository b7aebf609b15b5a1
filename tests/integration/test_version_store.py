"""The Redis version store against a real redis-server: versions, gate, leases, registry."""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import pytest

from llamarl.errors import StaleVersionError
from llamarl.net import free_port_block
from llamarl.version_store import Ticket, VersionStore, WorkerBeat

GATE = {"lease_s": 60.0, "max_staleness": 1, "prompts_per_step": 5}


def claim_one(store: VersionStore, worker_id: str, **gate: Any) -> Ticket | None:
    got = store.claim_tickets(worker_id, 1, **gate)
    assert len(got) <= 1
    return got[0] if got else None


def end(store: VersionStore, ticket_id: int, outcome: str = "trained") -> bool:
    return store.end_tickets([(ticket_id, outcome)])[0]


def test_policy_version_only_goes_up(store: VersionStore) -> None:
    assert store.policy_version() == -1
    store.publish_version(0, {"checksum": "a"})
    store.publish_version(3, {"checksum": "b", "num_bytes": 10})
    for stale in (3, 2, -1):
        with pytest.raises(StaleVersionError, match=f"{stale} is not above current 3"):
            store.publish_version(stale, {"checksum": "stale"})
    assert store.policy_version() == 3
    assert store.version_meta()["checksum"] == "b"


def claim_all(url: str, worker_id: str, out) -> None:
    store = VersionStore(url, "test")
    got = []
    misses = 0
    while misses < 20:
        ticket = claim_one(store, worker_id, **GATE)
        if ticket is None:
            misses += 1
            time.sleep(0.01)
        else:
            got.append(ticket.ticket_id)
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


def test_concurrent_claims_never_exceed_the_gate(redis_server, store: VersionStore) -> None:
    store.publish_version(2, {})
    claimed = _claim_in_processes(redis_server.url)
    bound = (2 + GATE["max_staleness"] + 1) * GATE["prompts_per_step"]
    assert sorted(claimed) == list(range(bound))
    store.publish_version(3, {})
    claimed = _claim_in_processes(redis_server.url)
    assert sorted(claimed) == list(range(bound, bound + GATE["prompts_per_step"]))
    assert store.ledger()["issued"] == bound + GATE["prompts_per_step"]


def test_dropped_tickets_return_their_slot(store: VersionStore) -> None:
    tickets = [claim_one(store, "w", **GATE) for _ in range(10)]
    assert claim_one(store, "w", **GATE) is None
    end(store, tickets[0].ticket_id, "dropped_stale")
    assert claim_one(store, "w", **GATE) is not None
    assert claim_one(store, "w", **GATE) is None


def test_total_tickets_caps_the_run(store: VersionStore) -> None:
    got = [claim_one(store, "w", **GATE, total_tickets=3) for _ in range(5)]
    assert [t is not None for t in got] == [True, True, True, False, False]


def test_expired_lease_is_reissued_exactly_once(store: VersionStore) -> None:
    first = claim_one(store, "dead-worker", **{**GATE, "lease_s": 0.2})
    assert first is not None and first.attempt == 0
    time.sleep(0.3)
    again = claim_one(store, "w1", **GATE)
    other = claim_one(store, "w2", **GATE)
    assert again is not None and other is not None
    assert (again.ticket_id, again.attempt, again.reissued) == (first.ticket_id, 1, True)
    assert other.ticket_id != first.ticket_id and not other.reissued
    assert store.ledger()["reissued"] == 1
    assert store.renew_leases([first, again], 10) == [False, True], "the expired attempt loses"
    assert end(store, first.ticket_id, "trained") is True
    assert end(store, first.ticket_id, "trained") is False  # the late duplicate
    ledger = store.ledger()
    assert (ledger["trained"], ledger["duplicate"], ledger["open"]) == (1, 1, 1)
    with pytest.raises(KeyError):
        end(store, 999, "trained")


def test_worker_whose_heartbeat_stops_is_reported_dead(store: VersionStore) -> None:
    store.register_worker("gen-0", "generator", ttl_s=0.4)
    store.register_worker("gen-1", "generator", ttl_s=0.4)
    for _ in range(4):
        time.sleep(0.15)
        store.heartbeat("gen-1", ttl_s=0.4, status="running")
    alive = {w.worker_id: w.alive for w in store.workers()}
    assert alive == {"gen-0": False, "gen-1": True}
    assert next(w for w in store.workers() if w.worker_id == "gen-1").fields["role"] == "generator"


def test_unreachable_redis_fails_after_the_deadline() -> None:
    store = VersionStore(f"redis://127.0.0.1:{free_port_block(size=1)}/0", "test", 1.0)
    started = time.monotonic()
    with pytest.raises(ConnectionError, match="redis unreachable for 1s during ping"):
        store.ping()
    assert time.monotonic() - started < 5


def test_reopened_tickets_are_reissued_or_held(store: VersionStore) -> None:
    store.publish_version(0, {})
    held, requeued, dropped = (claim_one(store, "g0", **GATE) for _ in range(3))
    assert held and requeued and dropped
    for ticket in (held, requeued):
        assert end(store, ticket.ticket_id, "trained")
    end(store, dropped.ticket_id, "dropped_stale")
    assert store.reopen_ticket(held.ticket_id, requeue=False)
    assert store.reopen_ticket(requeued.ticket_id, requeue=True)
    assert not store.reopen_ticket(dropped.ticket_id, requeue=True)
    ledger = store.ledger()
    assert (ledger["trained"], ledger["reopened"], ledger["open"]) == (0, 2, 2)
    again = claim_one(store, "g1", **GATE)
    assert again is not None and (again.ticket_id, again.reissued) == (requeued.ticket_id, True)
    fresh = claim_one(store, "g1", **GATE)
    assert fresh is not None and not fresh.reissued, "a held ticket must not be reissued"
    assert end(store, held.ticket_id, "trained")


def test_compaction_drops_ended_tickets_below_the_lowest_open_one(store: VersionStore) -> None:
    store.publish_version(0, {})
    tickets = [claim_one(store, "g0", **GATE) for _ in range(8)]
    assert all(tickets)
    for ticket_id in (0, 1, 2, 4, 5):  # 3, 6 and 7 stay open
        end(store, ticket_id, "trained" if ticket_id != 4 else "dropped_stale")
    ledger_before = store.ledger()
    assert store.compact_tickets(limit=2) == 2, "never above the caller's limit"
    assert store.compact_tickets(limit=100) == 3
    assert store.ledger() == ledger_before, "the ledger keeps every count"
    assert [store.ticket_state(i) for i in range(8)] == [
        None,
        None,
        None,
        "open",
        "dropped_stale",
        "trained",
        "open",
        "open",
    ]
    assert not end(store, 1, "trained"), "a compacted ticket ends only once"
    assert store.ledger()["duplicate"] == ledger_before["duplicate"] + 1
    with pytest.raises(KeyError, match="never issued"):
        end(store, 99, "trained")
    for ticket_id in (3, 6, 7):
        end(store, ticket_id, "trained")
    assert store.compact_tickets(limit=100) == 8
    assert store.client.hlen(store.key("tickets")) == 0
    assert store.client.hlen(store.key("attempts")) == 0


def test_gate_discounts_version_numbers_skipped_by_a_resume(store: VersionStore) -> None:
    store.publish_version(2, {})
    store.skip_versions(2)  # the model behind version 2 is the one of version 0
    claimed = 0
    while claim_one(store, "g0", **GATE) is not None:
        claimed += 1
    assert claimed == (0 + GATE["max_staleness"] + 1) * GATE["prompts_per_step"]


def test_claims_come_in_batches_gated_on_the_loaded_version(store: VersionStore) -> None:
    store.publish_version(3, {})
    batch = store.claim_tickets("g0", 4, **GATE, policy_version=1)
    assert [t.ticket_id for t in batch] == [0, 1, 2, 3]
    more = store.claim_tickets("g0", 100, **GATE, policy_version=1)
    assert len(batch) + len(more) == (1 + GATE["max_staleness"] + 1) * GATE["prompts_per_step"]
    assert store.claim_tickets("g0", 100, **GATE, policy_version=1) == []
    # A generator that has loaded the latest version may go further; never past it.
    newest = store.claim_tickets("g1", 100, **GATE)
    assert len(newest) == 2 * GATE["prompts_per_step"]
    assert store.claim_tickets("g1", 100, **GATE, policy_version=9) == []


def test_ending_tickets_writes_the_heartbeat_in_the_same_round_trip(store: VersionStore) -> None:
    tickets = store.claim_tickets("g0", 3, **GATE)
    beat = WorkerBeat("trainer", 5.0, {"step": 7, "role": "trainer"})
    ended = store.end_tickets([(tickets[0].ticket_id, "trained"), (tickets[1].ticket_id,
                              "dropped_stale")], heartbeat=beat)  # fmt: skip
    assert ended == [True, True]
    assert store.end_tickets([(tickets[0].ticket_id, "trained")]) == [False]
    trainer = next(w for w in store.workers() if w.worker_id == "trainer")
    assert trainer.alive and trainer.fields["step"] == "7"
    before = store.ledger()
    with pytest.raises(KeyError, match="ticket 55 was never issued"):
        store.end_tickets([(tickets[2].ticket_id, "trained"), (55, "trained")])
    assert store.ledger() == before, "a bad batch changes nothing"
    assert store.ticket_state(tickets[2].ticket_id) == "open"
    assert store.ended_tickets() == (0, {tickets[0].ticket_id, tickets[1].ticket_id})
