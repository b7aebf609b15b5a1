"""The weight-sync channel's control messages, with explicit schemas checked on receipt.

On the wire each is a msgpack map {"kind": KIND, "body": {its fields}}, encoded and checked by the
same rules as the data bus's payloads (`llamarl.protocol.schema`: exact field names, exact types,
no pickle, no msgpack extensions, sizes capped before unpacking); values are then bounded by each
class's `__post_init__`. `decode` raises ProtocolError and nothing else, so a server counts a
malformed request under its `reason` and a receiver turns a malformed reply into a SyncError.
`Announced` is the same check for the metadata a generator is handed (from the bus or Redis).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack

from llamarl.errors import ProtocolError, SyncError
from llamarl.protocol.schema import from_wire, to_wire
from llamarl.weightsync.flat import LAYOUTS

MAX_FRAME_BYTES = 4096
MAX_WORKER_ID = 64
MAX_GROUP_NAME = 160
MAX_ERROR_TEXT = 200


@dataclass(frozen=True)
class TransferRequest:
    """A generator asks for one version (every shard of a version must be the same one)."""

    KIND: ClassVar[str] = "transfer_request"
    worker_id: str
    group: str
    """The pair group the generator holds from its last pull, "" for none."""
    policy_version: int
    """The version wanted: the server sends it if it still holds it."""

    def __post_init__(self) -> None:
        if not 0 < len(self.worker_id) <= MAX_WORKER_ID or len(self.group) > MAX_GROUP_NAME:
            raise ProtocolError("bad_schema", "worker_id or group of impossible length")
        if self.policy_version < 0:
            raise ProtocolError("bad_schema", "impossible version")


@dataclass(frozen=True)
class TransferReply:
    """The server's answer to a pull: what is coming and over which group."""

    KIND: ClassVar[str] = "transfer_reply"
    policy_version: int
    num_bytes: int
    checksum: str
    store_port: int
    group: str
    bucket_values: int

    def __post_init__(self) -> None:
        if self.policy_version < 0 or self.num_bytes <= 0 or self.num_bytes % 4:
            raise ProtocolError("bad_schema", "impossible version or size")
        if self.bucket_values < 1 or not 0 < self.store_port < 65536:
            raise ProtocolError("bad_schema", "impossible bucket size or port")
        if not 0 < len(self.group) <= MAX_GROUP_NAME:
            raise ProtocolError("bad_schema", "impossible group name")


@dataclass(frozen=True)
class TransferGo:
    """A generator's answer to a `TransferReply`, on the same connection: go, it is receiving
    now; or not (a size it cannot take). The server starts a transfer only on a go, so a request
    whose generator gave up meanwhile (its connection closed, or no answer within
    `p2p.GO_WAIT_S`) is never served."""

    KIND: ClassVar[str] = "transfer_go"
    policy_version: int
    """The version of the reply it answers."""
    go: bool


@dataclass(frozen=True)
class TransferRefusal:
    """The server's answer when it cannot serve (the version is not published yet, or no
    longer held; a bad request)."""

    KIND: ClassVar[str] = "transfer_refusal"
    error: str
    not_yet: bool
    """The version asked for is newer than the server's: asking again soon will do."""


def encode(message: Any) -> bytes:
    return msgpack.packb({"kind": message.KIND, "body": to_wire(message)}, use_bin_type=True)


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ProtocolError("garbage", f"msgpack extension type {code} is not allowed")


def decode(data: bytes, *expected: type[Any]) -> Any:
    """The message in `data`, one of the `expected` classes; ProtocolError on anything else."""
    if len(data) > MAX_FRAME_BYTES:
        raise ProtocolError("oversize", f"{len(data)} bytes > limit {MAX_FRAME_BYTES}")
    try:
        wire = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            ext_hook=_refuse_ext,
            max_ext_len=0,
            max_str_len=MAX_FRAME_BYTES,
            max_bin_len=MAX_FRAME_BYTES,
            max_array_len=16,
            max_map_len=16,
        )
    except Exception as err:  # msgpack raises many types on bad input; all mean garbage
        raise ProtocolError("garbage", f"not a msgpack frame ({type(err).__name__})") from None
    if type(wire) is not dict or wire.keys() != {"kind", "body"}:
        raise ProtocolError("bad_schema", "expected {kind, body}")
    kinds = {cls.KIND: cls for cls in expected}
    cls = kinds.get(wire["kind"]) if type(wire["kind"]) is str else None
    if cls is None:
        raise ProtocolError("unknown_kind", f"kind {str(wire['kind'])[:40]!r}")
    return from_wire(cls, wire["body"], cls.KIND)


SHARD_SEPARATOR = " "
"""Between the shards' endpoints (and checksums) of a version sent by several trainer ranks."""


@dataclass(frozen=True)
class Announced:
    """A version as a generator is told of it: the trainer's `publish` metadata plus the version,
    all strings as Redis stores them. A version in shards (a trainer of several ranks) lists
    every shard's endpoint and checksum, in shard order, separated by SHARD_SEPARATOR."""

    policy_version: int
    transport: str
    endpoint: str
    num_bytes: int
    checksum: str
    layout: str
    """How the shards cut the weights: runs or rows (`llamarl.weightsync.flat`)."""
    shared_memory: str = ""
    """shm only: the host and the shared memory the version lies in (`shm.shm_domain`)."""

    @classmethod
    def parse(cls, meta: Mapping[str, str], transport: str) -> Announced:
        """Checked metadata for a receiver of `transport`; SyncError when a field is missing or
        malformed or the version was published over another transport."""
        try:
            announced = cls(
                policy_version=int(meta["policy_version"]),
                transport=str(meta["transport"]),
                endpoint=str(meta["endpoint"]),
                num_bytes=int(meta["num_bytes"]),
                checksum=str(meta["checksum"]),
                layout=str(meta["layout"]),
                shared_memory=str(meta.get("shared_memory", "")),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise SyncError(f"malformed version metadata ({type(err).__name__}: {err})") from None
        if announced.transport != transport:
            raise SyncError(
                f"version {announced.policy_version} was published over {announced.transport}, "
                f"this generator receives over {transport}: set sync.transport on both"
            )
        if announced.layout not in LAYOUTS:
            raise SyncError(f"version metadata: unknown shard layout {announced.layout[:20]!r}")
        if announced.policy_version < 0 or announced.num_bytes <= 0:
            raise SyncError(f"version metadata out of range: {dict(meta)}")
        if len(announced.checksums) not in (1, len(announced.endpoints)):
            raise SyncError(f"version metadata: shard endpoints and checksums differ: {dict(meta)}")
        return announced

    @property
    def endpoints(self) -> list[str]:
        return self.endpoint.split(SHARD_SEPARATOR)

    @property
    def checksums(self) -> list[str]:
        return self.checksum.split(SHARD_SEPARATOR)

    @property
    def rows(self) -> bool:
        return self.layout == "rows"


def join_shards(metas: list[dict[str, str | int]]) -> dict[str, str | int]:
    """One version's metadata from its shards' (in shard order): endpoints and checksums
    listed, sizes summed."""
    return {
        "transport": metas[0]["transport"],
        "endpoint": SHARD_SEPARATOR.join(str(m["endpoint"]) for m in metas),
        "num_bytes": sum(int(m["num_bytes"]) for m in metas),
        "checksum": SHARD_SEPARATOR.join(str(m["checksum"]) for m in metas),
        "layout": metas[0]["layout"],
        **({"shared_memory": metas[0]["shared_memory"]} if "shared_memory" in metas[0] else {}),
    }


SHARD_POLL_S = 0.005


def joined_shards(
    read_shards: Callable[[], Mapping[int, Mapping[str, str]]],
    world: int,
    policy_version: int,
    own: dict[str, str | int],
    timeout_s: float,
) -> dict[str, str | int] | None:
    """Rank 0's view of a version: its metadata joined with every other rank's shard (as
    `read_shards` returns them, rank -> meta) once each has recorded it; None when a rank has
    moved past it (the newer one is announced next); SyncError when one has not within
    `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        shards = read_shards()
        versions = [int(shards.get(r, {}).get("policy_version", -1)) for r in range(1, world)]
        if any(v > policy_version for v in versions):
            return None
        if all(v == policy_version for v in versions):
            metas: list[dict[str, str | int]] = [own]
            metas += [{**shards[r]} for r in range(1, world)]
            return join_shards(metas)
        if time.monotonic() > deadline:
            raise SyncError(f"version {policy_version}: trainer ranks {versions} did not publish their shards in time")
        time.sleep(SHARD_POLL_S)
