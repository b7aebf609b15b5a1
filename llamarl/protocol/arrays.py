"""Typed binary arrays for the wire: {dtype, shape, data}, never lists of floats.

Only a fixed set of little-endian dtypes is accepted, and the byte length must equal the shape's
element count times the item size, so a decoder never trusts a size it has not checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from llamarl.errors import ProtocolError

ALLOWED_DTYPES = {"int32": "<i4", "int64": "<i8", "float32": "<f4", "float16": "<f2", "uint8": "u1"}
ITEM_SIZES = {name: np.dtype(code).itemsize for name, code in ALLOWED_DTYPES.items()}
WIRE_KEYS = {"dtype", "shape", "data"}
MAX_NDIM = 4


@dataclass(frozen=True)
class TypedArray:
    """An n-dimensional array as it travels: dtype name, shape and raw little-endian bytes."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes

    @classmethod
    def from_numpy(cls, array: np.ndarray) -> TypedArray:
        name = str(array.dtype)
        if name not in ALLOWED_DTYPES:
            raise ProtocolError("bad_array", f"dtype {name} is not allowed on the wire")
        contiguous = np.ascontiguousarray(array, dtype=np.dtype(ALLOWED_DTYPES[name]))
        return cls(name, tuple(int(d) for d in array.shape), contiguous.tobytes())

    def to_numpy(self) -> np.ndarray:
        return np.frombuffer(self.data, dtype=np.dtype(ALLOWED_DTYPES[self.dtype])).reshape(self.shape)

    def to_wire(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape), "data": self.data}

    @classmethod
    def from_wire(cls, value: Any, path: str) -> TypedArray:
        if type(value) is not dict or value.keys() != WIRE_KEYS:
            raise ProtocolError("bad_schema", f"{path}: expected an array {{dtype, shape, data}}")
        dtype, shape, data = value["dtype"], value["shape"], value["data"]
        item_size = ITEM_SIZES.get(dtype) if type(dtype) is str else None
        if item_size is None:
            raise ProtocolError("bad_array", f"{path}: dtype {dtype!r} is not allowed")
        if type(data) is not bytes:
            raise ProtocolError("bad_array", f"{path}: data must be bytes")
        if type(shape) is not list or len(shape) > MAX_NDIM:
            raise ProtocolError("bad_array", f"{path}: bad shape {shape!r}")
        count = item_size
        for dim in shape:
            if type(dim) is not int or not 0 <= dim <= len(data):
                raise ProtocolError("bad_array", f"{path}: bad shape {shape!r}")
            count *= dim
        if count != len(data):
            raise ProtocolError("bad_array", f"{path}: {len(data)} bytes do not fit shape {shape}")
        return cls(dtype, tuple(shape), data)
