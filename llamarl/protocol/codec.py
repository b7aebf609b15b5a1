"""Encoding and decoding of envelopes: msgpack with size limits checked before allocation.

`decode` raises ProtocolError and nothing else, whatever bytes it is given: oversize frames are
refused before unpacking, msgpack container and string sizes are capped, extension types are
refused, and the envelope and payload are checked against their schemas.
"""

from __future__ import annotations

from typing import Any

import msgpack

from llamarl.errors import ProtocolError
from llamarl.protocol.messages import PAYLOAD_TYPES, SCHEMA_VERSION, Envelope
from llamarl.protocol.schema import field_types, from_wire, scalar, to_wire

# The envelope's wire fields and their types come from the Envelope dataclass, checked by the
# same rule as every payload field; only the payload's type depends on the kind.
ENVELOPE_KEYS = frozenset(field_types(Envelope))
HEADER_TYPES = {name: typ for name, typ in field_types(Envelope).items() if name != "payload"}
MAX_TEXT = 1 << 20
MAX_ITEMS = 4096


def encode(envelope: Envelope) -> bytes:
    wire = {
        "kind": envelope.kind,
        "schema_version": envelope.schema_version,
        "msg_id": envelope.msg_id,
        "run_id": envelope.run_id,
        "sender": envelope.sender,
        "created_at": float(envelope.created_at),
        "policy_version": envelope.policy_version,
        "payload": to_wire(envelope.payload),
    }
    return msgpack.packb(wire, use_bin_type=True)


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ProtocolError("garbage", f"msgpack extension type {code} is not allowed")


def _unpack(data: bytes, max_bytes: int) -> Any:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ProtocolError("garbage", "frame is not bytes")
    if len(data) > max_bytes:
        raise ProtocolError("oversize", f"{len(data)} bytes > limit {max_bytes}")
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            ext_hook=_refuse_ext,
            max_str_len=MAX_TEXT,
            max_bin_len=max_bytes,
            max_array_len=MAX_ITEMS,
            max_map_len=MAX_ITEMS,
            max_ext_len=0,
        )
    except ProtocolError:
        raise
    except Exception as err:  # msgpack raises many types on bad input; all mean garbage
        raise ProtocolError("garbage", f"not a msgpack frame ({type(err).__name__})") from None


def decode(data: bytes, max_bytes: int) -> Envelope:
    """Decode and validate one envelope; raises ProtocolError on anything malformed."""
    wire = _unpack(data, max_bytes)
    if type(wire) is not dict or wire.keys() != ENVELOPE_KEYS:
        raise ProtocolError("bad_schema", "not an envelope")
    header = {name: scalar(wire[name], typ, f"envelope.{name}") for name, typ in HEADER_TYPES.items()}
    if type(wire["payload"]) is not dict:
        raise ProtocolError("bad_schema", "envelope.payload: expected dict")
    if header["schema_version"] != SCHEMA_VERSION:
        raise ProtocolError("unknown_version", f"schema_version {header['schema_version']}")
    payload_type = PAYLOAD_TYPES.get(header["kind"])
    if payload_type is None:
        raise ProtocolError("unknown_kind", f"kind {header['kind'][:40]!r}")
    return Envelope(**header, payload=from_wire(payload_type, wire["payload"]))
