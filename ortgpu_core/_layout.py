"""How a value's data is laid out in a device buffer: sizes padded to whole words, payloads padded to match, and
shapes checked before anything is allocated.

WebGPU copies and writes whole 4-byte words, so every buffer holds its data padded to a multiple of 4 (at least 4:
a zero-size buffer cannot be bound).  Pure Python; :mod:`ortgpu_core._value` re-exports these.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, cast

import numpy as np
import numpy.typing as npt

from ._errors import ArgumentTypeError, DtypeError, InvalidArgumentError, ShapeError
from .backends.protocol import MAPPED_READ_MIN, BackendDevice

__all__ = ["padded_size", "padded_payload", "check_shape", "host_memory_bytes", "host_zeros"]


def padded_size(nbytes: int) -> int:
    """Bytes allocated for ``nbytes`` of data: a multiple of 4, at least 4."""
    return max(4, (nbytes + 3) // 4 * 4)


def padded_payload(data: npt.NDArray[Any] | bytes | bytearray | memoryview) -> memoryview:
    """``data`` (an array in C order, or bytes) as bytes zero-padded to a multiple of 4 (WebGPU writes whole words)."""
    if isinstance(data, np.ndarray):
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    else:
        raw = np.frombuffer(data, dtype=np.uint8)
    if raw.nbytes % 4:
        raw = np.concatenate([raw, np.zeros(padded_size(raw.nbytes) - raw.nbytes, np.uint8)])
    return memoryview(cast(Any, raw))  # (numpy arrays export the buffer protocol)


def check_shape(shape: object) -> tuple[int, ...]:
    """A tuple of non-negative ints from ``shape``, or ``ShapeError``."""
    try:
        dims: tuple[Any, ...] = tuple(cast(Iterable[Any], shape))
    except TypeError:
        raise ShapeError(f"shape must be a sequence of ints, got {shape!r}") from None
    for dim in dims:
        if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, (int, np.integer)):
            raise ShapeError(f"shape {list(dims)!r} has a non-integer dim {dim!r}; shapes are sequences of ints")
        if dim < 0:
            raise ShapeError(f"shape {list(dims)!r} has a negative dim; dims must be >= 0")
    return tuple(int(d) for d in dims)


def host_memory_bytes() -> int:
    """Physical memory of this machine in bytes (a very large number where the platform cannot tell)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return 1 << 62


def host_zeros(dims: tuple[int, ...], dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    """A zero-filled host array of ``dims`` (a shape :func:`check_shape` returned) and ``dtype``, or ``ShapeError``.

    Zero-filled host memory is mapped lazily, so an absurd shape could "succeed" as a huge virtual array on one
    machine and fail on another: what cannot fit in this machine's memory is refused on every machine.
    """
    count = 1
    for dim in dims:
        count *= dim
    nbytes = count * dtype.itemsize
    if nbytes > host_memory_bytes():
        raise ShapeError(
            f"shape {list(dims)} of {dtype} needs {nbytes} bytes of host memory, more than this machine has "
            f"({host_memory_bytes()} bytes); use a smaller shape"
        )
    try:
        return np.zeros(dims, dtype=dtype)
    except (MemoryError, ValueError):
        raise ShapeError(
            f"shape {list(dims)} of {dtype} needs {nbytes} bytes of host memory, which could not be "
            f"allocated; use a smaller shape"
        ) from None


def check_out_array(out: object, shape: tuple[int, ...], dtype: np.dtype[Any], describe: str) -> None:
    """Refuse an ``out`` array a value of ``shape`` and ``dtype`` (``describe``: which value) cannot be read into:
    not a numpy array, another dtype or shape, not writable and C-contiguous."""
    if not isinstance(out, np.ndarray):
        raise ArgumentTypeError(f"to_numpy(out=...) needs a numpy array, got {type(out).__name__}")
    if out.dtype != dtype:
        raise DtypeError(
            f"to_numpy(out=...) got dtype {out.dtype} for {describe} of dtype {dtype}; "
            f"pass np.empty({list(shape)}, {str(dtype)!r})"
        )
    if out.shape != shape:
        raise ShapeError(
            f"to_numpy(out=...) got shape {list(out.shape)} for {describe} of shape {list(shape)}; "
            "pass an array of that shape"
        )
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise InvalidArgumentError(
            "to_numpy(out=...) needs a writable C-contiguous array (np.empty(shape, dtype) is one; "
            "np.ascontiguousarray makes one)"
        )


def read_new_array(device: BackendDevice, buffer: int, shape: tuple[int, ...], dtype: Any) -> npt.NDArray[Any]:
    """A new host array of ``shape`` and ``dtype`` from the first bytes of ``buffer`` on ``device`` (synchronous):
    read into a new array, or from :data:`MAPPED_READ_MIN` bytes the backend's own copy of them
    (``read_buffer_mapped``: on wgpu, the mapped staging buffer the device copied into, with no host copy)."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    if count * dtype.itemsize >= MAPPED_READ_MIN:
        held = device.read_buffer_mapped(buffer, 0, count * dtype.itemsize)
        return np.frombuffer(held, dtype=dtype, count=count).reshape(shape)
    result = np.empty(shape, dtype=dtype)
    if result.nbytes:
        device.read_buffer_into(buffer, 0, result.reshape(-1).view(np.uint8))
    return result
