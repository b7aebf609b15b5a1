"""The `sync` section: one variant per weight transport, each with only its own fields, chosen by
`transport`. Each variant's `transport` literal is the one place its name is spelled: the
registry and the transport classes read it from here (`transport_name`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from llamarl.config.base import _Section


class _SyncBase(_Section):
    """What every weight transport shares: the wait bound, verification and publish cadence."""

    transport: str
    """Weight transport, the discriminator of `SyncConfig` (each variant narrows it)."""
    timeout_s: float = Field(60.0, gt=0, le=3600)
    """Every transfer wait times out after this, naming the peer."""
    verify: Literal["auto", "always", "size"] = "auto"
    """auto: a generator checks the xxh3 checksum of every version received over the network and
    the size of shared-memory ones (complete by construction: written, then renamed into place);
    always: checksums everywhere; size: sizes only (trusted networks). local moves no bytes and
    checks only that the architectures agree."""
    every_steps: int = Field(1, ge=1, le=1_000_000)
    """Publish a new policy version every this many optimizer steps."""


class _NetworkSync(_SyncBase):
    """A transport with a weight server that generators reach over TCP."""

    host: str = "127.0.0.1"
    """Address the trainer's weight server binds; 0.0.0.0 in containers."""
    advertise_host: str | None = None
    """Address generators use to reach the weight server; null means `host`."""
    bucket_mb: float = Field(16.0, gt=0, le=65536)
    """Bucket size weights are streamed in."""


class ShmSync(_SyncBase):
    """One host: every version is a file under /dev/shm that generators map (zero copy)."""

    transport: Literal["shm"] = "shm"
    """Shared memory."""


class GlooSync(_NetworkSync):
    """CPUs on any hosts: torch.distributed gloo send/recv in a two-rank group per generator."""

    transport: Literal["gloo"] = "gloo"
    """Point-to-point gloo."""


class NcclSync(_NetworkSync):
    """GPUs: as gloo, over NCCL, into CUDA buffers."""

    transport: Literal["nccl"] = "nccl"
    """Point-to-point NCCL."""


class LocalSync(_SyncBase):
    """Trainer and generator in one process taking turns (the synchronous baseline): the
    generator's weights are the trainer's tensors, nothing is copied."""

    transport: Literal["local"] = "local"
    """In-process hand-over."""


class AutoSync(_NetworkSync):
    """Chosen where the publisher or receiver is built (`weightsync.resolve_transport`): shm
    when the weight server's address (advertise_host, else host) is this host's, else nccl on
    CUDA, else gloo. It carries the network fields because it may become nccl or gloo."""

    transport: Literal["auto"] = "auto"
    """Resolved per process by the rule above; set a transport explicitly when the trainer and
    generators would resolve it differently (a receiver refuses a version announced over
    another transport)."""


def _transport_defaults_to_auto(value: Any) -> Any:
    """A `sync` section without `transport` (or only env overrides of other fields) is auto."""
    if isinstance(value, dict) and "transport" not in value:
        return {**value, "transport": "auto"}
    return value


SyncConfig = Annotated[
    ShmSync | GlooSync | NcclSync | LocalSync | AutoSync,
    Field(discriminator="transport"),
    BeforeValidator(_transport_defaults_to_auto),
]
"""The weight transport's section, one variant per transport, each with only its own fields; an
error names the variant, e.g. `sync.shm.host: Extra inputs are not permitted`."""
ConcreteSync = ShmSync | GlooSync | NcclSync | LocalSync
"""A `SyncConfig` with auto resolved."""


def transport_name(variant: type[_SyncBase]) -> str:
    """The `sync.transport` value that selects `variant` (its literal's one spelling)."""
    return str(variant.model_fields["transport"].default)
