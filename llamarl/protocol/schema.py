"""Converts payload dataclasses to and from plain msgpack values, checking every field's type.

A payload's wire form is a map with exactly its field names. Supported field types: int, float,
str, bool, TypedArray, dict[str, float], dict[str, str] and nested payload dataclasses. Anything
else on the wire is a ProtocolError naming the field path.
"""

from __future__ import annotations

import dataclasses
import typing
from functools import cache
from typing import Any

from llamarl.errors import ProtocolError
from llamarl.protocol.arrays import TypedArray

MAX_MAP_ITEMS = 256


@cache
def _field_types(cls: Any) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def to_wire(payload: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cls: Any = type(payload)
    for name in _field_types(cls):
        value = getattr(payload, name)
        if isinstance(value, TypedArray):
            out[name] = value.to_wire()
        elif dataclasses.is_dataclass(value):
            out[name] = to_wire(value)
        else:
            out[name] = value
    return out


def _scalar(value: Any, typ: type, path: str) -> Any:
    if typ is float and type(value) is int:
        return float(value)
    # bool is a subclass of int; refuse it where an int is wanted and vice versa.
    if type(value) is not typ:
        raise ProtocolError("bad_schema", f"{path}: expected {typ.__name__}")
    return value


def _mapping(value: Any, value_type: type, path: str) -> dict[str, Any]:
    if not isinstance(value, dict) or len(value) > MAX_MAP_ITEMS:
        raise ProtocolError("bad_schema", f"{path}: expected a map of at most {MAX_MAP_ITEMS}")
    return {
        _scalar(k, str, f"{path}.<key>"): _scalar(v, value_type, f"{path}.{k}")
        for k, v in value.items()
    }


def _convert(value: Any, typ: Any, path: str) -> Any:
    if typ is TypedArray:
        return TypedArray.from_wire(value, path)
    if dataclasses.is_dataclass(typ):
        return from_wire(typ, value, path)  # type: ignore[arg-type]
    if typing.get_origin(typ) is dict:
        return _mapping(value, typing.get_args(typ)[1], path)
    return _scalar(value, typ, path)


def from_wire(cls: type, value: Any, path: str = "payload") -> Any:
    """Build `cls` from its wire map; raises ProtocolError on any missing, extra or bad field."""
    fields = _field_types(cls)
    if not isinstance(value, dict):
        raise ProtocolError("bad_schema", f"{path}: expected a map")
    if set(value) != set(fields):
        missing = sorted(set(fields) - set(value))
        extra = sorted(str(k) for k in set(value) - set(fields))
        raise ProtocolError("bad_schema", f"{path}: missing {missing}, unexpected {extra}")
    return cls(
        **{name: _convert(value[name], typ, f"{path}.{name}") for name, typ in fields.items()}
    )
