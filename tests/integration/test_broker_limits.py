"""The broker's own limits, against a real broker process: a wildcard subscription gets nothing,
a flood of credit messages does not stall it, oversized frames are refused before they are
buffered, and work queues are bounded in bytes as well as messages."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from llamarl.bus import BusClient, query_broker_stats
from llamarl.launch import supervise
from llamarl.net import BrokerEndpoints
from llamarl.protocol import VersionAnnouncement
from llamarl.topics import ROLLOUTS, VERSIONS
from tests.conftest import start_broker_process
from tests.factories import rollout_group

MAX_MESSAGE_BYTES = 1 << 20
MAX_QUEUE_BYTES = 4 << 20


@pytest.fixture
def limited_broker() -> Iterator[tuple[BrokerEndpoints, int]]:
    broker = start_broker_process(
        {
            "LLAMARL__BROKER__MAX_MESSAGE_BYTES": str(MAX_MESSAGE_BYTES),
            "LLAMARL__BROKER__MAX_QUEUE_BYTES": str(MAX_QUEUE_BYTES),
            "LLAMARL__BROKER__HWM": "5",
        }
    )
    try:
        yield broker.endpoints, broker.process.pid
    finally:
        supervise.stop(broker.process)


def _peak_rss_bytes(pid: int) -> int:
    """The process's peak resident set size (VmHWM): a frame buffered and freed counts."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")


def test_a_wildcard_subscription_receives_nothing(limited_broker) -> None:
    endpoints, _ = limited_broker
    ctx = zmq.Context()
    wildcard = ctx.socket(zmq.SUB)
    wildcard.setsockopt(zmq.SUBSCRIBE, b"")
    wildcard.connect(endpoints.sub_out)
    publisher = BusClient(endpoints, run_id="test", sender="pub")
    member = BusClient(endpoints, run_id="test", sender="sub").subscribe([VERSIONS])
    try:
        deadline = time.monotonic() + 10
        while member.recv(50) is None:  # until the member's subscription is in place
            assert time.monotonic() < deadline, "the member never received a version"
            publisher.publish(VERSIONS, VersionAnnouncement(1, 0, "", "shm", ""), 1)
        publisher.publish(VERSIONS, VersionAnnouncement(2, 0, "", "shm", ""), 2)
        assert member.recv(2000) is not None
        assert not wildcard.poll(500), "a wildcard subscriber received a publication"
        assert query_broker_stats(endpoints)["rejected.unknown_topic"] == 1
    finally:
        member.close()
        publisher.close()
        ctx.destroy(linger=0)


def test_stats_are_answered_within_a_second_during_a_credit_flood(limited_broker) -> None:
    endpoints, _ = limited_broker
    ctx = zmq.Context()
    flooders = [ctx.socket(zmq.DEALER) for _ in range(10)]
    try:
        for flooder in flooders:
            flooder.connect(endpoints.work_out)
            for _ in range(1000):
                flooder.send_multipart([b"READY", ROLLOUTS.encode(), b"1000"])
        for _ in range(3):
            query_broker_stats(endpoints, timeout_s=1.0)  # raises TimeoutError after 1 s
    finally:
        ctx.destroy(linger=0)


def test_oversized_frames_are_refused_before_the_broker_buffers_them(limited_broker) -> None:
    endpoints, pid = limited_broker
    before = _peak_rss_bytes(pid)
    ctx = zmq.Context()
    try:
        for _ in range(8):  # 8 x 32 MB, each 32 times the limit, on fresh connections
            push = ctx.socket(zmq.PUSH)
            push.connect(endpoints.work_in)
            push.send_multipart([ROLLOUTS.encode(), b"\0" * (32 << 20)])
            push.close(linger=2000)
        query_broker_stats(endpoints, timeout_s=5.0)  # it still serves
        grown = _peak_rss_bytes(pid) - before
        assert grown < 2 * (MAX_MESSAGE_BYTES + MAX_QUEUE_BYTES), f"broker grew {grown >> 20} MB"
    finally:
        ctx.destroy(linger=0)


def test_work_queues_are_bounded_in_bytes(limited_broker) -> None:
    endpoints, _ = limited_broker
    producer = BusClient(endpoints, run_id="test", sender="producer", hwm=5)
    group = rollout_group(0, num_samples=4, length=10_000)  # about 480 KB encoded
    try:
        with pytest.raises(TimeoutError, match="backpressure"):
            for index in range(1000):
                producer.push(ROLLOUTS, rollout_group(index, num_samples=4, length=10_000), 0, timeout_s=1.0)
        queued = query_broker_stats(endpoints)["queued.rollouts"]
        size = len(group.completion_tokens.data) * 3
        assert queued * size <= MAX_QUEUE_BYTES + 2 * size, f"{queued} messages queued"
    finally:
        producer.close()
