"""What only the broker process does, with real ZeroMQ sockets: rejections batched to Redis, rate
limits, dispatch retried after a full pipe. Bus semantics shared with the in-process hub (fan-out,
exactly-one delivery, backpressure, refusals) are in tests/contract/test_bus_contract.py."""

from __future__ import annotations

import time

import zmq

from llamarl.bus import BusClient, query_broker_stats
from llamarl.launch import supervise
from llamarl.net import make_socket
from llamarl.topics import ROLLOUTS
from tests.conftest import start_broker_process
from tests.factories import rollout_group


def test_rejections_are_counted_in_redis(redis_server, store) -> None:
    broker = start_broker_process({"LLAMARL_REDIS_URL": redis_server.url})
    endpoints, proc = broker.endpoints, broker.process
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
        assert supervise.stop(proc) == 0


def test_rate_limit_rejects_a_flooding_peer_before_decoding() -> None:
    limits = {"LLAMARL__BROKER__RATE_LIMIT_PER_S": "50", "LLAMARL__BROKER__RATE_BURST": "100"}
    broker = start_broker_process(limits)
    endpoints, proc = broker.endpoints, broker.process
    try:
        producer = BusClient(endpoints, run_id="test", sender="flood")
        for index in range(1000):
            producer.push(ROLLOUTS, rollout_group(index), 0)
        producer.close()
        # The bucket refills, so this peer's STATS query gets through. Not a poll: a STATS
        # query refused by the limit is itself counted in rejected.rate_limited.
        time.sleep(2.5)
        stats = query_broker_stats(endpoints)
        assert stats["rejected.rate_limited"] + stats["queued.rollouts"] == 1000
        assert 100 <= stats["queued.rollouts"] <= 300, stats
    finally:
        assert supervise.stop(proc) == 0


def test_consumer_whose_pipe_was_full_gets_the_rest_without_returning_credit() -> None:
    """The broker found the consumer's pipe full and kept its credit; once the consumer has read
    its pipe, the rest must follow although the consumer sends nothing more (it had credit for
    all of them from the start)."""
    broker = start_broker_process({"LLAMARL__BROKER__MAX_QUEUE": "100", "LLAMARL__BROKER__HWM": "2"})
    endpoints, proc = broker.endpoints, broker.process
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
        supervise.stop(proc)
