"""Converts payload dataclasses to and from plain msgpack values, checking every field's type.

A payload's wire form is a map with exactly its field names. Supported field types: int, float,
str, bool, TypedArray, dict[str, float], dict[str, str] and nested payload dataclasses. Anything
else on the wire is a ProtocolError naming the field path.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from functools import cache
from typing import Any

from llamarl.errors import ProtocolError
from llamarl.protocol.arrays import TypedArray

MAX_MAP_ITEMS = 256


@cache
def field_types(cls: Any) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def to_wire(payload: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cls: Any = type(payload)
    for name in field_types(cls):
        value = getattr(payload, name)
        if isinstance(value, TypedArray):
            out[name] = value.to_wire()
        elif dataclasses.is_dataclass(value):
            out[name] = to_wire(value)
        else:
            out[name] = value
    return out


def scalar(value: Any, typ: type, path: str) -> Any:
    """`value` if it is exactly a `typ` (an int is also a float), else ProtocolError."""
    if typ is float and type(value) is int:
        return float(value)
    # bool is a subclass of int; refuse it where an int is wanted and vice versa.
    if type(value) is not typ:
        raise ProtocolError("bad_schema", f"{path}: expected {typ.__name__}")
    return value


def _mapping(value: Any, value_type: type, path: str) -> dict[str, Any]:
    if not isinstance(value, dict) or len(value) > MAX_MAP_ITEMS:
        raise ProtocolError("bad_schema", f"{path}: expected a map of at most {MAX_MAP_ITEMS}")
    return {scalar(k, str, f"{path}.<key>"): scalar(v, value_type, f"{path}.{k}") for k, v in value.items()}


Converter = Callable[[Any, str], Any]


def _converter(typ: Any) -> Converter:
    """The function that checks and converts one field of type `typ` from its wire value."""
    if typ is TypedArray:
        return TypedArray.from_wire
    if dataclasses.is_dataclass(typ):
        return lambda value, path: from_wire(typ, value, path)  # type: ignore[arg-type]
    if typing.get_origin(typ) is dict:
        value_type = typing.get_args(typ)[1]
        return lambda value, path: _mapping(value, value_type, path)
    return lambda value, path: scalar(value, typ, path)


@cache
def _converters(cls: Any) -> tuple[frozenset[str], tuple[tuple[str, Converter], ...]]:
    fields = field_types(cls)
    return frozenset(fields), tuple((name, _converter(typ)) for name, typ in fields.items())


def from_wire(cls: type, value: Any, path: str = "payload") -> Any:
    """Build `cls` from its wire map; raises ProtocolError on any missing, extra or bad field."""
    names, converters = _converters(cls)
    if type(value) is not dict:
        raise ProtocolError("bad_schema", f"{path}: expected a map")
    if value.keys() != names:
        missing = sorted(names - set(value))
        extra = sorted(str(k) for k in set(value) - names)
        raise ProtocolError("bad_schema", f"{path}: missing {missing}, unexpected {extra}")
    return cls(**{name: convert(value[name], f"{path}.{name}") for name, convert in converters})
