"""The types the loader and the operators share: the bottom of ``ortgpu`` (it imports only ``ortgpu_core``).

* :func:`numpy_dtype_of` / :func:`onnx_dtype_to_numpy`: ONNX element types as numpy dtypes, the one place that maps
  them; which of them a model may use is the core's table (``ortgpu_core._dtypes``) plus ``STRING`` (host only).
* :func:`element_count` / :func:`tensor_bytes`: shape arithmetic in Python ints (a wrapping ``int64`` product
  turned ``[2**32, 2**32]`` into 0 elements); every size check uses them.
* :class:`TensorInfo`: a tensor's static shape and dtype, what the planner tells an operator (re-exported by
  :mod:`ortgpu.ops`).
* :class:`SubgraphRunner`: what a control-flow operator (``If``, ``Loop``, ``Scan``, ``SequenceMap``) receives as
  a ``GRAPH`` attribute: the loader builds it (:class:`ortgpu.loader._subgraph.Subgraph`), the operator only runs
  it, so the operators never import the loader.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import ml_dtypes
import numpy as np
import onnx
import onnx.helper

from ortgpu_core._dtypes import BFLOAT16, ONNX_DTYPES
from ortgpu_core._errors import UnsupportedOpError

__all__ = [
    "computable",
    "is_float_dtype",
    "SUPPORTED_DTYPES",
    "FOUR_BIT_DTYPES",
    "numpy_dtype_of",
    "onnx_dtype_to_numpy",
    "element_count",
    "tensor_bytes",
    "TensorInfo",
    "SubgraphRunner",
]

#: The dtypes a model's tensors may have: those with an ONNX element type in the core's table, and
#: TensorProto.STRING as object arrays of str, host values only (nodes that touch them run on the CPU).
SUPPORTED_DTYPES: frozenset[np.dtype[Any]] = ONNX_DTYPES | {np.dtype(object)}
#: INT4 and UINT4 (ml_dtypes' numpy types, one element a byte on the host): constants only (initializers, Constant
#: nodes), which the planner widens to int8/uint8 before any kernel reads them (:mod:`ortgpu._four_bit`); a graph
#: input or output of a 4-bit type is refused, since no device buffer and no numpy feed of ortgpu holds one.
FOUR_BIT_DTYPES: frozenset[np.dtype[Any]] = frozenset({np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4)})


def numpy_dtype_of(element_type: int) -> np.dtype[Any] | None:
    """The numpy dtype of an ONNX ``TensorProto`` element type, or None where there is none (an unknown number,
    ``UNDEFINED``).  Callers decide which of these they accept (sub-byte and 8-bit float types map to
    ``ml_dtypes`` types of kind ``'V'``)."""
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(element_type))
    except Exception:  # noqa: BLE001 - unknown enum values, strings
        return None


def onnx_dtype_to_numpy(elem_type: int, what: str, *, constant: bool = False) -> np.dtype[Any]:
    """The numpy dtype of an ONNX element type ortgpu supports, or ``UnsupportedOpError`` naming ``what``.

    ``constant``: ``what`` is an initializer or a Constant's value, which may also be 4-bit
    (:data:`FOUR_BIT_DTYPES`); anywhere else a 4-bit type is refused with a message that says so."""
    dtype = numpy_dtype_of(elem_type)
    name = (
        onnx.TensorProto.DataType.Name(elem_type) if elem_type in onnx.TensorProto.DataType.values() else str(elem_type)
    )
    if dtype is not None and dtype in FOUR_BIT_DTYPES:
        if constant:
            return dtype
        raise UnsupportedOpError(
            f"{what} has element type {name}: ortgpu reads 4-bit tensors only as constants (initializers, Constant "
            "nodes) that DequantizeLinear or GatherBlockQuantized dequantize; give the value as int8/uint8 instead"
        )
    if dtype is None or dtype not in SUPPORTED_DTYPES:
        raise UnsupportedOpError(
            f"{what} has element type {name}, which ortgpu does not support "
            "(supported: float16/32/64, bfloat16, int8..int64, uint8..uint64, bool, string; int4/uint4 "
            "constants)"
        )
    return dtype


def element_count(shape: Iterable[Any]) -> int:
    """The number of elements of ``shape``, exact (Python ints: no int64 wrap-around)."""
    count = 1
    for dim in shape:
        count *= int(dim)
    return count


def tensor_bytes(shape: Iterable[Any], dtype: Any) -> int:
    """The bytes of a C-contiguous tensor of ``shape`` and ``dtype``, exact."""
    return element_count(shape) * int(np.dtype(dtype).itemsize)


@dataclass(frozen=True)
class TensorInfo:
    """Static shape and dtype of one tensor."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]

    @property
    def size(self) -> int:
        """Elements, exact (Python ints: a shape whose element count overflows int64 stays huge, not wrapped)."""
        return element_count(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes, exact (the size times the dtype's item size)."""
        return self.size * self.dtype.itemsize


class SubgraphRunner(abc.ABC):
    """A ``GRAPH`` attribute of a control-flow node, checked and ready to run on the CPU.

    The loader passes one in the node's attributes; the operator reads the body's declared inputs and outputs
    from :attr:`graph` and runs it with :meth:`run`.  Outer-scope tensors the body reads ride as the node's
    trailing inputs, named by :attr:`outer_names`.
    """

    #: The subgraph as the model declares it (its inputs, outputs and their types).
    graph: onnx.GraphProto
    #: How error messages name it: ``body of Loop node 'loop' (opset 16)``.
    what: str
    #: The outer-scope tensors it reads, in the order they follow the node's declared inputs.
    outer_names: tuple[str, ...]

    @abc.abstractmethod
    def run(self, inputs: Sequence[np.ndarray], outer: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The graph's outputs for values of its inputs (in order) and of the outer-scope names it reads."""


def computable(value: Any) -> Any:
    """``value`` as the numpy references compute it: bfloat16 (a storage type, whose ml_dtypes arrays numpy's
    functions do not all take) widened to float32, exactly; anything else unchanged.  Whoever stores the result
    narrows it to the output's dtype, rounding once, as the device kernels do."""
    return value.astype(np.float32) if isinstance(value, np.ndarray) and value.dtype == BFLOAT16 else value


def is_float_dtype(dtype: np.dtype[Any]) -> bool:
    """Whether ``dtype`` holds floating-point numbers: numpy's floats, and bfloat16 (an ml_dtypes type numpy
    files under kind ``'V'``)."""
    return dtype.kind == "f" or dtype == BFLOAT16
