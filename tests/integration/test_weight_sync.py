"""Weight sync across real processes: gloo point-to-point and shared memory.

Receivers run in spawned processes (module-level targets) and report what they got through a
queue; the trainer side runs in the test process.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

import pytest
import torch

from llamarl.config import ModelConfig, SyncConfig
from llamarl.engine.model import build_policy
from llamarl.engine.sampling import sample
from llamarl.errors import SyncError
from llamarl.net import free_port_block
from llamarl.weightsync.channel import WeightPublisher, WeightReceiver, resolve_transport
from llamarl.weightsync.flat import FlatWeights, checksum, flatten
from llamarl.weightsync.p2p import P2PReceiver, P2PWeightServer
from llamarl.weightsync.shm import ShmPublisher, fetch_shm

MODEL = ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)


def receive_into_model(meta: dict[str, str], worker_id: str, out) -> None:
    """A generator: pull, swap into its own model, report the swapped weights' checksum."""
    policy = build_policy(MODEL, seed=99)  # different init: equality proves the transfer
    receiver = WeightReceiver(worker_id, timeout_s=20)
    mapped = meta["transport"] == "shm"
    version, buffer = receiver.fetch(meta)
    receiver.swap_in(policy.model, buffer, mapped)
    raw = buffer.numpy().tobytes()
    # A second pull: over gloo it reuses the pair group and lands in the buffer the model held
    # before (its original weights here); the model keeps the right weights throughout.
    again, second = receiver.fetch(meta)
    receiver.swap_in(policy.model, second, mapped)
    assert again == version and second.numpy().tobytes() == raw
    out.put((worker_id, version, flatten(policy.model, version).checksum, raw))


@pytest.mark.parametrize("transport", ["gloo", "shm"])
def test_every_generator_receives_the_trainers_exact_weights(transport: str) -> None:
    trainer = build_policy(MODEL, seed=1)
    weights = flatten(trainer.model, policy_version=5)
    publisher = WeightPublisher(
        SyncConfig(transport=transport, bucket_mb=0.05, timeout_s=20), "test"
    )
    try:
        staged = publisher.stage(trainer.model, 5)
        meta = {k: str(v) for k, v in publisher.publish(staged).items()} | {"policy_version": "5"}
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        procs = [
            ctx.Process(target=receive_into_model, args=(meta, f"gen-{i}", out)) for i in range(3)
        ]
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
    endpoint, digest = publisher.publish(publisher.stage(build_policy(MODEL, seed=2).model, 1))
    assert digest == incoming.checksum
    path = Path(endpoint)
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


def test_corrupted_p2p_transfer_is_refused() -> None:
    """The server announces one checksum but sends other bytes (a corrupted transfer)."""
    server = P2PWeightServer("127.0.0.1", backend="gloo", timeout_s=10, bucket_bytes=4096)
    try:
        good = torch.randn(10_000)
        server.publish(FlatWeights(1, good + 1.0, checksum(good)))
        with pytest.raises(SyncError, match="checksum mismatch"):
            P2PReceiver("gen-x", "gloo", timeout_s=10).fetch(server.endpoint)
    finally:
        server.close()


def vanish_after_asking(endpoint: str) -> None:
    """A generator that asks for weights and dies before joining the transfer."""
    import msgpack
    import zmq

    sock = zmq.Context().socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send_multipart([b"", msgpack.packb({"worker_id": "doomed", "group": ""})])
    sock.recv_multipart()


def test_transfer_to_a_dead_peer_fails_within_the_timeout_and_the_server_goes_on() -> None:
    server = P2PWeightServer("127.0.0.1", backend="gloo", timeout_s=2, bucket_bytes=4096)
    try:
        buffer = torch.randn(50_000)
        server.publish(FlatWeights(3, buffer, checksum(buffer)))
        proc = mp.get_context("spawn").Process(target=vanish_after_asking, args=(server.endpoint,))
        started = time.monotonic()
        proc.start()
        proc.join(30)
        while server.num_failed == 0:
            assert time.monotonic() - started < 15, "the dead peer stalled the server"
            time.sleep(0.05)
        assert time.monotonic() - started < 2 + 8  # one sync timeout plus process start-up
        version, got = P2PReceiver("gen-ok", "gloo", timeout_s=10).fetch(server.endpoint)
        assert version == 3 and torch.equal(got, buffer)
        assert server.num_served == 1
    finally:
        server.close()


def test_unanswering_trainer_raises_naming_it() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port_block(size=1)}"
    started = time.monotonic()
    with pytest.raises(SyncError, match=f"weight server at {endpoint} did not answer"):
        P2PReceiver("gen-0", "gloo", timeout_s=1).fetch(endpoint)
    assert time.monotonic() - started < 5


def test_auto_transport_picks_nccl_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU here: CUDA availability is faked to check the choice only, not NCCL itself."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_transport("auto") == "nccl"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_transport("auto") == "shm"
    assert resolve_transport("gloo") == "gloo"


def _wait_until(condition, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_pair_groups_are_kept_between_pulls_and_renewed_for_a_restarted_generator() -> None:
    server = P2PWeightServer("127.0.0.1", backend="gloo", timeout_s=5, bucket_bytes=4096)
    try:
        buffer = torch.randn(20_000)
        server.publish(FlatWeights(1, buffer, checksum(buffer)))
        receiver = P2PReceiver("gen-0", "gloo", timeout_s=5)
        for _ in range(2):
            version, got = receiver.fetch(server.endpoint)
            assert version == 1 and torch.equal(got, buffer)
        first_group = server.group_of("gen-0")
        _wait_until(lambda: server.num_served == 2)  # counted once the last send returned
        assert first_group is not None
        # The same worker id after a restart holds no group: the server must form a new one
        # instead of sending over the old one (which would fail after a timeout).
        version, got = P2PReceiver("gen-0", "gloo", timeout_s=5).fetch(server.endpoint)
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
    receiver = WeightReceiver("gen-0", timeout_s=5)
    try:
        endpoint, digest = publisher.publish(publisher.stage(trainer.model, 1))
        meta = {"transport": "shm", "endpoint": endpoint, "checksum": digest,
                "num_bytes": str(flatten(trainer.model, 1).num_bytes), "policy_version": "1"}  # fmt: skip
        version, buffer = receiver.fetch(meta)
        receiver.swap_in(generator.model, buffer, mapped=True)
        assert version == 1 and flatten(generator.model, 1).checksum == digest
        first = next(generator.model.parameters())
        assert first.data_ptr() == buffer.data_ptr(), "bound to the mapped pages, not copied"
        with torch.no_grad():
            for param in trainer.model.parameters():
                param.add_(1.0)
        publisher.publish(publisher.stage(trainer.model, 2))
        assert flatten(generator.model, 1).checksum == digest, "version 1 must stay as it was"
        prompt = [generator.tokenizer("1+2=").input_ids]
        sample(generator, prompt, num_samples=2, max_new_tokens=3)  # the bound model runs
    finally:
        publisher.close()
