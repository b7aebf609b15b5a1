"""The broker process with real ZeroMQ sockets: fan-out, exactly-one work delivery, rejects."""

from __future__ import annotations

import multiprocessing as mp
import queue
import time

import pytest
import zmq

from llamarl.bus import BusClient, query_broker_stats
from llamarl.net import BrokerEndpoints, free_port_block, make_socket
from llamarl.protocol import Control, Heartbeat, VersionAnnouncement
from llamarl.topics import CONTROL, HEARTBEATS, ROLLOUTS, VERSIONS
from tests.conftest import start_broker_process, stop_process
from tests.factories import rollout_group

NUM_WORK = 10_000


def _payload(topic: str, index: int) -> object:
    if topic == VERSIONS:
        return VersionAnnouncement(index, 0, "", "gloo", "")
    if topic == CONTROL:
        return Control("tick", {"i": str(index)})
    return Heartbeat("test", "pub", "running", {"i": float(index)})


def _index(topic: str, envelope) -> int:
    payload = envelope.payload
    if topic == VERSIONS:
        return payload.policy_version
    if topic == CONTROL:
        return int(payload.args["i"])
    return int(payload.counters["i"])


def test_three_subscribers_get_every_message_of_their_topics_only(broker: BrokerEndpoints) -> None:
    wanted = {"a": {VERSIONS}, "b": {VERSIONS, CONTROL}, "c": {HEARTBEATS}}
    publisher = BusClient(broker, run_id="test", sender="pub")
    listener = BusClient(broker, run_id="test", sender="sub")
    subs = {name: listener.subscribe(topics) for name, topics in wanted.items()}
    seen: dict[str, list[tuple[str, int]]] = {name: [] for name in wanted}

    def drain(timeout_ms: int) -> None:
        for name, sub in subs.items():
            while (got := sub.recv(timeout_ms)) is not None:
                seen[name].append((got[0], _index(got[0], got[1])))

    # Ready handshake for the slow joiner: warm-up messages (index -1) until all have arrived.
    deadline = time.monotonic() + 10
    while any({t for t, _ in seen[n]} != wanted[n] for n in wanted):
        assert time.monotonic() < deadline, "subscriptions never became ready"
        for topic in (VERSIONS, CONTROL, HEARTBEATS):
            publisher.publish(topic, _payload(topic, -1), 0)
        drain(50)
    drain(200)
    seen = {name: [] for name in wanted}
    for index in range(200):
        for topic in (VERSIONS, CONTROL, HEARTBEATS):
            publisher.publish(topic, _payload(topic, index), 0)
    deadline = time.monotonic() + 10
    while any(len(seen[n]) < 200 * len(wanted[n]) for n in wanted) and time.monotonic() < deadline:
        drain(50)
    drain(200)
    for name, topics in wanted.items():
        assert sorted(seen[name]) == sorted((t, i) for t in topics for i in range(200)), name
    publisher.close()
    listener.close()


def consume_until_stopped(endpoints: BrokerEndpoints, ready, stop, out) -> None:
    client = BusClient(endpoints, run_id="test", sender="consumer")
    consumer = client.consume(ROLLOUTS, credit=4)
    ready.set()
    batch: list[int] = []
    while not stop.is_set():
        envelope = consumer.recv(50)
        if envelope is not None:
            batch.append(envelope.payload.ticket_id)
        if batch and (envelope is None or len(batch) >= 500):
            out.put(batch)
            batch = []
    if batch:
        out.put(batch)
    client.close()


def test_two_competing_consumers_get_each_work_message_exactly_once(
    broker: BrokerEndpoints,
) -> None:
    ctx = mp.get_context("spawn")
    stop, out = ctx.Event(), ctx.Queue()
    readies = [ctx.Event(), ctx.Event()]
    procs = [
        ctx.Process(target=consume_until_stopped, args=(broker, ready, stop, out), daemon=True)
        for ready in readies
    ]
    for proc in procs:
        proc.start()
    for ready in readies:
        assert ready.wait(30)
    producer = BusClient(broker, run_id="test", sender="producer")
    message = rollout_group(0)
    for index in range(NUM_WORK):
        producer.push(ROLLOUTS, message.__class__(**{**message.__dict__, "ticket_id": index}), 0)
    received: list[int] = []
    deadline = time.monotonic() + 120
    while len(received) < NUM_WORK and time.monotonic() < deadline:
        try:
            received += out.get(timeout=1)
        except queue.Empty:
            pass
    stop.set()
    for proc in procs:
        proc.join(30)
    while not out.empty():
        received += out.get()
    producer.close()
    assert len(received) == len(set(received)), "a work message was delivered twice"
    assert sorted(received) == list(range(NUM_WORK)), "a work message went missing"


def test_malformed_frames_are_counted_and_the_broker_keeps_serving(broker: BrokerEndpoints) -> None:
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.connect(broker.work_in)
    pub = ctx.socket(zmq.PUB)
    pub.connect(broker.pub_in)
    time.sleep(0.3)  # let the PUB connect before sending (slow joiner)
    bad_work = [[b"rollouts", b"\xc1garbage"], [b"nosuchtopic", b"x"], [b"one-frame-only"]]
    for frames in bad_work:
        push.send_multipart(frames)
    pub.send_multipart([b"versions", b"\x92\x01\x02"])
    client = BusClient(broker, run_id="test", sender="ok")
    client.push(ROLLOUTS, rollout_group(5), 0)
    consumer = client.consume(ROLLOUTS)
    envelope = consumer.recv(5000)
    assert envelope is not None and envelope.payload.ticket_id == 5
    stats = query_broker_stats(broker)
    assert stats["rejected"] == 4
    assert stats["rejected.garbage"] == 1 and stats["rejected.unknown_topic"] == 1
    assert stats["rejected.bad_frames"] == 1 and stats["rejected.bad_schema"] == 1
    client.close()
    push.close(0)
    pub.close(0)
    ctx.term()


def test_full_queue_applies_backpressure_and_loses_nothing() -> None:
    endpoints = BrokerEndpoints("127.0.0.1", free_port_block())
    proc = start_broker_process(
        endpoints, {"LLAMARL__BROKER__MAX_QUEUE": "20", "LLAMARL__BROKER__HWM": "5"}
    )
    try:
        producer = BusClient(endpoints, run_id="test", sender="producer", hwm=5)
        accepted = 0
        with pytest.raises(TimeoutError, match="backpressure"):
            for index in range(100_000):
                producer.push(ROLLOUTS, rollout_group(index), 0, timeout_s=1.0)
                accepted += 1
        # Kernel socket buffers hold some frames beyond the HWMs; the push still blocked.
        assert 20 <= accepted < 100_000
        consumer_client = BusClient(endpoints, run_id="test", sender="consumer")
        consumer = consumer_client.consume(ROLLOUTS, credit=8)
        got = []
        while (envelope := consumer.recv(2000)) is not None:
            got.append(envelope.payload.ticket_id)
        assert got == list(range(accepted))
        producer.close()
        consumer_client.close()
    finally:
        stop_process(proc)


def test_rejections_are_counted_in_redis(redis_server, store) -> None:
    endpoints = BrokerEndpoints("127.0.0.1", free_port_block())
    proc = start_broker_process(endpoints, {"LLAMARL_REDIS_URL": redis_server.url})
    try:
        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.connect(endpoints.work_in)
        for _ in range(3):
            push.send_multipart([b"rollouts", b"not msgpack \xc1"])
        deadline = time.monotonic() + 10
        while store.rejected().get("broker.garbage", 0) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        push.close(0)
        ctx.term()
    finally:
        assert stop_process(proc) == 0


def test_rate_limit_rejects_a_flooding_peer_before_decoding() -> None:
    endpoints = BrokerEndpoints("127.0.0.1", free_port_block())
    limits = {"LLAMARL__BROKER__RATE_LIMIT_PER_S": "50", "LLAMARL__BROKER__RATE_BURST": "100"}
    proc = start_broker_process(endpoints, limits)
    try:
        producer = BusClient(endpoints, run_id="test", sender="flood")
        for index in range(1000):
            producer.push(ROLLOUTS, rollout_group(index), 0)
        producer.close()
        time.sleep(2.5)  # the bucket refills, so this peer's STATS query gets through
        stats = query_broker_stats(endpoints)
        assert stats["rejected.rate_limited"] + stats["queued.rollouts"] == 1000
        assert 100 <= stats["queued.rollouts"] <= 300, stats
    finally:
        assert stop_process(proc) == 0


def test_consumer_whose_pipe_was_full_gets_the_rest_without_returning_credit() -> None:
    """The broker found the consumer's pipe full and kept its credit; once the consumer has read
    its pipe, the rest must follow although the consumer sends nothing more (it had credit for
    all of them from the start)."""
    endpoints = BrokerEndpoints("127.0.0.1", free_port_block())
    proc = start_broker_process(
        endpoints, {"LLAMARL__BROKER__MAX_QUEUE": "100", "LLAMARL__BROKER__HWM": "2"}
    )
    ctx = zmq.Context()
    try:
        count = 40  # of 1.2 MB each: more than the loopback socket buffers hold
        producer = BusClient(endpoints, run_id="test", sender="producer")
        for index in range(count):
            producer.push(ROLLOUTS, rollout_group(index, length=50_000), 0)
        dealer = make_socket(ctx, zmq.DEALER, 2)
        dealer.connect(endpoints.work_out)
        dealer.send_multipart([b"CREDIT", ROLLOUTS.encode(), str(count).encode()])
        deadline = time.monotonic() + 20
        while query_broker_stats(endpoints)["queued.rollouts"] in (0, count):
            assert time.monotonic() < deadline, "the broker never found the pipe full"
        received = 0
        while dealer.poll(5000):
            dealer.recv_multipart()
            received += 1
        assert received == count
        producer.close()
    finally:
        ctx.destroy(linger=0)
        stop_process(proc)
