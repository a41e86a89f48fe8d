"""A session's feeds and results as the user gives and gets them, and as ortgpu holds them on the host.

Users pass sequences as lists of arrays, optionals as ``None`` or their element, strings as numpy ``str``/``bytes``
arrays; inside ortgpu these are boxes and object arrays of ``str`` (:mod:`ortgpu._host_values`).
:class:`ortgpu.InferenceSession` converts each feed with :func:`as_host_value` / :func:`list_as_array` and each
result with :func:`as_output`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ortgpu_core import ArgumentTypeError
from ortgpu_core._errors import DtypeError, ShapeError

from ._host_values import (
    box,
    element_dtype_of,
    is_box,
    is_optional_box,
    is_sequence_dtype,
    items,
    optional_box,
    optional_element,
    optional_element_dtype,
    optional_present,
    optional_type_name,
)

__all__ = ["as_host_value", "as_output", "list_as_array", "as_string_objects"]


def as_sequence(name: str, value: object, dtype: np.dtype[Any]) -> np.ndarray:
    """A sequence input (a list or tuple of numpy arrays of the model's element dtype) as ortgpu's host value."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(a, np.ndarray) for a in value):
        raise ArgumentTypeError(
            f"input {name!r} is a sequence: pass a list of numpy arrays, got {type(value).__name__}"
        )
    element = element_dtype_of(dtype)
    for index, array in enumerate(value):
        if element is not None and array.dtype != element:
            raise DtypeError(
                f"input {name!r} is a sequence of {element}; its element {index} has dtype {array.dtype} (ortgpu "
                "never casts silently)"
            )
    return box([np.array(a) for a in value], element)


def as_host_value(name: str, value: object, dtype: np.dtype[Any]) -> np.ndarray:
    """A sequence or optional input as ortgpu's host value (a box)."""
    if is_sequence_dtype(dtype):
        return as_sequence(name, value, dtype)
    return as_optional(name, value, dtype)


def as_optional(name: str, value: object, dtype: np.dtype[Any]) -> np.ndarray:
    """An optional input (None: empty; else its element, an array or a list of arrays) as ortgpu's host value."""
    element = optional_element_dtype(dtype)
    if value is None:
        return optional_box(None, element)
    if is_sequence_dtype(element):
        return optional_box(as_sequence(name, value, element))
    if not isinstance(value, np.ndarray):
        raise ArgumentTypeError(
            f"input {name!r} is an {optional_type_name(dtype)}: pass a numpy array, or None for an empty one; got "
            f"{type(value).__name__}"
        )
    if element.kind == "O" and value.dtype.kind in "US":
        value = as_string_objects(value)
    if value.dtype != element:
        raise DtypeError(
            f"input {name!r} is an {optional_type_name(dtype)}; got an array of {value.dtype} (ortgpu never casts "
            "silently)"
        )
    declared = optional_present(dtype)[1]
    if declared is not None and (
        len(declared) != value.ndim or any(d is not None and d != s for d, s in zip(declared, value.shape))
    ):
        raise ShapeError(
            f"input {name!r} is an {optional_type_name(dtype)} of shape {list(declared)}; got shape {list(value.shape)}"
        )
    return optional_box(np.array(value))


def as_output(name: str, value: np.ndarray) -> Any:
    """A run's output as sessions give it: a sequence as a list of arrays, an optional as None or its element."""
    if is_optional_box(value):
        element = optional_element(value)
        return None if element is None else as_output(name, element)
    if is_box(value):
        return [np.array(a) for a in items(value, name)]
    return value


def list_as_array(name: str, value: list[Any] | tuple[Any, ...], dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    """A (nested) list input as an array of the input's dtype; refused where the conversion would change a value."""
    natural = np.array(value, dtype=object if dtype.kind == "O" else None)
    if dtype.kind == "O":
        return as_string_objects(natural) if natural.dtype.kind in "US" else natural
    try:
        converted = natural.astype(dtype)
    except (TypeError, ValueError) as error:
        raise DtypeError(f"input {name!r}: the list does not convert to {dtype} ({error})") from None
    if natural.dtype.kind in "fc" and dtype.kind in "fc":
        # Python floats are doubles: rounding to the input's float type is what onnxruntime does too.
        return converted
    if not np.array_equal(converted.astype(natural.dtype), natural):
        raise DtypeError(
            f"input {name!r}: the list's values ({natural.dtype}) do not convert exactly to {dtype}; pass a numpy "
            f"array of {dtype}"
        )
    return converted


def as_string_objects(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A numpy ``str_``/``bytes_`` array as an object array of ``str`` (bytes decoded as UTF-8), as string inputs
    are held."""
    out = np.empty(array.shape, dtype=object)
    for index, item in np.ndenumerate(array):
        if isinstance(item, np.void):  # raw bytes (onnxruntime accepts np.void arrays for strings)
            item = item.tobytes()
        out[index] = item.decode("utf-8") if isinstance(item, bytes) else str(item)
    return out
