"""With CURVE on, a client without the right keys can neither publish nor receive, on the broker
and on the trainer's weight-sync socket; clients holding the keys work as usual. Real broker
process, real sockets, keys from `llamarl keys generate`."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from llamarl.bus import BusClient, query_broker_stats
from llamarl.curve import Curve
from llamarl.errors import SyncError
from llamarl.launch import supervise
from llamarl.net import BrokerEndpoints, free_port_block
from llamarl.protocol import Control
from llamarl.topics import CONTROL, ROLLOUTS
from llamarl.weightsync.flat import FlatWeights, checksum
from llamarl.weightsync.gloo import GLOO
from llamarl.weightsync.p2p import P2PWeightServer
from llamarl.weightsync.p2p_receiver import P2PReceiver
from tests.conftest import start_broker_process
from tests.factories import rollout_group


def _generate(directory: Path) -> Curve:
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "keys", "generate", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return Curve.load(directory)


@pytest.fixture
def keys(tmp_path: Path) -> Curve:
    return _generate(tmp_path / "keys")


@pytest.fixture
def stranger(tmp_path: Path, keys: Curve) -> Curve:
    """Its own client pair, and it even knows the server's public key; it is not authorized."""
    own = _generate(tmp_path / "stranger")
    return Curve(own.directory, keys.server_public, own.client_public, own.client_secret)


@pytest.fixture
def curve_broker(keys: Curve) -> Iterator[BrokerEndpoints]:
    env = {"LLAMARL__BROKER__CURVE_KEYS": str(keys.directory)}
    broker = start_broker_process(env, curve=keys)
    yield broker.endpoints
    supervise.stop(broker.process)


def _wait_for_queued(endpoints: BrokerEndpoints, curve: Curve, count: int) -> None:
    deadline = time.monotonic() + 10
    while query_broker_stats(endpoints, curve=curve)["queued.rollouts"] < count:
        assert time.monotonic() < deadline, f"the broker never held {count} rollouts"
        time.sleep(0.01)


def _stop(i: int) -> Control:
    return Control("stop", {"i": str(i)})


def _received(client: BusClient, publisher: BusClient, rounds: int = 30) -> int:
    """Messages `client` gets on CONTROL while `publisher` publishes for a while."""
    sub = client.subscribe([CONTROL])
    got = 0
    for i in range(rounds):
        publisher.publish(CONTROL, _stop(i), 0)
        while sub.recv(50) is not None:
            got += 1
    return got


@pytest.mark.parametrize("intruder", ["plain", "stranger"])
def test_client_without_the_keys_can_neither_publish_nor_receive(
    curve_broker: BrokerEndpoints, keys: Curve, stranger: Curve, intruder: str
) -> None:
    intruder_curve = None if intruder == "plain" else stranger
    member = BusClient(curve_broker, run_id="test", sender="member", curve=keys)
    other = BusClient(curve_broker, run_id="test", sender="member-2", curve=keys)
    outsider = BusClient(curve_broker, run_id="test", sender="outsider", curve=intruder_curve)
    try:
        assert _received(other, member) > 0, "members must talk to each other"
        assert _received(member, outsider) == 0, "an outsider published"
        assert _received(outsider, member) == 0, "an outsider received"
        # Work topics: an outsider's push is never delivered, and it is never given work. The
        # outsider is the only consumer while a member's message waits in the broker, so an
        # accepted outsider would be handed it; then a member consumer receives it instead.
        intruding_consumer = outsider.consume(ROLLOUTS, credit=10)
        with contextlib.suppress(TimeoutError):  # blocked or silently dropped: both refuse it
            outsider.push(ROLLOUTS, rollout_group(1), 0, timeout_s=1)
        other.push(ROLLOUTS, rollout_group(2), 0)
        _wait_for_queued(curve_broker, keys, 1)
        assert intruding_consumer.recv(1000) is None
        assert query_broker_stats(curve_broker, curve=keys)["queued.rollouts"] == 1
        work = member.consume(ROLLOUTS, credit=10)
        delivered = [work.recv(10_000), work.recv(500)]
        assert [e.payload.ticket_id for e in delivered if e is not None] == [2]
        with pytest.raises(TimeoutError):
            query_broker_stats(curve_broker, timeout_s=1, curve=intruder_curve)
        assert query_broker_stats(curve_broker, curve=keys)["work"] == 1
    finally:
        for client in (member, other, outsider):
            client.close()


def test_weight_server_serves_only_clients_with_the_keys(keys: Curve, stranger: Curve) -> None:
    server = P2PWeightServer("127.0.0.1", backend=GLOO, timeout_s=10, bucket_bytes=4096, curve=keys)
    try:
        weights = torch.randn(5_000)
        server.publish(FlatWeights(3, weights, checksum(weights)))
        receiver = P2PReceiver("gen-0", GLOO, timeout_s=10, curve=keys)
        got = receiver.fetch(server.endpoint, 3)
        assert torch.equal(got, weights)
        for intruder in (None, stranger):
            with pytest.raises(SyncError, match="did not answer"):
                P2PReceiver("gen-x", GLOO, timeout_s=2, curve=intruder).fetch(server.endpoint, 3)
    finally:
        server.close()


def test_missing_keys_are_refused_before_serving(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "LLAMARL_BROKER": f"127.0.0.1:{free_port_block()}",
        "LLAMARL__BROKER__CURVE_KEYS": str(tmp_path / "nowhere"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "worker", "broker"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 2
    assert f"broker.curve_keys: {tmp_path / 'nowhere'}/server.key is missing" in done.stderr
