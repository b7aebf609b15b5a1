"""The store contract (llamarl.store.interfaces), checked against every implementation: RedisStore
on a real redis-server and the in-process MemoryStore.

Versions only increase; the gate bounds claims by the staleness limit, a publish reopens it and a
ticket ended untrained (dropped stale or skipped) gives its slot back;
an expired lease is reissued with the next attempt and the older attempt loses it; every ticket
ends exactly once and the ledger balances; reopening, expiring leases, compaction, the worker
registry, the run status, the rejection counters and held-out evaluation claims (a dead
claimer's chunk claimed again, its late result refused) behave the same on both.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from brokers.redis_server import RedisServer
from llamarl.errors import StaleVersionError
from llamarl.store import OUTCOMES, EvaluationClaim, Store, Ticket, WorkerBeat, admission_bound
from tests.contract.store_backends import KINDS, Backend, open_backend

GATE: dict[str, Any] = {"lease_s": 60.0, "max_staleness": 1, "prompts_per_step": 5}
BOUND_AT_0 = (0 + 1 + 1) * 5  # tickets the gate admits at version 0 with GATE
SHORT_LEASE_S = 0.3
TTL_S = 1.0


@pytest.fixture(params=KINDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    servers: list[RedisServer] = []

    def start_redis() -> RedisServer:
        servers.append(RedisServer(tmp_path / "redis").start())
        return servers[0]

    opened = open_backend(request.param, start_redis)
    yield opened
    opened.close()
    for server in servers:
        server.stop()


def claim_one(store: Store, worker_id: str, **gate: Any) -> Ticket | None:
    got = store.claim_tickets(worker_id, 1, **{**GATE, **gate})
    assert len(got) <= 1
    return got[0] if got else None


def end(store: Store, ticket_id: int, outcome: str = "trained") -> bool:
    return store.end_tickets([(ticket_id, outcome)])[0]


def claim_all(store: Store, worker_id: str, **gate: Any) -> list[Ticket]:
    return store.claim_tickets(worker_id, 1000, **{**GATE, **gate})


# -- versions ---------------------------------------------------------------------------------
def test_policy_version_only_goes_up(backend: Backend) -> None:
    store = backend.store
    assert store.policy_version() == -1
    assert store.version_meta() == {}
    store.publish_version(0, {"checksum": "a", "transport": "gloo"})
    store.publish_version(3, {"checksum": "b", "num_bytes": 10, "scale": 0.5})
    for stale in (3, 2, -1):
        with pytest.raises(StaleVersionError, match=f"{stale} is not above current 3"):
            store.publish_version(stale, {"checksum": "stale"})
    assert store.policy_version() == 3
    meta = store.version_meta()
    assert float(meta.pop("published_at")) > 0
    assert meta == {"policy_version": "3", "checksum": "b", "num_bytes": "10", "scale": "0.5"}


def test_each_rank_keeps_its_newest_shard(backend: Backend) -> None:
    store = backend.store
    assert store.version_shards() == {}
    store.put_version_shard(1, {"policy_version": 4, "endpoint": "tcp://h:1", "num_bytes": 8})
    store.put_version_shard(2, {"policy_version": 4, "endpoint": "tcp://h:2", "num_bytes": 8})
    store.put_version_shard(1, {"policy_version": 5, "endpoint": "tcp://h:1", "num_bytes": 8})
    assert store.version_shards() == {
        1: {"policy_version": "5", "endpoint": "tcp://h:1", "num_bytes": "8"},
        2: {"policy_version": "4", "endpoint": "tcp://h:2", "num_bytes": "8"},
    }


# -- the admission gate -----------------------------------------------------------------------
def test_gate_stops_claims_until_a_publish_reopens_it(backend: Backend) -> None:
    store = backend.store
    first = claim_all(store, "g0")
    assert [t.ticket_id for t in first] == list(range(BOUND_AT_0)), "v0 before any publish"
    assert all(t.attempt == 0 and not t.reissued for t in first)
    assert claim_all(store, "g0") == []
    store.publish_version(0, {})
    assert claim_all(store, "g0") == [], "publishing v0 moves nothing"
    store.publish_version(1, {})
    assert [t.ticket_id for t in claim_all(store, "g1")] == list(range(10, 15))
    store.publish_version(3, {})
    assert [t.ticket_id for t in claim_all(store, "g1")] == list(range(15, 25))
    assert claim_all(store, "g1") == []
    assert store.ledger()["issued"] == 25


@pytest.mark.parametrize(("max_staleness", "prompts_per_step", "versions"), [(0, 3, 3), (1, 5, 2), (3, 2, 4)])
def test_gate_admits_exactly_the_python_bound(
    backend: Backend, max_staleness: int, prompts_per_step: int, versions: int
) -> None:
    """The Redis store's Lua copy of the bound and the memory store's Python one
    (`admission_bound`) admit the same tickets, version after version."""
    store = backend.store
    gate = {"lease_s": 60.0, "max_staleness": max_staleness, "prompts_per_step": prompts_per_step}
    claimed = 0
    for version in range(versions):
        store.publish_version(version, {})
        claimed += len(store.claim_tickets("g0", 1000, **gate))
        assert claimed == admission_bound(version, max_staleness, prompts_per_step), version


def test_concurrent_claims_never_exceed_the_gate(backend: Backend) -> None:
    store = backend.store
    store.publish_version(2, {})
    bound = (2 + GATE["max_staleness"] + 1) * GATE["prompts_per_step"]

    def claim_in_threads(num_threads: int = 4) -> list[int]:
        claimed: list[list[int]] = [[] for _ in range(num_threads)]

        def claim(index: int) -> None:
            while got := claim_one(store, f"w{index}"):
                claimed[index].append(got.ticket_id)

        threads = [threading.Thread(target=claim, args=(i,)) for i in range(num_threads)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
            assert not thread.is_alive()
        return sorted(t for ids in claimed for t in ids)

    assert claim_in_threads() == list(range(bound))
    store.publish_version(3, {})
    assert claim_in_threads() == list(range(bound, bound + GATE["prompts_per_step"]))
    assert store.ledger()["issued"] == bound + GATE["prompts_per_step"]


def test_dropped_and_skipped_tickets_return_their_slot(backend: Backend) -> None:
    store = backend.store
    tickets = claim_all(store, "w")
    assert len(tickets) == BOUND_AT_0
    end(store, tickets[0].ticket_id, "dropped_stale")
    end(store, tickets[1].ticket_id, "trained")
    end(store, tickets[2].ticket_id, "skipped")
    again = [t.ticket_id for t in claim_all(store, "w")]
    assert again == [BOUND_AT_0, BOUND_AT_0 + 1], "trained frees nothing"


def test_total_tickets_caps_the_run(backend: Backend) -> None:
    store = backend.store
    got = [claim_one(store, "w", total_tickets=3) for _ in range(5)]
    assert [t is not None for t in got] == [True, True, True, False, False]
    end(store, 0, "dropped_stale")
    replacement = claim_one(store, "w", total_tickets=3)
    assert replacement is not None and replacement.ticket_id == 3, "a dropped ticket is redone"
    assert claim_one(store, "w", total_tickets=3) is None
    end(store, 1, "skipped")
    replacement = claim_one(store, "w", total_tickets=3)
    assert replacement is not None and replacement.ticket_id == 4, "so is a skipped one"


def test_gate_discounts_version_numbers_skipped_by_a_resume(backend: Backend) -> None:
    store = backend.store
    store.publish_version(2, {})
    store.set_version_offset(2)  # the model behind version 2 is the one of version 0
    assert len(claim_all(store, "g0")) == BOUND_AT_0
    store.set_version_offset(5)  # more skipped than published: the gate stays at version 0
    store.publish_version(3, {})
    assert claim_all(store, "g0") == []
    store.set_version_offset(2)  # set, not added: version 3 is now the trained version 1
    assert len(claim_all(store, "g0")) == (1 + 1 + 1) * 5 - BOUND_AT_0


def test_claims_come_in_batches_gated_on_the_loaded_version(backend: Backend) -> None:
    store = backend.store
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


# -- leases -----------------------------------------------------------------------------------
def test_expired_lease_is_reissued_with_the_next_attempt(backend: Backend) -> None:
    store = backend.store
    first = claim_one(store, "dead-worker", lease_s=SHORT_LEASE_S, total_tickets=1)
    assert first is not None and (first.attempt, first.reissued) == (0, False)

    def reissue(worker_id: str) -> Ticket | None:  # total_tickets=1: nothing new can be issued
        return claim_one(store, worker_id, lease_s=SHORT_LEASE_S, total_tickets=1)

    second = backend.until(lambda: reissue("w1"), "reissue after the lease expired")
    assert (second.ticket_id, second.attempt, second.reissued) == (first.ticket_id, 1, True)
    third = backend.until(lambda: reissue("w2"), "second reissue")
    assert (third.ticket_id, third.attempt, third.reissued) == (first.ticket_id, 2, True)
    assert store.renew_leases([first, second, third], 60) == [False, False, True]
    assert store.ledger()["reissued"] == 2
    assert end(store, first.ticket_id), "any attempt may end the ticket, once"
    assert not end(store, third.ticket_id)
    assert store.renew_leases([third], 60) == [False], "an ended ticket holds no lease"
    ledger = store.ledger()
    assert (ledger["issued"], ledger["trained"], ledger["duplicate"], ledger["open"]) == (
        1,
        1,
        1,
        0,
    )


def test_only_a_lapsed_lease_is_reissued_not_a_renewed_or_ended_one(backend: Backend) -> None:
    store = backend.store
    renewed, ended, lapsing = (claim_one(store, "w0", lease_s=SHORT_LEASE_S) for _ in range(3))
    assert renewed and ended and lapsing  # `lapsing` expires no earlier than the other two
    assert store.renew_leases([renewed], 60) == [True]
    assert end(store, ended.ticket_id)
    reissued = backend.until(lambda: store.claim_tickets("w1", 3, **GATE, total_tickets=3), "reissue of the lapsed")
    assert [(t.ticket_id, t.attempt) for t in reissued] == [(lapsing.ticket_id, 1)]
    assert store.renew_leases([renewed, ended, lapsing], 60) == [True, False, False]
    assert store.renew_leases([], 60) == []


def test_expired_tickets_come_before_new_ones(backend: Backend) -> None:
    store = backend.store
    tickets = [claim_one(store, "g0") for _ in range(4)]
    for ticket in tickets:
        assert ticket is not None and end(store, ticket.ticket_id)
    for ticket_id in (2, 0):
        assert store.reopen_ticket(ticket_id, requeue=True)
    got = store.claim_tickets("g1", 3, **GATE)
    assert [(t.ticket_id, t.attempt, t.reissued) for t in got] == [
        (0, 1, True),
        (2, 1, True),
        (4, 0, False),
    ]


# -- the ledger -------------------------------------------------------------------------------
def test_ending_is_exactly_once_and_writes_the_heartbeat(backend: Backend) -> None:
    store = backend.store
    tickets = store.claim_tickets("g0", 3, **GATE)
    beat = WorkerBeat("trainer", TTL_S * 30, {"step": 7, "role": "trainer"})
    ended = store.end_tickets(
        [(tickets[0].ticket_id, "trained"), (tickets[1].ticket_id, "dropped_stale")], heartbeat=beat
    )
    assert ended == [True, True]
    assert store.end_tickets([(tickets[0].ticket_id, "trained")]) == [False]
    assert store.end_tickets([(tickets[2].ticket_id, "skipped")] * 2) == [True, False]
    assert store.end_tickets([(tickets[2].ticket_id, "trained")]) == [False], "ended once"
    trainer = next(w for w in store.workers() if w.worker_id == "trainer")
    assert trainer.alive and trainer.fields["step"] == "7"
    assert [store.ticket_state(t.ticket_id) for t in tickets] == [
        "trained",
        "dropped_stale",
        "skipped",
    ]
    ledger = store.ledger()
    assert (ledger["trained"], ledger["dropped_stale"], ledger["skipped"]) == (1, 1, 1)
    assert ledger["duplicate"] == 3 and ledger["open"] == 0
    assert store.ended_tickets() == (0, {t.ticket_id for t in tickets})


def test_a_bad_batch_ends_nothing(backend: Backend) -> None:
    store = backend.store
    ticket = claim_one(store, "g0")
    assert ticket is not None
    before = store.ledger()
    with pytest.raises(KeyError, match="ticket 55 was never issued"):
        store.end_tickets([(ticket.ticket_id, "trained"), (55, "trained")])
    with pytest.raises(ValueError, match="outcome must be one of"):
        store.end_tickets([(ticket.ticket_id, "trained"), (ticket.ticket_id, "lost")])
    assert store.ledger() == before
    assert store.ticket_state(ticket.ticket_id) == "open"
    assert store.ticket_state(55) is None
    assert store.ended_tickets() == (0, set())


def test_reopened_tickets_are_reissued_or_held(backend: Backend) -> None:
    store = backend.store
    store.publish_version(0, {})
    held, requeued, dropped, still_open, skipped = (claim_one(store, "g0") for _ in range(5))
    assert held and requeued and dropped and still_open and skipped
    for ticket in (held, requeued):
        assert end(store, ticket.ticket_id, "trained")
    end(store, dropped.ticket_id, "dropped_stale")
    end(store, skipped.ticket_id, "skipped")
    assert store.reopen_ticket(held.ticket_id, requeue=False)
    assert store.reopen_ticket(requeued.ticket_id, requeue=True)
    assert not store.reopen_ticket(dropped.ticket_id, requeue=True)
    assert not store.reopen_ticket(skipped.ticket_id, requeue=False)
    assert not store.reopen_ticket(99, requeue=True)
    assert store.reopen_ticket(still_open.ticket_id, requeue=False), "already open"
    assert store.renew_leases([still_open], 60) == [False], "requeue=False takes the lease"
    ledger = store.ledger()
    assert (ledger["trained"], ledger["reopened"], ledger["open"]) == (0, 2, 3)
    assert store.ticket_state(dropped.ticket_id) == "dropped_stale"
    again = store.claim_tickets("g1", 2, **GATE)
    assert [(t.ticket_id, t.reissued) for t in again] == [(requeued.ticket_id, True), (5, False)]
    assert end(store, held.ticket_id, "trained"), "a held ticket ends once more"
    assert store.ledger()["trained"] == 1


def test_expired_leases_are_reissued_first_and_ended_tickets_stay_ended(backend: Backend) -> None:
    """What a resumed trainer does with the tickets issued to the trainer before it: every open
    ticket with a lease is reissued by the next claims, none waits out its lease."""
    store = backend.store
    store.publish_version(0, {})
    leased, held, ended = (claim_one(store, "g0") for _ in range(3))
    assert leased and held and ended
    assert store.reopen_ticket(held.ticket_id, requeue=False), "held by the trainer: no lease"
    assert end(store, ended.ticket_id, "trained")
    ledger = store.ledger()
    assert store.expire_leases() == 1
    assert store.ledger() == ledger, "no count changes"
    again = store.claim_tickets("g1", 2, **GATE)
    assert [(t.ticket_id, t.attempt, t.reissued) for t in again] == [(leased.ticket_id, 1, True), (3, 0, False)]
    assert store.renew_leases([leased], 60) == [False], "the first attempt lost its lease"
    assert store.expire_leases() == 2, "the reissued ticket and the new one"
    assert store.ticket_state(ended.ticket_id) == "trained"


def test_compaction_drops_ended_tickets_below_the_lowest_open_one(backend: Backend) -> None:
    store = backend.store
    store.publish_version(0, {})
    assert len(store.claim_tickets("g0", 8, **GATE)) == 8
    for ticket_id in (0, 1, 2, 4, 5):  # 3, 6 and 7 stay open
        end(store, ticket_id, "trained" if ticket_id != 4 else "dropped_stale")
    ledger_before = store.ledger()
    assert store.compact_tickets(limit=2) == 2, "never above the caller's limit"
    assert store.ended_tickets() == (2, {2, 4, 5})
    assert store.compact_tickets(limit=100) == 3
    assert store.compact_tickets(limit=1) == 3, "the floor never goes down"
    assert store.ledger() == ledger_before, "the ledger keeps every count"
    states = [store.ticket_state(i) for i in range(8)]
    assert states == [None, None, None, "open", "dropped_stale", "trained", "open", "open"]
    assert store.ended_tickets() == (3, {4, 5})
    assert not end(store, 1, "trained"), "a compacted ticket ends only once"
    assert not store.reopen_ticket(1, requeue=True), "nor can it be reopened"
    assert store.ledger()["duplicate"] == ledger_before["duplicate"] + 1
    with pytest.raises(KeyError, match="never issued"):
        end(store, 99, "trained")
    for ticket_id in (3, 6, 7):
        end(store, ticket_id, "trained")
    assert store.compact_tickets(limit=100) == 8, "up to the next ticket to issue"
    assert store.ended_tickets() == (8, set())
    assert [t.ticket_id for t in store.claim_tickets("g0", 1, **GATE)] == [8]


def _check_balance(store: Store) -> None:
    ledger = store.ledger()
    states = [store.ticket_state(i) for i in range(ledger["issued"])]
    assert None not in states
    assert ledger["open"] == states.count("open")
    for outcome in OUTCOMES:
        assert ledger[outcome] == states.count(outcome)
    assert ledger["issued"] == sum(ledger[outcome] for outcome in OUTCOMES) + ledger["open"]


def test_ledger_balances_after_any_mix_of_operations(backend: Backend) -> None:
    store = backend.store
    rng = random.Random(7)
    held: list[Ticket] = []
    for step in range(300):
        action = rng.random()
        if action < 0.4:
            held += store.claim_tickets("g", rng.randint(1, 3), **GATE, total_tickets=60)
        elif action < 0.8 and held:
            ticket = held.pop(rng.randrange(len(held)))
            outcome = rng.choice(["trained", "trained", "dropped_stale", "skipped"])
            end(store, ticket.ticket_id, outcome)
        elif action < 0.9:
            store.reopen_ticket(rng.randrange(step + 1), requeue=rng.random() < 0.5)
        else:
            store.publish_version(step, {})
        if step % 20 == 0:
            _check_balance(store)
    _check_balance(store)
    ledger = store.ledger()
    assert ledger["reopened"] > 0 and ledger["reissued"] > 0 and ledger["duplicate"] > 0
    live = ledger["issued"] - ledger["dropped_stale"] - ledger["skipped"]
    assert live == 60, "total_tickets caps the live ones"


# -- registry, run status, rejections ---------------------------------------------------------
def test_worker_whose_heartbeat_stops_is_reported_dead(backend: Backend) -> None:
    store = backend.store
    store.register_worker("gen-0", "generator", ttl_s=TTL_S)
    store.register_worker("gen-1", "generator", ttl_s=TTL_S, device="cpu")
    assert [(w.worker_id, w.alive) for w in store.workers()] == [("gen-0", True), ("gen-1", True)]

    def only_gen_0_dead() -> bool:
        store.heartbeat("gen-1", ttl_s=TTL_S, status="running", step=3)
        return {w.worker_id: w.alive for w in store.workers()} == {"gen-0": False, "gen-1": True}

    backend.until(only_gen_0_dead, "gen-0 reported dead while gen-1 beats")
    gen_0, gen_1 = store.workers()
    assert gen_0.fields == {}
    assert {k: gen_1.fields[k] for k in ("role", "device", "status", "step")} == {
        "role": "generator",
        "device": "cpu",
        "status": "running",
        "step": "3",
    }
    assert {"pid", "host", "started_at", "last_seen"} <= gen_1.fields.keys()
    store.heartbeat("gen-0", ttl_s=TTL_S, status="running")
    revived = store.workers()[0]
    assert revived.alive and "role" not in revived.fields, "an expired entry starts over"
    store.register_worker("gen-1", "trainer", ttl_s=TTL_S)
    assert store.workers()[1].fields["status"] == "starting", "registering replaces the entry"
    assert "device" not in store.workers()[1].fields


def test_a_worker_that_stopped_is_reported_stopped_not_dead(backend: Backend) -> None:
    store = backend.store
    store.register_worker("gen-0", "generator", ttl_s=TTL_S)
    store.register_worker("gen-1", "generator", ttl_s=TTL_S)
    store.record_stop("gen-0")

    def gen_1_dead() -> bool:
        return [w.state for w in store.workers()] == ["done", "dead"]

    backend.until(gen_1_dead, "gen-1's registration lapsed")
    stopped = store.workers()[0]
    assert not stopped.alive and stopped.fields["role"] == "generator", "its fields are kept"
    assert stopped.fields["status"] == "stopped"
    store.register_worker("gen-0", "generator", ttl_s=TTL_S)
    assert store.workers()[0].state == "alive", "registering again starts it over"


def test_run_status(backend: Backend) -> None:
    store = backend.store
    assert store.ping()
    assert store.run_status() is None
    store.set_run_status("running")
    assert store.run_status() == "running"
    store.set_run_status("finished")
    assert store.run_status() == "finished"


def test_count_rejected(backend: Backend) -> None:
    store = backend.store
    assert store.rejected() == {}
    store.count_rejected("broker", "oversized")
    store.count_rejected("broker", "oversized", 3)
    store.count_rejected("trainer", "bad_schema", 2)
    assert store.rejected() == {"broker.oversized": 4, "trainer.bad_schema": 2}


def test_each_chunk_of_an_open_evaluation_is_claimed_once_and_entries_read_back_in_order(
    backend: Backend,
) -> None:
    store = backend.store
    store.register_worker("gen-0", "generator", ttl_s=60.0)
    assert store.claim_evaluation_chunk(6, 2, "gen-0") is None, "no evaluation of version 6 is open"
    store.open_evaluation(6)
    store.open_evaluation(12)
    first = store.claim_evaluation_chunk(6, 2, "gen-0")
    store.open_evaluation(6)  # opening again changes nothing
    second = store.claim_evaluation_chunk(6, 2, "gen-0")
    assert store.claim_evaluation_chunk(6, 2, "gen-0") is None, "every chunk is claimed"
    assert store.claim_evaluation_chunk(12, 3, "gen-0") == EvaluationClaim(12, 0, 0)
    assert (first, second) == (EvaluationClaim(6, 0, 0), EvaluationClaim(6, 1, 0))
    assert store.awaited_evaluations() == 3, "claimed by a live worker, none in yet"
    assert store.evaluations() == []
    assert store.add_evaluation(first, '{"chunk": 0}') and store.add_evaluation(second, '{"chunk": 1}')
    assert not store.add_evaluation(second, '{"chunk": 1}'), "a chunk's result is added once"
    assert not store.add_evaluation(EvaluationClaim(12, 1, 0), "{}"), "never claimed"
    assert store.evaluations() == ['{"chunk": 0}', '{"chunk": 1}']
    assert store.evaluations(1) == ['{"chunk": 1}'] and store.evaluations(2) == []
    assert store.awaited_evaluations() == 1


def test_a_dead_claimers_chunk_is_claimed_again_and_its_late_result_refused(backend: Backend) -> None:
    store = backend.store
    store.register_worker("gen-0", "generator", ttl_s=TTL_S)
    store.register_worker("gen-1", "generator", ttl_s=TTL_S)
    store.open_evaluation(6)
    lost = store.claim_evaluation_chunk(6, 1, "gen-0")
    assert lost == EvaluationClaim(6, 0, 0)
    assert store.claim_evaluation_chunk(6, 1, "gen-1") is None, "gen-0 is alive: the chunk stays its own"

    def taken_over() -> EvaluationClaim | None:
        store.heartbeat("gen-1", ttl_s=TTL_S)
        return store.claim_evaluation_chunk(6, 1, "gen-1")

    again = backend.until(taken_over, "gen-0's chunk claimed again once gen-0 was reported dead")
    assert again == EvaluationClaim(6, 0, 1), "the same chunk, its next attempt"
    assert store.awaited_evaluations() == 1, "awaited from gen-1"
    assert not store.add_evaluation(lost, "late"), "the dead claimer's late result is refused"
    assert store.add_evaluation(again, "taken over")
    assert not store.add_evaluation(again, "twice")
    assert store.evaluations() == ["taken over"], "the chunk is counted once"
    assert store.awaited_evaluations() == 0
    assert store.claim_evaluation_chunk(6, 1, "gen-1") is None, "nothing left to claim"


def test_a_claim_dies_with_its_claimers_registration(backend: Backend) -> None:
    """A worker restarted under the same id (in a container, with the same pid too) or stopped no
    longer holds its claims; a claim by a worker the registry does not report alive is dead from
    the start."""
    store = backend.store
    store.register_worker("gen-0", "generator", ttl_s=60.0, pid=1)
    store.register_worker("gen-1", "generator", ttl_s=60.0)
    store.open_evaluation(6)
    assert store.claim_evaluation_chunk(6, 3, "gen-0") == EvaluationClaim(6, 0, 0)
    store.register_worker("gen-0", "generator", ttl_s=60.0, pid=1)  # restarted: PID 1 again
    assert store.awaited_evaluations() == 0
    assert store.claim_evaluation_chunk(6, 3, "gen-0") == EvaluationClaim(6, 0, 1), "its predecessor's"
    assert store.claim_evaluation_chunk(6, 3, "gen-1") == EvaluationClaim(6, 1, 0)
    store.record_stop("gen-1")
    assert store.claim_evaluation_chunk(6, 3, "gen-0") == EvaluationClaim(6, 1, 1), "gen-1 stopped"
    assert store.claim_evaluation_chunk(6, 3, "ghost") == EvaluationClaim(6, 2, 0)
    assert store.awaited_evaluations() == 2, "gen-0's two; the unregistered ghost's is not awaited"
    assert store.claim_evaluation_chunk(6, 3, "gen-0") == EvaluationClaim(6, 2, 1)
