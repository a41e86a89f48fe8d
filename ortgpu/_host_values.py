"""Sequence and optional values as ortgpu holds them on the host: the types the loader, the planner, the
executor, the session and the operators on them (:mod:`ortgpu.ops.ai_onnx.sequences`,
:mod:`ortgpu.ops.ai_onnx.optional`) share.

Sequences (``seq(tensor)``): a 0-d numpy object array whose one item is a Python ``list`` of numpy arrays (a
"box", :func:`box`); its dtype carries ``metadata={"sequence": (element dtype, element shapes)}`` where the planner
knows them (:func:`sequence_dtype`).  The box keeps the machinery of host values (string tensors): object dtype, no
device slot, every node that reads or writes one runs on the CPU.  Sessions take and give plain lists of arrays.

Optionals (``optional(tensor)``, ``optional(seq(tensor))``): either *empty* or holding one element, a tensor or a
sequence box.  Inside ortgpu an optional is a 0-d numpy object array (an "optional box", :func:`optional_box`) whose
one item is an :class:`OptionalValue`; its dtype equals ``object`` and carries
``metadata={"optional": (element dtype, present, shape)}``:

* element dtype: the tensor's numpy dtype, or a sequence dtype (:func:`sequence_dtype`, whose metadata carries the
  element shapes when known);
* present: ``True``/``False`` for a value (its dtype says whether it holds an element), ``None`` for a declared
  type (a graph input before a run);
* shape: a present tensor's shape (``None`` otherwise); for a declared type, the declared tensor shape if any.

Plans are made for a run's optional inputs' states (:func:`host_signature`: empty or present, and the element's
shapes), as for sequences.  Sessions take and give ``None`` for an empty optional, else the element as a plain
array (a tensor) or a list of arrays (a sequence).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ortgpu_core._errors import ModelError, UnsupportedOpError

from ._types import onnx_dtype_to_numpy

__all__ = [
    "SEQUENCE_REASON",
    "ElementShapes",
    "sequence_dtype",
    "is_sequence_dtype",
    "element_dtype_of",
    "element_shapes_of",
    "box",
    "is_box",
    "items",
    "sequence_signature",
    "OPTIONAL_REASON",
    "OptionalValue",
    "optional_dtype",
    "is_optional_dtype",
    "optional_element_dtype",
    "optional_present",
    "optional_box",
    "is_optional_box",
    "optional_element",
    "is_structured_dtype",
    "is_structured_box",
    "host_signature",
    "value_dtype_matches",
    "probe_value",
    "optional_type_name",
    "element_type_of_proto",
]

# ---------------------------------------------------------------------------
# sequences

#: Why a node that reads or writes a sequence runs on the CPU.
SEQUENCE_REASON = "sequence values live on the host"


ElementShapes = tuple[tuple[int, ...], ...] | None


def sequence_dtype(element: np.dtype[Any] | None, shapes: ElementShapes = None) -> np.dtype[Any]:
    """The object dtype of a sequence value: equal to ``object`` (a host value), with its element dtype and (when
    known) the element shapes in its metadata."""
    return np.dtype(object, metadata={"sequence": (element, shapes)})


def is_sequence_dtype(dtype: np.dtype[Any]) -> bool:
    return dtype.metadata is not None and "sequence" in dtype.metadata


def element_dtype_of(dtype: np.dtype[Any]) -> np.dtype[Any] | None:
    meta = dtype.metadata
    return None if meta is None or "sequence" not in meta else meta["sequence"][0]


def element_shapes_of(dtype: np.dtype[Any]) -> ElementShapes:
    meta = dtype.metadata
    return None if meta is None or "sequence" not in meta else meta["sequence"][1]


def box(values: Sequence[np.ndarray], element: np.dtype[Any] | None = None) -> np.ndarray:
    """A sequence value (see the module docstring); its dtype records the element dtype and shapes."""
    arrays = [np.asarray(v) for v in values]
    if element is None and arrays:
        element = arrays[0].dtype
    out = np.empty((), dtype=sequence_dtype(element, tuple(tuple(int(d) for d in a.shape) for a in arrays)))
    out[()] = arrays
    return out


def is_box(value: object) -> bool:
    return isinstance(value, np.ndarray) and value.dtype == object and value.shape == () and isinstance(value[()], list)


def items(value: np.ndarray | None, what: str) -> list[np.ndarray]:
    """The arrays of sequence value ``value``."""
    if value is None or not is_box(value):
        raise ModelError(f"{what}: expected a sequence value")
    found = value[()]
    assert isinstance(found, list)
    return found


def sequence_signature(value: np.ndarray) -> tuple[Any, ...]:
    """Element dtype and shapes of a sequence value (what its plans depend on)."""
    arrays = items(value, "sequence")
    element = element_dtype_of(value.dtype)
    return (str(element) if element is not None else None, tuple(tuple(a.shape) for a in arrays))


# ---------------------------------------------------------------------------
# optionals

#: Why a node that reads or writes an optional value runs on the CPU.
OPTIONAL_REASON = "optional values live on the host"


class OptionalValue:
    """The item of an optional box: ``element`` is None (empty) or the tensor / sequence box it holds."""

    __slots__ = ("element",)

    def __init__(self, element: np.ndarray | None) -> None:
        self.element = element

    def __repr__(self) -> str:
        return "OptionalValue(empty)" if self.element is None else f"OptionalValue({self.element!r})"


def optional_dtype(
    element: np.dtype[Any], present: bool | None = None, shape: tuple[int | None, ...] | None = None
) -> np.dtype[Any]:
    """The object dtype of an optional value (see the module docstring)."""
    return np.dtype(object, metadata={"optional": (element, present, shape)})


def is_optional_dtype(dtype: np.dtype[Any]) -> bool:
    return dtype.metadata is not None and "optional" in dtype.metadata


def optional_element_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The element type of optional dtype ``dtype``: a numpy dtype (a tensor) or a sequence dtype."""
    assert is_optional_dtype(dtype)
    element: np.dtype[Any] = dtype.metadata["optional"][0]  # type: ignore[index]
    return element


def optional_present(dtype: np.dtype[Any]) -> tuple[bool | None, tuple[int | None, ...] | None]:
    """(present, shape) of optional dtype ``dtype``; a declared type (a graph input's) has present None and the
    declared tensor shape, if any (None for a dynamic dim)."""
    assert is_optional_dtype(dtype)
    _, present, shape = dtype.metadata["optional"]  # type: ignore[index]
    return present, shape


def optional_box(element: np.ndarray | None, element_dtype: np.dtype[Any] | None = None) -> np.ndarray:
    """An optional value holding ``element`` (a tensor or a sequence box), or an empty one of ``element_dtype``."""
    if element is None:
        if element_dtype is None:
            raise ModelError("an empty optional value needs its element type")
        dtype = optional_dtype(element_dtype, False, None)
    elif is_optional_box(element):
        raise ModelError("an optional value cannot hold an optional value")
    elif is_box(element):
        dtype = optional_dtype(element.dtype, True, None)
    else:
        element = np.asarray(element)
        dtype = optional_dtype(element.dtype, True, tuple(int(d) for d in element.shape))
    out = np.empty((), dtype=dtype)
    out[()] = OptionalValue(element)
    return out


def is_optional_box(value: object) -> bool:
    return (
        isinstance(value, np.ndarray)
        and value.dtype == object
        and value.shape == ()
        and isinstance(value[()], OptionalValue)
    )


def optional_element(value: np.ndarray) -> np.ndarray | None:
    """The element an optional box holds (None: empty)."""
    item = value[()]
    assert isinstance(item, OptionalValue)
    return item.element


def is_structured_dtype(dtype: np.dtype[Any]) -> bool:
    """Whether ``dtype`` is a sequence's or an optional's (a host value whose plans depend on its structure)."""
    return is_sequence_dtype(dtype) or is_optional_dtype(dtype)


def is_structured_box(value: object) -> bool:
    """Whether ``value`` is a sequence box or an optional box (no tensor onnx's inference could type)."""
    return is_box(value) or is_optional_box(value)


def host_signature(dtype: np.dtype[Any]) -> Any:
    """What the plans of a graph reading a value of ``dtype`` depend on: a sequence's element dtype and shapes, an
    optional's element type, presence and shapes; None for a tensor."""
    if is_sequence_dtype(dtype):
        return ("seq", str(element_dtype_of(dtype)), element_shapes_of(dtype))
    if is_optional_dtype(dtype):
        element = optional_element_dtype(dtype)
        present, shape = optional_present(dtype)
        return ("optional", host_signature(element) or str(element), present, shape)
    return None


def value_dtype_matches(declared: np.dtype[Any], given: np.dtype[Any]) -> bool:
    """Whether a value of dtype ``given`` fits the declared element type ``declared`` (tensor or sequence)."""
    if is_sequence_dtype(declared) or is_sequence_dtype(given):
        if not (is_sequence_dtype(declared) and is_sequence_dtype(given)):
            return False
        want, got = element_dtype_of(declared), element_dtype_of(given)
        return want is None or got is None or want == got
    return bool(declared == given)


def probe_value(dtype: np.dtype[Any]) -> np.ndarray | None:
    """A value of structured ``dtype`` made of zeros (what shape probes run on); None when its structure is not
    known (a declared type)."""
    if is_sequence_dtype(dtype):
        shapes, element = element_shapes_of(dtype), element_dtype_of(dtype)
        if shapes is None or element is None:
            return None
        return box([np.zeros(shape, dtype=element) for shape in shapes], element)
    if is_optional_dtype(dtype):
        element = optional_element_dtype(dtype)
        present, shape = optional_present(dtype)
        if present is None:
            return None
        if not present:
            return optional_box(None, element)
        if is_sequence_dtype(element):
            inner = probe_value(element)
            return None if inner is None else optional_box(inner)
        if shape is None or any(d is None for d in shape):
            return None
        return optional_box(np.zeros(tuple(int(d) for d in shape if d is not None), dtype=element))
    return None


def optional_type_name(dtype: np.dtype[Any]) -> str:
    """onnxruntime's name of an optional type: ``optional(tensor(float))``, ``optional(seq(tensor(float)))``."""
    from ortgpu_core._dtypes import onnx_type_name

    def tensor_name(element: np.dtype[Any]) -> str:
        return "tensor(string)" if element.kind == "O" else onnx_type_name(element)

    element = optional_element_dtype(dtype)
    if is_sequence_dtype(element):
        inner = element_dtype_of(element)
        return f"optional(seq({tensor_name(inner) if inner is not None else 'tensor(undefined)'}))"
    return f"optional({tensor_name(element)})"


def element_type_of_proto(type_proto: Any, what: str) -> np.dtype[Any]:
    """The element dtype (a numpy dtype, or a sequence dtype) of an ONNX ``TypeProto`` of a tensor or a sequence of
    tensors; other types are refused."""
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type" and type_proto.tensor_type.elem_type:
        return np.dtype(onnx_dtype_to_numpy(type_proto.tensor_type.elem_type, what))
    if kind == "sequence_type":
        inner = type_proto.sequence_type.elem_type
        if inner.WhichOneof("value") == "tensor_type" and inner.tensor_type.elem_type:
            return sequence_dtype(np.dtype(onnx_dtype_to_numpy(inner.tensor_type.elem_type, what)))
    raise UnsupportedOpError(
        f"{what}: an optional of {kind or 'an untyped value'} ({type_proto}); ortgpu supports optionals of typed "
        "tensors and of sequences of typed tensors only"
    )
