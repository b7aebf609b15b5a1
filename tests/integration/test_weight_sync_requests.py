"""Weight-sync requests whose generator is no longer waiting for them, and generators whose
trainer moved: a weight server never starts a transfer for a request whose generator gave up (a
stale request served late held the server a whole timeout, and the generators behind it gave up
in turn); a shard server is not held by a generator still waiting on another rank; a receiver
waiting on a trainer that no longer answers follows the version record to the new one.

Real weight servers and receivers over loopback (ZeroMQ control, gloo transfers), in threads of
the test process.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import torch

from llamarl.config import GlooSync
from llamarl.errors import SyncError
from llamarl.net import free_port_block
from llamarl.weightsync import VersionRecord, make_receiver
from llamarl.weightsync.flat import FlatWeights, checksum
from llamarl.weightsync.gloo import GLOO
from llamarl.weightsync.p2p import P2PWeightServer
from llamarl.weightsync.p2p_receiver import P2PReceiver


def _wait_until(condition: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def _published(server: P2PWeightServer, policy_version: int, num_values: int) -> FlatWeights:
    buffer = torch.randn(num_values)
    weights = FlatWeights(policy_version, buffer, checksum(buffer))
    server.publish(weights)
    return weights


def test_a_request_whose_generator_gave_up_is_never_served() -> None:
    """One generator holds the server (it was answered and is slow to take its transfer); a
    second one gives up meanwhile. Once the first transfer is done, the second one's request,
    still queued, must be skipped: a third generator is served next, and no transfer failed."""
    server = P2PWeightServer("127.0.0.1", backend=GLOO, timeout_s=30, bucket_bytes=4096)
    try:
        weights = _published(server, 1, 20_000)
        slow = P2PReceiver("slow", GLOO, timeout_s=30)
        reply = slow.ask(server.endpoint, 1)
        with pytest.raises(SyncError, match="did not answer in 1"):
            P2PReceiver("gave-up", GLOO, timeout_s=1).fetch(server.endpoint, 1)
        slow.receive(server.endpoint, reply, torch.empty(weights.buffer.numel()))
        _wait_until(lambda: server.num_served == 1)
        got = P2PReceiver("patient", GLOO, timeout_s=60).fetch(server.endpoint, 1)
        assert torch.equal(got, weights.buffer)
        _wait_until(lambda: server.num_served == 2)
        assert server.num_failed == 0, "the request of the generator that gave up was served late"
        assert server.num_abandoned == 1
    finally:
        server.close()


def test_a_shard_server_is_not_held_by_a_generator_waiting_on_another_rank() -> None:
    """A version in two shards whose second rank is dead: the generator's pull fails, and the
    live rank's server is not left waiting (a timeout, then the next generator's) for a
    generator that never came to take its shard."""
    server = P2PWeightServer("127.0.0.1", backend=GLOO, timeout_s=5, bucket_bytes=4096)
    dead = f"tcp://127.0.0.1:{free_port_block(size=1)}"
    try:
        shard = _published(server, 3, 10_000)
        meta = {
            "policy_version": "3",
            "transport": "gloo",
            "endpoint": f"{server.endpoint} {dead}",
            "num_bytes": str(2 * shard.num_bytes),
            "checksum": f"{shard.checksum} {shard.checksum}",
            "layout": "runs",
        }
        receiver = make_receiver(GlooSync(timeout_s=1), "gen-0")
        with pytest.raises(SyncError, match=f"{dead} did not answer"):
            receiver.fetch(meta)
        receiver.close()
        _wait_until(lambda: server.num_served + server.num_failed >= 1)
        assert server.num_failed == 0, "the live rank waited for a generator that was not receiving"
    finally:
        server.close()


def _meta(weights: FlatWeights, endpoint: str) -> dict[str, str]:
    """The version record of `weights` served at `endpoint`, as the store holds it."""
    return {
        "policy_version": str(weights.policy_version),
        "transport": "gloo",
        "endpoint": endpoint,
        "num_bytes": str(weights.num_bytes),
        "checksum": weights.checksum,
        "layout": "runs",
    }


def test_a_receiver_asking_a_gone_trainer_follows_the_version_record() -> None:
    """A version announced at an endpoint nobody answers (the trainer died); the record then
    names a new trainer's version at another endpoint. The receiver reads the record while its
    request is unanswered and pulls from the new trainer, instead of waiting out its timeout."""
    server = P2PWeightServer("127.0.0.1", backend=GLOO, timeout_s=10, bucket_bytes=4096)
    gone = f"tcp://127.0.0.1:{free_port_block(size=1)}"
    try:
        weights = _published(server, 5, 10_000)
        old = _meta(FlatWeights(4, weights.buffer, weights.checksum), gone)
        reads: list[dict[str, str]] = []

        def read() -> dict[str, str]:  # the new trainer records its version at the third read
            reads.append(old if len(reads) < 2 else _meta(weights, server.endpoint))
            return reads[-1]

        receiver = make_receiver(GlooSync(timeout_s=120), "gen-0")
        version, (buffer, _) = receiver.fetch(old, record=VersionRecord(read, every_s=0.1))
        receiver.close()
        assert version == 5 and torch.equal(buffer, weights.buffer)
        assert len(reads) >= 3
        assert server.num_abandoned == 0
    finally:
        server.close()
