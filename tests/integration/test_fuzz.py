"""Fuzz: 5,000 invalid messages to each broker endpoint and to each input of every worker role
(real processes, real sockets, real Redis). Nothing crashes, every message is counted as rejected
(locally and in Redis), memory stays bounded, and valid traffic still flows afterwards."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
import zmq

from brokers.redis_server import RedisServer
from llamarl.bus import BusClient, query_broker_stats
from llamarl.launch import supervise
from llamarl.net import BrokerEndpoints, free_port_block
from llamarl.protocol import Control
from llamarl.store import RedisStore
from llamarl.topics import CONTROL, ROLLOUTS, SCORED
from tests.conftest import start_broker_process
from tests.fuzz import bad_commands, bad_messages, bad_subscriptions, bad_sync_requests
from tests.integration.async_helpers import worker_argv, write_config

FRAMES = 5_000
MAX_BYTES = 4096
BATCH = 1000  # below the high-water marks on the way (1000 + 1000), so none is dropped
RSS_GROWTH_KB = 64 * 1024


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def _connect(sock: zmq.Socket, endpoint: str) -> None:
    """Connect and wait for the ZMTP handshake, so nothing sent afterwards is dropped."""
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    sock.connect(endpoint)
    assert monitor.poll(10_000), f"no handshake with {endpoint}"
    sock.disable_monitor()
    monitor.close(linger=0)
    if sock.type == zmq.XPUB:  # a PUB drops everything until the peer has subscribed
        assert sock.poll(10_000), f"no subscription from {endpoint}"
        sock.recv()


def _send_paced(
    send: Callable[[list[bytes]], None],
    messages: Iterable[list[bytes]],
    rejected: Callable[[], int],
    between: Callable[[], None] = lambda: None,
) -> int:
    """Send in batches, each once the receiver has counted the previous one (no HWM drops)."""
    start = rejected()
    sent = 0
    iterator = iter(messages)
    while batch := list(itertools.islice(iterator, BATCH)):
        for message in batch:
            send(message)
        sent += len(batch)
        deadline = time.monotonic() + 30
        while rejected() - start < sent:
            assert time.monotonic() < deadline, f"{rejected() - start} of {sent} counted"
            between()
            time.sleep(0.02)
    return sent


def _redis_rejected(store: RedisStore, source: str) -> int:
    return sum(n for key, n in store.rejected().items() if key.startswith(f"{source}."))


def test_broker_endpoints_reject_and_count_every_bad_frame(redis_server: RedisServer, store: RedisStore) -> None:
    env = {
        "LLAMARL_REDIS_URL": redis_server.url,
        "LLAMARL_RUN_ID": "test",
        "LLAMARL__BROKER__MAX_MESSAGE_BYTES": str(MAX_BYTES),
    }
    broker = start_broker_process(env)
    endpoints, proc = broker.endpoints, broker.process
    ctx = zmq.Context()
    try:

        def counted() -> int:
            return int(query_broker_stats(endpoints).get("rejected", 0))

        rss_before = _rss_kb(proc.pid)
        plans = [
            # Oversized frames: ZeroMQ drops them and disconnects the sender before the broker
            # sees them (tests/integration/test_broker_limits.py), so none is sent here.
            (
                zmq.XPUB,
                endpoints.pub_in,
                bad_messages(FRAMES, topic=CONTROL, run_id="test", max_bytes=MAX_BYTES, seed=1, oversize=False),
            ),
            (
                zmq.PUSH,
                endpoints.work_in,
                bad_messages(FRAMES, topic=ROLLOUTS, run_id="test", max_bytes=MAX_BYTES, seed=2, oversize=False),
            ),
            (zmq.DEALER, endpoints.work_out, bad_commands(FRAMES, seed=3)),
            (zmq.XSUB, endpoints.sub_out, bad_subscriptions(FRAMES, seed=4)),
        ]
        total = 0
        for kind, endpoint, messages in plans:
            sock = ctx.socket(kind)
            sock.setsockopt(zmq.LINGER, 0)
            _connect(sock, endpoint)
            total += _send_paced(sock.send_multipart, messages, counted)
            sock.close()
        assert total == 4 * FRAMES
        assert proc.poll() is None, "broker crashed"
        assert counted() == total
        deadline = time.monotonic() + 10
        while _redis_rejected(store, "broker") < total and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _redis_rejected(store, "broker") == total
        assert _rss_kb(proc.pid) - rss_before < RSS_GROWTH_KB
        # Valid traffic still flows.
        client = BusClient(endpoints, run_id="test", sender="ok")
        sub = client.subscribe([CONTROL])
        got = None
        for _ in range(100):
            client.publish(CONTROL, Control("stop", {}), 0)
            if (got := sub.recv(50)) is not None:
                break
        client.close()
        assert got is not None and got[1].payload.command == "stop"
    finally:
        ctx.term()
        assert supervise.stop(proc) == 0


class FakeBroker:
    """The broker's four sockets, held by the test, so it can send a worker anything."""

    def __init__(self, ctx: zmq.Context) -> None:
        self.endpoints = BrokerEndpoints("127.0.0.1", free_port_block())
        self.xpub = ctx.socket(zmq.XPUB)
        self.router = ctx.socket(zmq.ROUTER)
        self.xsub = ctx.socket(zmq.XSUB)
        self.pull = ctx.socket(zmq.PULL)
        for sock, endpoint in (
            (self.xpub, self.endpoints.sub_out),
            (self.router, self.endpoints.work_out),
            (self.xsub, self.endpoints.pub_in),
            (self.pull, self.endpoints.work_in),
        ):
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind(endpoint)
        self.consumers: dict[bytes, bytes] = {}

    def wait_for_subscriber(self) -> None:
        assert self.xpub.poll(60_000), "the worker never subscribed"
        assert self.xpub.recv() == b"\x01" + CONTROL.encode()

    def drain(self) -> None:
        """Read what workers send the broker (credits, acknowledgements), noting consumers."""
        while self.router.poll(0):
            identity, command, *rest = self.router.recv_multipart()
            if command in (b"CREDIT", b"READY") and rest:
                self.consumers[rest[0]] = identity

    def consumer_of(self, topic: str) -> bytes:
        deadline = time.monotonic() + 60
        while topic.encode() not in self.consumers:
            assert time.monotonic() < deadline, f"no consumer of {topic}"
            self.drain()
            time.sleep(0.05)
        return self.consumers[topic.encode()]


def _start_worker(role: str, config: Path, broker: FakeBroker, redis_url: str) -> subprocess.Popen:
    env = {**os.environ, "LLAMARL_REDIS_URL": redis_url, "LLAMARL_BROKER": str(broker.endpoints)}
    return subprocess.Popen(
        worker_argv(role, f"{role}-fuzz", config),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


@pytest.mark.parametrize("role", ["generator", "reward", "trainer"])
def test_worker_inputs_reject_and_count_every_bad_message(
    tmp_path: Path, redis_server: RedisServer, store: RedisStore, role: str
) -> None:
    # The fake broker answers no pings: the worker must not give up on it meanwhile.
    broker_config = {"max_message_bytes": MAX_BYTES, "dead_after_s": 3600}
    config = write_config(tmp_path, "test", broker=broker_config, sync={"transport": "gloo"})
    ctx = zmq.Context()
    broker = FakeBroker(ctx)
    proc = _start_worker(role, config, broker, redis_server.url)
    try:
        broker.wait_for_subscriber()

        def counted() -> int:
            return _redis_rejected(store, role)

        def control(message: list[bytes]) -> None:
            broker.xpub.send_multipart(message)

        inputs: list[tuple[Callable[[list[bytes]], None], Iterable[list[bytes]]]] = [
            (
                control,
                bad_messages(FRAMES, topic=CONTROL, run_id="test", max_bytes=MAX_BYTES, subscribed=True),
            )
        ]
        work_topic = {"reward": ROLLOUTS, "trainer": SCORED}.get(role)
        if work_topic is not None:
            identity = broker.consumer_of(work_topic)

            def work(message: list[bytes]) -> None:
                broker.router.send_multipart([identity, *message])

            messages = bad_messages(FRAMES, topic=work_topic, run_id="test", max_bytes=MAX_BYTES, seed=5)
            inputs.append((work, messages))
        sync = None
        if role == "trainer":
            deadline = time.monotonic() + 120
            while "endpoint" not in (meta := store.version_meta()):
                assert time.monotonic() < deadline and proc.poll() is None, "no version published"
                time.sleep(0.1)
            sync = ctx.socket(zmq.DEALER)
            sync.setsockopt(zmq.LINGER, 0)
            _connect(sync, meta["endpoint"])
            inputs.append((sync.send_multipart, bad_sync_requests(FRAMES, seed=6)))

        def drain() -> None:
            broker.drain()
            while sync is not None and sync.poll(0):
                sync.recv_multipart()  # the server's "bad request" answers

        rss_before = _rss_kb(proc.pid)
        total = sum(_send_paced(send, messages, counted, drain) for send, messages in inputs)
        assert total == FRAMES * len(inputs)
        assert proc.poll() is None, f"{role} crashed"
        assert counted() == total
        assert _rss_kb(proc.pid) - rss_before < RSS_GROWTH_KB
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        ctx.destroy(linger=0)
