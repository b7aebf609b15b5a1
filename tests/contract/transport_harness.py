"""What the transport contract suite runs on: a small model, each transport's settings, and a
generator side that runs in this process (local, shm) or in a spawned one (gloo, nccl: real
two-process torch.distributed), driven step by step through queues with timeouts."""

from __future__ import annotations

import multiprocessing as mp
import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from pydantic import TypeAdapter

from llamarl.config import SyncConfig
from llamarl.errors import SyncError
from llamarl.weightsync import WeightReceiver, make_receiver
from llamarl.weightsync.base import Staged
from llamarl.weightsync.flat import flatten
from llamarl.weightsync.shm import StagedFile

JOIN_S = 60.0
STEP_S = 120.0


class TiedModel(torch.nn.Module):
    """Weights in a few tensors, one tied (taken once), plus a persistent buffer."""

    def __init__(self, width: int, seed: int) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.embed = torch.nn.Embedding(50, width)
        self.hidden = torch.nn.Linear(width, width)
        self.out = torch.nn.Linear(width, 50, bias=False)
        self.out.weight = self.embed.weight
        self.register_buffer("scale", torch.ones(width))
        with torch.no_grad():
            for tensor in self.state_dict(keep_vars=True).values():
                tensor.copy_(torch.randn(tensor.shape, generator=generator))


WIDTH = 96
"""~33 KB of weights a bucket of 0.01 MB splits into several."""


def flat_bytes(model: torch.nn.Module) -> bytes:
    return flatten(model, 0).buffer.cpu().numpy().tobytes()


def _corrupt_file(staged: Staged[StagedFile]) -> None:
    staged.handle.buffer[7] += 1.0  # the published file's own pages (a shared mapping)


def _corrupt_buffer(staged: Staged[torch.Tensor]) -> None:
    staged.handle[7] += 1.0  # the buffer the weight server sends


@dataclass(frozen=True)
class Backend:
    sync: dict[str, Any]
    in_process: bool
    corrupt: Callable[[Any], None] | None
    """Changes a published version's bytes behind the checksum; None: nothing to corrupt."""
    receiver_cuda_device: int | None = None
    marks: list[Any] = field(default_factory=list)

    def config(self, **overrides: Any) -> SyncConfig:
        config: SyncConfig = TypeAdapter(SyncConfig).validate_python(self.sync | overrides)
        return config


NEEDS_TWO_GPUS = pytest.mark.skipif(
    torch.cuda.device_count() < 2,
    reason="NCCL needs CUDA GPUs, one per rank (two here); this machine has fewer",
)
NETWORK = {"bucket_mb": 0.01, "timeout_s": 20.0}
BACKENDS = {
    "shm": Backend({"transport": "shm", "verify": "always"}, True, _corrupt_file),
    "gloo": Backend({"transport": "gloo", **NETWORK}, False, _corrupt_buffer),
    "nccl": Backend({"transport": "nccl", **NETWORK}, False, _corrupt_buffer, 1, [NEEDS_TWO_GPUS]),
    "local": Backend({"transport": "local"}, True, None),
}
"""Every registered transport (test_registry_and_harness_agree checks the two lists match)."""


def receive_one(receiver: WeightReceiver[Any], model: torch.nn.Module, meta: dict[str, str]):
    """Fetch and swap in as a generator does; ("ok", version, weights) or ("error", message,
    weights), the weights as the model holds them afterwards."""
    try:
        version, fetched = receiver.fetch(meta)
        receiver.swap_in(model, fetched)
    except SyncError as err:
        return ("error", str(err), flat_bytes(model))
    return ("ok", version, flat_bytes(model))


def serve_generator(config: SyncConfig, seed: int, cuda_device: int | None, inbox, outbox) -> None:
    """A generator process: pull each meta the test sends, report what the model then holds."""
    torch.set_num_threads(1)
    if cuda_device is not None:
        torch.cuda.set_device(cuda_device)
    model = TiedModel(WIDTH, seed)
    receiver = make_receiver(config, "gen-0")
    while (meta := inbox.get(timeout=STEP_S)) is not None:
        outbox.put(receive_one(receiver, model, meta))
    receiver.close()


# Generator processes fork from one server that imported torch and this module once: a fresh
# interpreter per test (spawn) costs ~3 s of imports; fork of the test process is unsafe with
# torch's threads.
FORKSERVER = mp.get_context("forkserver")
FORKSERVER.set_forkserver_preload(["torch", __name__])


class GeneratorSide:
    """The generator of a contract test: `receive(meta)` runs one pull where the backend says."""

    def __init__(self, backend: Backend, config: SyncConfig, seed: int) -> None:
        self.in_process = backend.in_process
        if self.in_process:
            self.model = TiedModel(WIDTH, seed)
            self.receiver = make_receiver(config, "gen-0")
            return
        ctx = FORKSERVER
        self.inbox, self.outbox = ctx.Queue(), ctx.Queue()
        args = (config, seed, backend.receiver_cuda_device, self.inbox, self.outbox)
        self.process = ctx.Process(target=serve_generator, args=args)
        self.process.start()

    def receive(self, meta: dict[str, str]) -> tuple[str, Any, bytes]:
        if self.in_process:
            return receive_one(self.receiver, self.model, meta)
        self.inbox.put(meta)
        try:
            return self.outbox.get(timeout=STEP_S)  # type: ignore[no-any-return]
        except queue.Empty:
            exitcode = self.process.exitcode
            raise AssertionError(f"generator gave no answer (exit {exitcode})") from None

    def close(self) -> None:
        if self.in_process:
            self.receiver.close()
            return
        self.inbox.put(None)
        self.process.join(JOIN_S)
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join(JOIN_S)
        assert self.process.exitcode == 0
