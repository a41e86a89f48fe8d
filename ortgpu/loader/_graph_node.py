"""The loaded graph's records and the rules every loader module applies to a node.

:class:`GraphNode` (a node with its attributes as Python values), the :data:`Shape` of a tensor as propagation
knows it, the opset range ortgpu accepts and how an older node maps into it (:func:`_effective_opset`), and
tensor data read from a ``TensorProto`` (:func:`_to_array`).  The loader's other modules (the model, its
subgraphs, shape propagation, limits) import these; this module imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Union

import numpy as np
import onnx
import onnx.defs
import onnx.numpy_helper

from ortgpu_core._errors import InvalidModelError, UnsupportedOpError

__all__ = ["Dim", "Shape", "GraphNode", "MAX_IR_VERSION", "MIN_OPSET", "MAX_OPSET"]

#: A dimension: a concrete size, a symbolic name, or unknown.
Dim = Union[int, str, None]
Shape = tuple[Dim, ...]

#: Newest IR version and default-domain opset range ortgpu accepts.
MAX_IR_VERSION = 14
MIN_OPSET = 7
MAX_OPSET = 28


@dataclass(frozen=True)
class GraphNode:
    """One node of the graph, with attributes as Python values.

    Missing optional inputs are ``""``.  Attribute values: ints, floats,
    ``str`` (decoded UTF-8), lists of those, numpy arrays for tensors.
    """

    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any]
    opset: int

    def describe(self) -> str:
        """How error messages name the node: ``Conv node 'conv1' (opset 17)``."""
        return f"{self.op_type} node {self.name!r} (opset {self.opset})"


def _effective_opset(op_type: str, domain: str, opset: int) -> int:
    """The opset a node of a default-domain model older than :data:`MIN_OPSET` runs at.

    ortgpu implements the operators as they are from opset 7 on.  An operator whose definition did not change
    between the model's opset and opset 7 (``Not``, ``Identity``, ``Conv``...) runs as at opset 7, as
    onnxruntime does; one that changed (``Add`` before 7 had ``broadcast`` and ``axis``) is refused with the
    reason, never run with the newer semantics.
    """
    if domain != "" or opset >= MIN_OPSET:
        return opset
    try:
        then = onnx.defs.get_schema(op_type, opset).since_version
        at_min = onnx.defs.get_schema(op_type, MIN_OPSET).since_version
    except Exception:  # noqa: BLE001 - not an ai.onnx operator at that opset: refused where it is looked up
        return opset
    if then != at_min:
        raise UnsupportedOpError(
            f"{op_type} at ai.onnx opset {opset} follows its opset-{then} definition, which changed in opset "
            f"{at_min}; ortgpu implements opsets {MIN_OPSET}..{MAX_OPSET}: convert the model with "
            "onnx.version_converter"
        )
    return MIN_OPSET


def _to_array(tensor: onnx.TensorProto, what: str) -> np.ndarray:
    """``tensor``'s data as a C-contiguous array; its data disagreeing with its shape is an ``InvalidModelError``."""
    try:
        array = np.asarray(onnx.numpy_helper.to_array(tensor), order="C")
        if array.dtype == object:  # STRING: onnx gives str (or bytes from old exporters): always str
            array = _as_str_objects(array)
        return array
    except (ValueError, TypeError, OverflowError, MemoryError) as error:
        raise InvalidModelError(
            f"{what} (shape {list(tensor.dims)}) cannot be read: {str(error)[:200]}; its data does not match its "
            "shape and type, the model is corrupt"
        ) from None


def _as_str_objects(array: np.ndarray) -> np.ndarray:
    """A STRING tensor's data as an object array of ``str`` (bytes decoded as UTF-8)."""
    out = np.empty(array.shape, dtype=object)
    for index, item in np.ndenumerate(array):
        out[index] = item.decode("utf-8") if isinstance(item, bytes) else str(item)
    return out


def _sparse_to_array(sparse: onnx.SparseTensorProto, what: str) -> np.ndarray:
    """A sparse initializer or ``sparse_value`` as the dense array it stands for (zeros where no value is given):
    constants are folded and uploaded dense, so sparsity only saves bytes in the file.  ``indices`` are int64,
    either ``[NNZ]`` positions in the flattened tensor or ``[NNZ, rank]`` coordinates (ONNX's two forms); anything
    else, or a position outside the shape, is an ``InvalidModelError``."""
    shape = tuple(int(d) for d in sparse.dims)
    values = _to_array(sparse.values, f"{what}'s values")
    indices = _to_array(sparse.indices, f"{what}'s indices") if sparse.HasField("indices") else np.zeros((0,), np.int64)
    count = int(np.prod(shape, dtype=np.int64))
    if values.ndim != 1 or indices.dtype != np.int64 or indices.shape[:1] != values.shape:
        raise InvalidModelError(
            f"{what}: a sparse tensor needs 1-D values and int64 indices with one entry per value (got values "
            f"{list(values.shape)}, indices {list(indices.shape)} of {indices.dtype}); the model is corrupt"
        )
    if indices.ndim == 2 and indices.shape[1] == len(shape) and len(shape) > 0:
        if indices.size and ((indices < 0).any() or (indices >= np.array(shape)).any()):
            raise InvalidModelError(
                f"{what}: a sparse index lies outside the shape {list(shape)}; the model is corrupt"
            )
        positions = np.ravel_multi_index(tuple(indices.T), shape) if indices.size else indices.reshape(-1)
    elif indices.ndim == 1:
        positions = indices
    else:
        raise InvalidModelError(
            f"{what}: sparse indices must be [NNZ] or [NNZ, {len(shape)}], got {list(indices.shape)}; the model is "
            "corrupt"
        )
    if positions.size and (positions.min() < 0 or positions.max() >= count):
        raise InvalidModelError(f"{what}: a sparse index lies outside the shape {list(shape)}; the model is corrupt")
    dense = np.zeros(count, dtype=values.dtype) if values.dtype != object else np.full(count, "", dtype=object)
    dense[positions] = values
    return dense.reshape(shape)
