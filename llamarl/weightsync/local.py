"""The local transport: a trainer and a generator in one process (the synchronous baseline).

Nothing is copied, ever: the cheapest correct option when the two take turns on one thread
(generate, score, train, publish, generate...). `stage` keeps a reference to the trainer's
model, `publish` makes it the endpoint's latest version, and `swap_in` makes the generator's
weights the trainer's very tensors (`.data` of each weight points at the trainer's storage; when
the generator holds the trainer's model object itself this changes nothing). A copy would buy a
snapshot that survives the next optimizer step, which taking turns never needs; a trainer and a
generator stepping concurrently in one process use shm instead, which snapshots each version.

The endpoint is an in-process name (like ZeroMQ's inproc://): `local://<run_id>/<pid>-<n>`,
looked up in a weak table so a closed or dropped publisher is gone. No bytes cross a boundary,
so there is no checksum; `swap_in` checks that the two architectures agree before it binds.
"""

from __future__ import annotations

import itertools
import os
import weakref
from collections.abc import Mapping

import torch

from llamarl.config import LocalSync, transport_name
from llamarl.errors import SyncError
from llamarl.weightsync.base import (
    Meta,
    Staged,
    StopCheck,
    VersionRecord,
    WeightPublisher,
    WeightReceiver,
    never_stop,
)
from llamarl.weightsync.flat import WHOLE, num_values, weight_objects
from llamarl.weightsync.messages import Announced

_endpoints: weakref.WeakValueDictionary[str, LocalPublisher] = weakref.WeakValueDictionary()
_names = itertools.count()


class LocalPublisher(WeightPublisher[torch.nn.Module]):
    name = transport_name(LocalSync)

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.endpoint = f"local://{run_id}/{os.getpid()}-{next(_names)}"
        self._latest: tuple[int, torch.nn.Module] | None = None
        _endpoints[self.endpoint] = self

    def stage(self, model: torch.nn.Module, policy_version: int) -> Staged[torch.nn.Module]:
        return Staged(policy_version, num_values(model) * 4, model)

    def publish(self, staged: Staged[torch.nn.Module]) -> Meta:
        self._advance(staged.policy_version)
        self._latest = (staged.policy_version, staged.handle)
        return {
            "transport": self.name,
            "endpoint": self.endpoint,
            "num_bytes": staged.num_bytes,
            "checksum": "",
            "layout": WHOLE.layout,
        }

    def latest(self) -> tuple[int, torch.nn.Module] | None:
        return self._latest

    def discard(self, staged: Staged[torch.nn.Module]) -> None:
        """Nothing to drop: staging took a reference only."""

    def close(self) -> None:
        _endpoints.pop(self.endpoint, None)
        self._latest = None


class LocalReceiver(WeightReceiver[torch.nn.Module]):
    """Fetches the trainer's model; swapping in binds the generator's weights to its tensors."""

    name = transport_name(LocalSync)

    def fetch(
        self, meta: Mapping[str, str], should_stop: StopCheck = never_stop, record: VersionRecord | None = None
    ) -> tuple[int, torch.nn.Module]:
        announced = Announced.parse(meta, self.name)
        publisher = _endpoints.get(announced.endpoint)
        latest = publisher.latest() if publisher is not None else None
        if latest is None:
            raise SyncError(f"no local publisher with a version at {announced.endpoint}")
        if latest[0] < announced.policy_version:
            raise SyncError(f"{announced.endpoint} holds version {latest[0]}, announced newer")
        return latest

    def swap_in(self, model: torch.nn.Module, fetched: torch.nn.Module) -> None:
        if model is fetched:
            return
        targets, sources = weight_objects(model), weight_objects(fetched)
        shapes = [(t.shape, t.dtype, t.device) for t in targets]
        if shapes != [(s.shape, s.dtype, s.device) for s in sources]:
            raise SyncError("local weights: the generator's and trainer's models differ in shape")
        with torch.no_grad():
            for target, source in zip(targets, sources, strict=True):
                target.data = source.data

    def close(self) -> None:
        """Nothing held."""
