"""Weight sync, what is particular to each transport (the semantics every transport shares are
in tests/contract/test_transport_contract.py): several generator processes pulling one version,
shm truncation and zero-copy pages, p2p pair groups, dead peers, and the control messages'
schemas.

Receivers run in spawned processes (module-level targets) and report what they got through a
queue; the trainer side runs in the test process.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time
from pathlib import Path

import msgpack
import pytest
import torch
import zmq

from llamarl.config import GlooSync, ModelConfig, ShmSync, SyncConfig
from llamarl.engine.model import build_policy
from llamarl.engine.sampling import sample
from llamarl.errors import SyncError
from llamarl.net import free_port_block
from llamarl.weightsync import make_publisher, make_receiver, messages
from llamarl.weightsync.flat import FlatWeights, Received, checksum, flatten
from llamarl.weightsync.gloo import GLOO
from llamarl.weightsync.messages import TransferGo, TransferRefusal, TransferRequest
from llamarl.weightsync.p2p import P2PWeightServer
from llamarl.weightsync.p2p_receiver import P2PReceiver
from llamarl.weightsync.shm import ShmPublisher, ShmReceiver, fetch_shm

MODEL = ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)


def fetched_bytes(fetched: Received | tuple[torch.Tensor, Received]) -> bytes:
    """The bytes a receiver fetched: its pieces (shm), or those of its flat buffer (p2p)."""
    received = fetched[1] if isinstance(fetched, tuple) else fetched
    return b"".join(piece.numpy().tobytes() for piece in received.pieces)


def receive_into_model(config: SyncConfig, meta: dict[str, str], worker_id: str, out) -> None:
    """A generator: pull, swap into its own model, report the swapped weights' checksum."""
    policy = build_policy(MODEL, seed=99)  # different init: equality proves the transfer
    receiver = make_receiver(config, worker_id)
    version, buffer = receiver.fetch(meta)
    receiver.swap_in(policy.model, buffer)
    raw = fetched_bytes(buffer)
    # A second pull: over gloo it reuses the pair group and lands in the buffer the model held
    # before (its original weights here); the model keeps the right weights throughout.
    again, second = receiver.fetch(meta)
    receiver.swap_in(policy.model, second)
    assert again == version and fetched_bytes(second) == raw
    out.put((worker_id, version, flatten(policy.model, version).checksum, raw))


@pytest.mark.parametrize("config", [GlooSync(bucket_mb=0.05, timeout_s=20), ShmSync(timeout_s=20)])
def test_every_generator_receives_the_trainers_exact_weights(config: SyncConfig) -> None:
    """Three generator processes pull one version at once, twice each."""
    trainer = build_policy(MODEL, seed=1)
    weights = flatten(trainer.model, policy_version=5)
    publisher = make_publisher(config, "test")
    try:
        staged = publisher.stage(trainer.model, 5)
        meta = {k: str(v) for k, v in publisher.publish(staged).items()} | {"policy_version": "5"}
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        procs = [ctx.Process(target=receive_into_model, args=(config, meta, f"gen-{i}", out)) for i in range(3)]
        for proc in procs:
            proc.start()
        results = [out.get(timeout=120) for _ in procs]
        for proc in procs:
            proc.join(30)
            assert proc.exitcode == 0
    finally:
        publisher.close()
    assert weights.num_bytes > 0.05 * 1024 * 1024, "several buckets must be streamed"
    for _, version, got_checksum, raw in results:
        assert version == 5
        assert got_checksum == weights.checksum
        assert torch.equal(torch.frombuffer(bytearray(raw), dtype=torch.float32), weights.buffer)


def test_corrupted_or_truncated_shm_is_never_swapped_in(tmp_path: Path) -> None:
    policy = build_policy(MODEL, seed=1)
    before = flatten(policy.model, 0)
    incoming = flatten(build_policy(MODEL, seed=2).model, 1)
    publisher = ShmPublisher("test", directory=str(tmp_path))
    meta = publisher.publish(publisher.stage(build_policy(MODEL, seed=2).model, 1))
    assert meta["checksum"] == incoming.checksum
    path = Path(str(meta["endpoint"]))
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(SyncError, match="checksum mismatch"):
        fetch_shm(str(path), incoming.num_bytes, incoming.checksum)  # sync.verify: always
    path.write_bytes(bytes(data[:-8]))
    with pytest.raises(SyncError, match="bytes, announced"):
        fetch_shm(str(path), incoming.num_bytes, None)  # the size is always checked
    with pytest.raises(SyncError, match="bytes, announced"):
        fetch_shm(str(path), incoming.num_bytes, incoming.checksum)
    with pytest.raises(SyncError):
        fetch_shm(str(tmp_path / "missing.bin"), incoming.num_bytes, incoming.checksum)
    assert flatten(policy.model, 0).checksum == before.checksum, "model must be untouched"


def vanish_after_asking(endpoint: str) -> None:
    """A generator that asks for weights, says go and dies before joining the transfer."""
    sock = zmq.Context().socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send_multipart([b"", messages.encode(TransferRequest("doomed", "", 3))])
    sock.recv_multipart()
    sock.send_multipart([b"", messages.encode(TransferGo(3, True))])
    sock.close(linger=1000)


def test_transfer_to_a_dead_peer_fails_and_the_server_goes_on() -> None:
    server = P2PWeightServer("127.0.0.1", backend=GLOO, timeout_s=2, bucket_bytes=4096)
    try:
        buffer = torch.randn(50_000)
        server.publish(FlatWeights(3, buffer, checksum(buffer)))
        proc = mp.get_context("spawn").Process(target=vanish_after_asking, args=(server.endpoint,))
        proc.start()
        proc.join(60)  # it has asked, been answered and died (start-up varies with load)
        assert proc.exitcode == 0
        _wait_until(lambda: server.num_failed == 1, timeout_s=120)  # its 2 s wait ran out
        got = P2PReceiver("gen-ok", GLOO, timeout_s=10).fetch(server.endpoint, 3)
        assert torch.equal(got, buffer)
        assert server.num_served == 1
    finally:
        server.close()


def test_unanswering_trainer_raises_naming_it() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port_block(size=1)}"
    with pytest.raises(SyncError, match=rf"weight server at {endpoint} did not answer in 1(\.0)?s"):
        P2PReceiver("gen-0", GLOO, timeout_s=1).fetch(endpoint, 0)


def _wait_until(condition, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_pair_groups_are_kept_between_pulls_and_renewed_for_a_restarted_generator() -> None:
    server = P2PWeightServer("127.0.0.1", backend=GLOO, timeout_s=5, bucket_bytes=4096)
    try:
        buffer = torch.randn(20_000)
        server.publish(FlatWeights(1, buffer, checksum(buffer)))
        receiver = P2PReceiver("gen-0", GLOO, timeout_s=5)
        for _ in range(2):
            got = receiver.fetch(server.endpoint, 1)
            assert torch.equal(got, buffer)
        first_group = server.group_of("gen-0")
        _wait_until(lambda: server.num_served == 2)  # counted once the last send returned
        assert first_group is not None
        # The same worker id after a restart holds no group: the server must form a new one
        # instead of sending over the old one (which would fail after a timeout).
        got = P2PReceiver("gen-0", GLOO, timeout_s=5).fetch(server.endpoint, 1)
        assert torch.equal(got, buffer)
        assert server.group_of("gen-0") not in (None, first_group)
        _wait_until(lambda: server.num_served == 3)
        assert server.num_failed == 0
    finally:
        server.close()


def test_a_generator_bound_to_shared_memory_shares_the_trainers_pages(tmp_path: Path) -> None:
    """Zero copy: after the swap the generator's weights are the mapped file's pages, and a
    newer version published later does not change them (a published file is never written)."""
    trainer, generator = build_policy(MODEL, seed=1), build_policy(MODEL, seed=2)
    publisher = ShmPublisher("test", directory=str(tmp_path))
    receiver = ShmReceiver(ShmSync(timeout_s=5))
    try:
        published = publisher.publish(publisher.stage(trainer.model, 1))
        digest = published["checksum"]
        meta = {k: str(v) for k, v in published.items()} | {"policy_version": "1"}
        version, buffer = receiver.fetch(meta)
        receiver.swap_in(generator.model, buffer)
        assert version == 1 and flatten(generator.model, 1).checksum == digest
        first = next(generator.model.parameters())
        assert first.data_ptr() == buffer.pieces[0].data_ptr(), "bound to the mapped pages"
        with torch.no_grad():
            for param in trainer.model.parameters():
                param.add_(1.0)
        publisher.publish(publisher.stage(trainer.model, 2))
        assert flatten(generator.model, 1).checksum == digest, "version 1 must stay as it was"
        prompt = [generator.tokenizer("1+2=").input_ids]
        sample(generator, prompt, num_samples=2, max_new_tokens=3)  # the bound model runs
    finally:
        publisher.close()


def test_malformed_requests_are_refused_answered_and_counted() -> None:
    """Each bad request gets a refusal and one on_reject call; the server then serves on."""
    rejected: list[tuple[str, str]] = []
    server = P2PWeightServer(
        "127.0.0.1",
        backend=GLOO,
        timeout_s=5,
        bucket_bytes=4096,
        on_reject=lambda reason, detail: rejected.append((reason, detail)),
    )
    bad_requests = [
        [b"", b"\xc1garbage"],
        [b"", msgpack.packb({"worker_id": "x", "group": ""})],  # no {kind, body}
        [b"", msgpack.packb({"kind": "transfer_request", "body": {"worker_id": 3, "group": ""}})],
        [b"", msgpack.packb({"kind": "transfer_request", "body": {"worker_id": "x"}})],
        [
            b"",
            msgpack.packb({"kind": "transfer_request", "body": {"worker_id": "x" * 65, "group": ""}}),
        ],
        [b"", msgpack.packb({"kind": "transfer_reply", "body": {}})],
        [b"", msgpack.packb(msgpack.ExtType(1, b"x"))],
        [b"", messages.encode(TransferRequest("x", "", 0))],  # well formed: refused, not counted
        [b"", messages.encode(TransferRequest("x", "", 0)), b"extra"],
        [b"not-empty", messages.encode(TransferRequest("x", "", 0))],
        [b"", b"\x00" * 5000],
    ]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(server.endpoint)
        for frames in bad_requests:
            sock.send_multipart(frames)
            assert sock.poll(5000), f"no answer to {frames!r:.60}"
            answer = messages.decode(sock.recv_multipart()[-1], TransferRefusal)
            assert isinstance(answer, TransferRefusal)
        # The well-formed requests were refused for want of the version, not counted.
        assert len(rejected) == len(bad_requests) - 1
        assert {reason for reason, _ in rejected} == {"bad_sync_request"}
        buffer = torch.randn(3_000)
        server.publish(FlatWeights(2, buffer, checksum(buffer)))
        got = P2PReceiver("gen-0", GLOO, timeout_s=5).fetch(server.endpoint, 2)
        assert torch.equal(got, buffer)
    finally:
        sock.close()
        ctx.term()
        server.close()


def answer_with(endpoint_out, reply: bytes) -> None:
    """A fake weight server: answer one request with `reply` (any bytes)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    endpoint_out.put(f"tcp://127.0.0.1:{port}")
    if sock.poll(20_000):
        identity, *_ = sock.recv_multipart()
        sock.send_multipart([identity, b"", reply])
    sock.close(linger=1000)
    ctx.term()


@pytest.mark.parametrize(
    ("reply", "match"),
    [
        (b"\xc1", "malformed reply .*garbage"),
        (b"x" * 5000, "malformed reply .*oversize"),
        (msgpack.packb({"policy_version": 1}), "malformed reply .*bad_schema"),
        (msgpack.packb({"kind": "transfer_reply", "body": {"policy_version": "1"}}), "bad_schema"),
        (
            msgpack.packb(
                {
                    "kind": "transfer_reply",
                    "body": {
                        "policy_version": 1,
                        "num_bytes": 6,
                        "checksum": "",
                        "store_port": 1,
                        "group": "g",
                        "bucket_values": 1,
                    },
                }
            ),
            "impossible version or size",
        ),
        (msgpack.packb({"kind": "nonsense", "body": {}}), "unknown_kind"),
        (messages.encode(TransferRefusal("no longer held", False)), "no longer held"),
    ],
)
def test_a_malformed_or_refusing_reply_is_a_sync_error(reply: bytes, match: str) -> None:
    endpoints: queue.Queue[str] = queue.Queue()
    server = threading.Thread(target=answer_with, args=(endpoints, reply), daemon=True)
    server.start()
    endpoint = endpoints.get(timeout=10)
    with pytest.raises(SyncError, match=match):
        P2PReceiver("gen-0", GLOO, timeout_s=10).fetch(endpoint, 1)
    server.join(10)
