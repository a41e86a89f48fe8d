"""Dtype names, numpy dtypes and ONNX element types, and which of them a device can hold."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from ._errors import DtypeError

__all__ = [
    "BFLOAT16",
    "ONNX_DTYPES",
    "as_dtype",
    "onnx_element_type",
    "onnx_type_name",
    "dtype_from_onnx",
    "check_device_dtype",
]

# ONNX TensorProto.DataType numbers (stable across onnx versions).
_ONNX_ELEMENT_TYPES: dict[np.dtype[Any], tuple[int, str]] = {
    np.dtype(np.float32): (1, "float"),
    np.dtype(np.uint8): (2, "uint8"),
    np.dtype(np.int8): (3, "int8"),
    np.dtype(np.uint16): (4, "uint16"),
    np.dtype(np.int16): (5, "int16"),
    np.dtype(np.int32): (6, "int32"),
    np.dtype(np.int64): (7, "int64"),
    np.dtype(np.bool_): (9, "bool"),
    np.dtype(np.float16): (10, "float16"),
    np.dtype(np.float64): (11, "double"),
    np.dtype(np.uint32): (12, "uint32"),
    np.dtype(np.uint64): (13, "uint64"),
    # numpy has no bfloat16: ml_dtypes' (onnx's own numpy type for it) holds bfloat16 arrays on the host
    np.dtype(ml_dtypes.bfloat16): (16, "bfloat16"),
}
#: bfloat16's numpy dtype (ml_dtypes').
BFLOAT16: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
#: The dtypes with an ONNX element type ortgpu supports (``ortgpu`` adds host-only strings to these for models).
ONNX_DTYPES: frozenset[np.dtype[Any]] = frozenset(_ONNX_ELEMENT_TYPES)
_FROM_ONNX: dict[int, np.dtype[Any]] = {number: dtype for dtype, (number, _) in _ONNX_ELEMENT_TYPES.items()}
_FROM_ONNX_NAME: dict[str, np.dtype[Any]] = {
    f"tensor({name})": dtype for dtype, (_, name) in _ONNX_ELEMENT_TYPES.items()
}

#: What a WebGPU buffer may hold (bit-exact numpy layout).  float64 and 64-bit
#: unsigned integers have no use on a device without f64/u64 arithmetic.  bfloat16 is storage only: kernels read
#: its 16 bits as the high half of an f32 and compute in f32, so it needs no adapter feature.
DEVICE_DTYPES = frozenset(
    np.dtype(d)
    for d in (
        np.float32,
        np.float16,
        ml_dtypes.bfloat16,
        np.int32,
        np.uint32,
        np.int64,
        np.int16,
        np.uint16,
        np.int8,
        np.uint8,
        np.bool_,
    )
)


def as_dtype(dtype: Any) -> np.dtype[Any]:
    """A numpy dtype from a numpy dtype, a type, a name ("float32") or an ONNX type string ("tensor(float)")."""
    if isinstance(dtype, str) and dtype in _FROM_ONNX_NAME:
        return _FROM_ONNX_NAME[dtype]
    if isinstance(dtype, int) and not isinstance(dtype, bool) and dtype in _FROM_ONNX:
        return _FROM_ONNX[dtype]
    try:
        result: np.dtype[Any] = np.dtype(dtype)
    except TypeError as error:
        raise DtypeError(f"{dtype!r} is not a dtype: give a numpy dtype or its name, e.g. 'float32'") from error
    if result not in _ONNX_ELEMENT_TYPES:
        raise DtypeError(
            f"dtype {result} is not supported: use one of " + ", ".join(sorted(str(d) for d in _ONNX_ELEMENT_TYPES))
        )
    return result


def onnx_element_type(dtype: np.dtype[Any]) -> int:
    """The ONNX TensorProto element type number of ``dtype``."""
    return _ONNX_ELEMENT_TYPES[dtype][0]


def onnx_type_name(dtype: np.dtype[Any]) -> str:
    """onnxruntime's type string, e.g. ``tensor(float)``."""
    return f"tensor({_ONNX_ELEMENT_TYPES[dtype][1]})"


def dtype_from_onnx(element_type: int) -> np.dtype[Any]:
    try:
        return _FROM_ONNX[element_type]
    except KeyError:
        raise DtypeError(f"ONNX element type {element_type} is not supported by ortgpu") from None


def check_device_dtype(dtype: np.dtype[Any], features: frozenset[str], device_name: str) -> None:
    """Raise ``DtypeError`` unless a device with ``features`` can hold ``dtype``."""
    if dtype not in DEVICE_DTYPES:
        raise DtypeError(
            f"dtype {dtype} cannot live on a WebGPU device ({device_name}): WebGPU has no 64-bit floats or "
            f"unsigned 64-bit integers; keep the value on the CPU or cast it (e.g. to float32) first"
        )
    if dtype == np.float16 and "shader-f16" not in features:
        raise DtypeError(
            f"dtype float16 needs the adapter feature 'shader-f16', which {device_name} lacks; "
            f"use float32, or choose a device whose features include 'shader-f16'"
        )
