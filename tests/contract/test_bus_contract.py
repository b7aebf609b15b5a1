"""The bus contract (llamarl.bus.interfaces), checked against every implementation: the ZeroMQ
client with a real broker process, and the in-process MemoryHub.

Fan-out reaches every subscriber of a topic and no other; each work message reaches exactly one
consumer, in each producer's order, none lost; a full work queue blocks a push until TimeoutError
and loses nothing; malformed messages are refused and counted while the bus keeps serving.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import msgpack
import pytest

from llamarl.bus import Bus, Subscription, WorkQueue
from llamarl.protocol import (
    Control,
    Envelope,
    Heartbeat,
    VersionAnnouncement,
    encode,
    make_envelope,
)
from llamarl.topics import CONTROL, HEARTBEATS, ROLLOUTS, SCORED, VERSIONS
from tests.contract.bus_harness import RUN_ID, Harness, open_harness
from tests.factories import rollout_group

FANOUT = (VERSIONS, CONTROL, HEARTBEATS)
KINDS = ["zmq", "memory"]


@pytest.fixture(params=KINDS)
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    opened = open_harness(request.param)
    yield opened
    opened.close()


def _fanout_payload(topic: str, index: int) -> object:
    if topic == VERSIONS:
        return VersionAnnouncement(index, 0, "", "gloo", "")
    if topic == CONTROL:
        return Control("tick", {"i": str(index)})
    return Heartbeat("test", "pub", "running", {"i": float(index)})


def _fanout_index(topic: str, envelope: Envelope) -> int:
    payload = envelope.payload
    if topic == VERSIONS:
        return payload.policy_version
    if topic == CONTROL:
        return int(payload.args["i"])
    return int(payload.counters["i"])


def _wait_until_ready(publisher: Bus, subs: dict[str, Subscription], wanted: dict) -> None:
    """Ready handshake for ZeroMQ's slow joiner: warm-up messages (index -1) on every topic until
    each subscription has seen each of its topics."""
    seen: dict[str, set[str]] = {name: set() for name in subs}
    deadline = time.monotonic() + 10
    while seen != wanted:
        assert time.monotonic() < deadline, f"subscriptions never became ready: {seen}"
        for topic in FANOUT:
            publisher.publish(topic, _fanout_payload(topic, -1), 0)
        for name, sub in subs.items():
            while (got := sub.recv(20)) is not None:
                seen[name].add(got[0])


def test_every_subscriber_gets_every_message_of_its_topics_only(harness: Harness) -> None:
    wanted = {"a": {VERSIONS}, "b": {VERSIONS, CONTROL}, "c": {HEARTBEATS}}
    publisher = harness.client("pub")
    listener = harness.client("sub")
    subs = {name: listener.subscribe(topics) for name, topics in wanted.items()}
    _wait_until_ready(publisher, subs, wanted)
    count = 200
    for index in range(count):
        for topic in FANOUT:
            publisher.publish(topic, _fanout_payload(topic, index), 0)
    seen: dict[str, list[tuple[str, int]]] = {name: [] for name in wanted}
    deadline = time.monotonic() + 10
    while any(len(seen[n]) < count * len(wanted[n]) for n in wanted):
        assert time.monotonic() < deadline, {n: len(s) for n, s in seen.items()}
        for name, sub in subs.items():
            while (got := sub.recv(20)) is not None:
                if (index := _fanout_index(got[0], got[1])) >= 0:  # late warm-ups are not counted
                    seen[name].append((got[0], index))
    for name, topics in wanted.items():
        for topic in topics:  # every message, in the publisher's order
            assert [i for t, i in seen[name] if t == topic] == list(range(count)), (name, topic)
        assert {t for t, _ in seen[name]} == topics, name  # and none of other topics


def _consume(harness: Harness, name: str, stop: threading.Event, out: dict) -> None:
    consumer = harness.client(name).consume(ROLLOUTS, credit=4)
    got: list[tuple[str, int]] = out.setdefault(name, [])
    while not stop.is_set():
        if (envelope := consumer.recv(20)) is not None:
            got.append((envelope.sender, envelope.payload.ticket_id))


def test_each_work_message_reaches_exactly_one_of_several_consumers(harness: Harness) -> None:
    num_producers, num_each = 2, 1000
    stop = threading.Event()
    out: dict[str, list[tuple[str, int]]] = {}
    threads = [threading.Thread(target=_consume, args=(harness, f"c{n}", stop, out), daemon=True) for n in range(3)]
    for thread in threads:
        thread.start()
    producers = [harness.client(f"p{n}") for n in range(num_producers)]
    for index in range(num_each):
        for producer in producers:
            producer.push(ROLLOUTS, rollout_group(index), 0)
    deadline = time.monotonic() + 60
    while sum(len(got) for got in out.values()) < num_producers * num_each:
        assert time.monotonic() < deadline, "work went missing"
        time.sleep(0.05)
    time.sleep(0.2)  # a duplicate would arrive now
    stop.set()
    for thread in threads:
        thread.join(10)
    received = [item for got in out.values() for item in got]
    assert len(received) == len(set(received)), "a work message was delivered twice"
    assert sorted(received) == sorted((f"p{n}", i) for n in range(2) for i in range(num_each))
    for got in out.values():  # each consumer sees each producer's messages in order
        for n in range(num_producers):
            indices = [i for sender, i in got if sender == f"p{n}"]
            assert indices == sorted(indices)


def test_work_keeps_each_producers_order_and_loses_none(harness: Harness) -> None:
    producers = [harness.client(f"p{n}") for n in range(2)]
    for index in range(300):
        for producer in producers:
            producer.push(ROLLOUTS, rollout_group(index), 0)
    consumer = harness.client("consumer").consume(ROLLOUTS, credit=8)
    got = [(e.sender, e.payload.ticket_id) for e in _receive(consumer, 600)]
    for n in range(2):
        assert [i for sender, i in got if sender == f"p{n}"] == list(range(300))
    assert len(got) == 600


def _receive(consumer: WorkQueue, count: int) -> list[Envelope]:
    """`count` work messages (failing if they do not come), and any extra that follows soon."""
    got: list[Envelope] = []
    deadline = time.monotonic() + 20
    while len(got) < count:
        assert time.monotonic() < deadline, f"{len(got)} of {count} arrived"
        if (envelope := consumer.recv(100)) is not None:
            got.append(envelope)
    while (envelope := consumer.recv(200)) is not None:
        got.append(envelope)
    return got


@pytest.mark.parametrize("kind", KINDS)
def test_full_queue_blocks_push_until_timeout_and_loses_nothing(kind: str) -> None:
    harness = open_harness(kind, max_queue=20, hwm=5)
    try:
        producer = harness.client("producer")
        accepted = 0
        with pytest.raises(TimeoutError, match="backpressure"):
            for index in range(100_000):
                producer.push(ROLLOUTS, rollout_group(index), 0, timeout_s=1.0)
                accepted += 1
        # ZeroMQ: kernel socket buffers hold some frames beyond the HWMs; the push still blocked.
        assert 20 <= accepted < 100_000
        consumer = harness.client("consumer").consume(ROLLOUTS, credit=8)
        got = [envelope.payload.ticket_id for envelope in _receive(consumer, accepted)]
        assert got == list(range(accepted))
    finally:
        harness.close()


def test_a_live_bus_answers_a_ping(harness: Harness) -> None:
    assert harness.client("pinger").ping(1.0)


def _frame(payload: object, run_id: str = RUN_ID) -> bytes:
    return encode(make_envelope(payload, run_id=run_id, sender="raw", policy_version=0))


def _wait_counted(harness: Harness, key: str, count: int) -> dict[str, int]:
    deadline = time.monotonic() + 10
    while (stats := harness.stats()).get(key, 0) < count:
        assert time.monotonic() < deadline, stats
        time.sleep(0.02)
    return stats


def test_malformed_messages_are_refused_counted_and_serving_continues(harness: Harness) -> None:
    for frames in (
        [ROLLOUTS.encode(), b"\xc1garbage"],
        [b"nosuchtopic", b"x"],
        [b"one-frame-only"],
        [ROLLOUTS.encode(), _frame(Control("stop", {}))],
        [ROLLOUTS.encode(), _frame(rollout_group(1), run_id="another-run")],
    ):
        harness.inject_work(frames)
    harness.inject_fanout([VERSIONS.encode(), msgpack.packb([1, 2])])
    stats = _wait_counted(harness, "rejected", 6)
    assert stats["rejected"] == 6
    for reason in ("garbage", "unknown_topic", "bad_frames", "wrong_topic", "wrong_run"):
        assert stats[f"rejected.{reason}"] == 1, reason
    assert stats["rejected.bad_schema"] == 1
    client = harness.client("ok")
    client.push(ROLLOUTS, rollout_group(5), 0)
    envelope = client.consume(ROLLOUTS).recv(5000)
    assert envelope is not None and envelope.payload.ticket_id == 5
    sub = client.subscribe([CONTROL])
    got = None
    for _ in range(100):  # also the ready handshake for ZeroMQ's slow joiner
        client.publish(CONTROL, Control("stop", {}), 0)
        if (got := sub.recv(50)) is not None:
            break
    assert got is not None and got[1].payload.command == "stop"


def test_a_receiver_refuses_and_reports_what_its_own_limit_forbids(harness: Harness) -> None:
    """A message the bus carries but over the receiving client's size limit goes to on_reject;
    the next message is still delivered."""
    rejected: list[tuple[str, str]] = []
    consumer = harness.client("small", on_reject=lambda r, d: rejected.append((r, d)), max_message_bytes=4096).consume(
        ROLLOUTS
    )
    producer = harness.client("producer")
    producer.push(ROLLOUTS, rollout_group(1, length=2000), 0)
    producer.push(ROLLOUTS, rollout_group(2), 0)
    envelope = None
    deadline = time.monotonic() + 10
    while envelope is None:
        assert time.monotonic() < deadline
        envelope = consumer.recv(100)
    assert envelope.payload.ticket_id == 2
    assert [reason for reason, _ in rejected] == ["oversize"]


def test_topics_of_the_other_kind_are_refused(harness: Harness) -> None:
    client = harness.client("c")
    with pytest.raises(ValueError):
        client.publish(ROLLOUTS, rollout_group(0), 0)
    with pytest.raises(ValueError):
        client.push(CONTROL, Control("stop", {}), 0)
    with pytest.raises(ValueError):
        client.subscribe([SCORED])
    with pytest.raises(ValueError):
        client.consume(VERSIONS)
