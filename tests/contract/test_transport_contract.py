"""The weight-transport contract (llamarl.weightsync.base), the same tests for every registered
transport: shm, gloo, nccl and local.

A published version is fetched byte-identical and swapped into a model; a newer version replaces
an older one; the publisher refuses versions that do not move forward; a corrupted version (where
the transport checksums) or one of another size raises SyncError and leaves the model as it was;
metadata that is malformed or names another transport is a SyncError, never a KeyError; close
releases what the publisher held (shm files removed, nothing left to fetch).

gloo runs its generator in a spawned process (a real two-process torch.distributed group); shm
and local run it in this process (shm across processes: tests/integration/test_weight_sync.py).
nccl needs CUDA GPUs, one per rank: its parameter is skipped on machines with fewer than two (as
this one, which has none), and runs as gloo does where they exist.
"""

from __future__ import annotations

import itertools
import os
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from llamarl.config import AutoSync, GlooSync, NcclSync, ShmSync, SyncConfig, transport_name
from llamarl.errors import StaleVersionError
from llamarl.weightsync import TRANSPORTS, make_publisher, resolve_transport
from tests.contract.transport_harness import (
    BACKENDS,
    WIDTH,
    Backend,
    GeneratorSide,
    TiedModel,
    flat_bytes,
)

_run_ids = itertools.count()


@pytest.fixture(
    params=[pytest.param(name, marks=spec.marks) for name, spec in BACKENDS.items()],
)
def backend(request: pytest.FixtureRequest) -> Backend:
    return BACKENDS[request.param]


@pytest.fixture
def run_id() -> Iterator[str]:
    # The pid keeps names apart between pytest-xdist workers: the check below sees all of /dev/shm.
    name = f"contract-{os.getpid()}-{next(_run_ids)}"
    yield name
    assert not list(Path("/dev/shm").glob(f"llamarl-{name}-*")), "shm files left behind"


def publish(publisher, model: torch.nn.Module, policy_version: int) -> dict[str, str]:
    meta = publisher.publish(publisher.stage(model, policy_version))
    return {k: str(v) for k, v in meta.items()} | {"policy_version": str(policy_version)}


def test_registry_and_harness_agree() -> None:
    variants = typing.get_args(typing.get_args(SyncConfig)[0])
    concrete = {v for v in variants if v is not AutoSync}
    assert concrete == set(TRANSPORTS), "every transport variant has a registry entry"
    assert {transport_name(v) for v in concrete} == set(BACKENDS)


def test_a_published_version_is_fetched_byte_identical_and_swapped_in(backend: Backend, run_id: str) -> None:
    trainer = TiedModel(WIDTH, seed=1)
    publisher = make_publisher(backend.config(), run_id)
    generator = GeneratorSide(backend, backend.config(), seed=2)  # other weights to start with
    try:
        status, version, held = generator.receive(publish(publisher, trainer, 5))
    finally:
        generator.close()
        publisher.close()
    assert (status, version) == ("ok", 5)
    assert held == flat_bytes(trainer)


def test_a_newer_version_replaces_an_older_one(backend: Backend, run_id: str) -> None:
    trainer = TiedModel(WIDTH, seed=1)
    publisher = make_publisher(backend.config(), run_id)
    generator = GeneratorSide(backend, backend.config(), seed=2)
    try:
        first = generator.receive(publish(publisher, trainer, 1))
        with torch.no_grad():
            for param in trainer.parameters():
                param.mul_(-0.5)  # an optimizer step, in place
        second = generator.receive(publish(publisher, trainer, 2))
        third = generator.receive(publish(publisher, trainer, 3))  # reuses groups and buffers
    finally:
        generator.close()
        publisher.close()
    assert first[:2] == ("ok", 1) and second[:2] == ("ok", 2) and third[:2] == ("ok", 3)
    assert second[2] == third[2] == flat_bytes(trainer) != first[2]


def test_the_publisher_refuses_a_version_that_does_not_move_forward(backend: Backend, run_id: str) -> None:
    trainer = TiedModel(WIDTH, seed=1)
    publisher = make_publisher(backend.config(), run_id)
    try:
        publish(publisher, trainer, 3)
        for stale in (3, 2):
            staged = publisher.stage(trainer, stale)
            with pytest.raises(StaleVersionError):
                publisher.publish(staged)
            publisher.discard(staged)
    finally:
        publisher.close()


def test_a_version_of_another_size_raises_sync_error_and_leaves_the_model_as_it_was(
    backend: Backend, run_id: str
) -> None:
    trainer, larger = TiedModel(WIDTH, seed=1), TiedModel(WIDTH + 8, seed=3)
    publisher = make_publisher(backend.config(), run_id)
    generator = GeneratorSide(backend, backend.config(), seed=2)
    try:
        good = generator.receive(publish(publisher, trainer, 1))
        status, message, held = generator.receive(publish(publisher, larger, 2))
    finally:
        generator.close()
        publisher.close()
    assert good[0] == "ok" and status == "error"
    assert "values, model needs" in message or "differ in shape" in message
    assert held == good[2] == flat_bytes(trainer)


def test_a_corrupted_version_raises_sync_error_and_leaves_the_model_as_it_was(backend: Backend, run_id: str) -> None:
    if backend.corrupt is None:
        assert backend.sync["transport"] == "local"  # no bytes move: nothing can corrupt them
        return
    trainer = TiedModel(WIDTH, seed=1)
    publisher = make_publisher(backend.config(), run_id)
    generator = GeneratorSide(backend, backend.config(), seed=2)
    try:
        good = generator.receive(publish(publisher, trainer, 1))
        with torch.no_grad():
            next(trainer.parameters()).add_(1.0)
        staged = publisher.stage(trainer, 2)
        meta = publisher.publish(staged)
        backend.corrupt(staged)
        meta = {k: str(v) for k, v in meta.items()} | {"policy_version": "2"}
        status, message, held = generator.receive(meta)
    finally:
        generator.close()
        publisher.close()
    assert good[0] == "ok" and (status, message.split(": ")[-1]) == ("error", "checksum mismatch")
    assert held == good[2]


def test_malformed_or_foreign_metadata_raises_sync_error(backend: Backend, run_id: str) -> None:
    trainer = TiedModel(WIDTH, seed=1)
    publisher = make_publisher(backend.config(), run_id)
    generator = GeneratorSide(backend, backend.config(), seed=2)
    try:
        meta = publish(publisher, trainer, 1)
        other = "gloo" if meta["transport"] != "gloo" else "shm"
        results = [
            generator.receive(bad)
            for bad in (
                {**meta, "transport": other},
                {k: v for k, v in meta.items() if k != "endpoint"},
                {**meta, "num_bytes": "many"},
            )
        ]
    finally:
        generator.close()
        publisher.close()
    untouched = flat_bytes(TiedModel(WIDTH, seed=2))
    assert all(status == "error" and held == untouched for status, _, held in results)
    assert f"published over {other}" in results[0][1]
    assert all("malformed version metadata" in message for _, message, _ in results[1:])


def test_close_releases_what_the_publisher_held(backend: Backend, run_id: str) -> None:
    """After close nothing can be fetched (and the run_id fixture finds no shm file left)."""
    trainer = TiedModel(WIDTH, seed=1)
    publisher = make_publisher(backend.config(), run_id)
    meta = publish(publisher, trainer, 1)
    publisher.close()
    publisher.close()  # idempotent
    generator = GeneratorSide(backend, backend.config(timeout_s=1.0), seed=2)
    try:
        status, _, held = generator.receive(meta)
    finally:
        generator.close()
    assert status == "error" and held == flat_bytes(TiedModel(WIDTH, seed=2))


def test_auto_resolves_in_one_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU here: CUDA availability is faked to check the choice only, not NCCL itself."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert isinstance(resolve_transport(AutoSync()), ShmSync), "one host: never NCCL to itself"
    assert isinstance(resolve_transport(AutoSync(advertise_host="trainer")), NcclSync)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_transport(AutoSync(timeout_s=5)) == ShmSync(timeout_s=5)
    assert isinstance(resolve_transport(AutoSync(host="0.0.0.0")), ShmSync)
    remote = AutoSync(host="0.0.0.0", advertise_host="trainer", bucket_mb=2)
    assert resolve_transport(remote) == GlooSync(host="0.0.0.0", advertise_host="trainer", bucket_mb=2)
    assert resolve_transport(GlooSync()) == GlooSync()
