"""Load-time limits and checks that keep a hostile model from exhausting memory or time.

* :class:`LoadLimits`: the most nodes a model may have (``max_nodes``) and the most bytes of constants that
  constant folding may create for it (``max_fold_bytes``, over the load and each plan together).  Each limit is a
  keyword argument of :func:`ortgpu.loader._model.load_model`; when one is not given, the environment variable
  (``ORTGPU_MAX_NODES``, ``ORTGPU_MAX_FOLD_BYTES``, a plain decimal integer, read at each load) or else the
  module default below applies.
* :class:`FoldBudget`: what folding may still create.  Once it is spent, larger constants are not folded: their
  nodes stay in the graph and run (on the device, or on the CPU for ``ConstantOfShape`` and the like).
* :func:`check_external_data`: every external-data entry is validated before a byte is read.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
import onnx.helper
from onnx import external_data_helper

from ortgpu_core._errors import InvalidArgumentError, InvalidModelError, ModelError

from .._types import numpy_dtype_of, tensor_bytes
from ._graph_node import GraphNode

#: ``name -> (shape, dtype)`` as shape propagation keeps it (dims may be symbolic or None).
_Types = Mapping[str, "tuple[tuple[Any, ...], np.dtype[Any]]"]

__all__ = [
    "DEFAULT_MAX_FOLD_BYTES",
    "DEFAULT_MAX_NODES",
    "FOLD_TENSOR_LIMIT_BYTES",
    "ALWAYS_FOLD_BYTES",
    "MAX_FOLD_BYTES_ENV",
    "MAX_NODES_ENV",
    "DEFAULT_MAX_CACHED_PLANS",
    "MAX_CACHED_PLANS_ENV",
    "max_cached_plans",
    "LoadLimits",
    "FoldBudget",
    "check_node_count",
    "may_fold",
    "keep_folded",
    "check_shape_probe",
    "check_external_data",
]

#: Total bytes of constants that constant folding may create per model (load and each plan together).
DEFAULT_MAX_FOLD_BYTES = 256 << 20
#: The most nodes a model may have (``graph.node``, Constant nodes included).
DEFAULT_MAX_NODES = 100_000
#: No single folded constant is bigger than this (bytes): it would be a weight nobody asked for.
FOLD_TENSOR_LIMIT_BYTES = 64 << 20
#: Constants up to this size (shapes, axes, scalars) are folded even when the budget is spent: later shapes
#: depend on them.  They still count against the budget.
ALWAYS_FOLD_BYTES = 1024

MAX_FOLD_BYTES_ENV = "ORTGPU_MAX_FOLD_BYTES"
MAX_NODES_ENV = "ORTGPU_MAX_NODES"

#: Plans a session keeps (one per input signature: shapes, and the values of inputs that decide shapes), with
#: their programs and staging buffers; the least recently used is dropped past it, so a session fed a new shape on
#: every call holds bounded memory.  ``ORTGPU_MAX_CACHED_PLANS`` (read when a session is created) overrides it.
DEFAULT_MAX_CACHED_PLANS = 16
MAX_CACHED_PLANS_ENV = "ORTGPU_MAX_CACHED_PLANS"


def max_cached_plans() -> int:
    """:data:`DEFAULT_MAX_CACHED_PLANS`, or the positive integer in ``ORTGPU_MAX_CACHED_PLANS``."""
    value = _from_env(MAX_CACHED_PLANS_ENV, DEFAULT_MAX_CACHED_PLANS)
    if value < 1:
        raise InvalidArgumentError(f"environment variable {MAX_CACHED_PLANS_ENV} must be at least 1; got {value}")
    return value


# ---------------------------------------------------------------------------
# limits


def _from_env(variable: str, default: int) -> int:
    text = os.environ.get(variable)
    if text is None or not text.strip():
        return default
    if not re.fullmatch(r"[0-9]+", text.strip()):
        raise InvalidArgumentError(f"environment variable {variable}={text!r} is not a non-negative decimal integer")
    return int(text.strip())


def _checked(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise InvalidArgumentError(f"{name} must be a non-negative int; got {value!r}")
    return int(value)


@dataclass(frozen=True)
class LoadLimits:
    """The limits a model was loaded under (see the module docstring)."""

    max_fold_bytes: int = DEFAULT_MAX_FOLD_BYTES
    max_nodes: int = DEFAULT_MAX_NODES

    @classmethod
    def resolve(cls, max_fold_bytes: int | None = None, max_nodes: int | None = None) -> LoadLimits:
        """Each limit from its argument, else its environment variable, else the module default."""
        return cls(
            max_fold_bytes=_checked("max_fold_bytes", max_fold_bytes)
            if max_fold_bytes is not None
            else _from_env(MAX_FOLD_BYTES_ENV, DEFAULT_MAX_FOLD_BYTES),
            max_nodes=_checked("max_nodes", max_nodes)
            if max_nodes is not None
            else _from_env(MAX_NODES_ENV, DEFAULT_MAX_NODES),
        )


def check_node_count(count: int, limits: LoadLimits) -> None:
    if count > limits.max_nodes:
        raise ModelError(
            f"the model has {count} nodes, more than the limit of {limits.max_nodes} (planning time and memory grow "
            f"with the node count); if you trust this model, raise the limit with load_model(..., max_nodes=N) or "
            f"the environment variable {MAX_NODES_ENV}=N"
        )


@dataclass
class FoldBudget:
    """Bytes of constants that folding may still create: ``limit`` in all, ``spent`` so far."""

    limit: int
    spent: int = 0
    #: (node name, bytes) of the nodes left unfolded because the budget was spent.
    refused: list[tuple[str, int]] = field(default_factory=list)

    def admits(self, nbytes: int) -> bool:
        return nbytes <= ALWAYS_FOLD_BYTES or self.spent + nbytes <= self.limit

    def spend(self, nbytes: int) -> None:
        self.spent += nbytes

    def refuse(self, node_name: str, nbytes: int) -> None:
        self.refused.append((node_name, nbytes))

    def note(self) -> str:
        """A sentence for error messages when folding stopped early (else "")."""
        if not self.refused:
            return ""
        name, nbytes = self.refused[0]
        return (
            f" (constant folding stopped at its budget of {self.limit} bytes, first at node {name!r} "
            f"({nbytes} bytes), so {len(self.refused)} node(s) were left to run; raise the budget with "
            f"load_model(..., max_fold_bytes=N) or the environment variable {MAX_FOLD_BYTES_ENV}=N)"
        )


# ---------------------------------------------------------------------------
# what constant folding may compute

#: Operators whose output can be far bigger than their inputs, its size decided by input values.
GROWING_OPS = frozenset(
    {
        "ConstantOfShape",
        "Expand",
        "Tile",
        "Range",
        "Pad",
        "Resize",
        "Upsample",
        "OneHot",
        "CenterCropPad",
        "Col2Im",
    }
)


def _known_bytes(names: Sequence[str], types: _Types) -> int | None:
    """Total bytes of the tensors ``names`` if all their shapes are known, else None."""
    total = 0
    for name in names:
        if not name:
            continue
        if name not in types or not all(isinstance(d, int) for d in types[name][0]):
            return None
        total += tensor_bytes(types[name][0], types[name][1])
    return total


def may_fold(node: GraphNode, types: _Types, constants: Mapping[str, np.ndarray], budget: FoldBudget) -> bool:
    """Whether to compute ``node`` (all inputs constant) now: decided *before* anything is computed.

    With every output shape known: no output over :data:`FOLD_TENSOR_LIMIT_BYTES` (big outputs are not worth
    turning into weights) and all of them within ``budget``.  With an output shape onnx could not infer: only a
    node that cannot grow its inputs by their values (not in :data:`GROWING_OPS`), from inputs of at most
    :data:`FOLD_TENSOR_LIMIT_BYTES` (:func:`keep_folded` then checks the result).
    """
    outputs = [name for name in node.outputs if name]
    total = _known_bytes(outputs, types)
    if total is not None:
        if any(tensor_bytes(types[name][0], types[name][1]) > FOLD_TENSOR_LIMIT_BYTES for name in outputs):
            return False
        if not budget.admits(total):
            budget.refuse(node.name, total)
            return False
        return True
    if node.op_type in GROWING_OPS:
        return False
    return sum(constants[name].nbytes for name in node.inputs if name) <= FOLD_TENSOR_LIMIT_BYTES


def keep_folded(node: GraphNode, values: Sequence[np.ndarray], budget: FoldBudget) -> bool:
    """Whether the computed ``values`` of ``node`` become constants (then spent from ``budget``)."""
    total = sum(int(value.nbytes) for value in values)
    if any(value.nbytes > FOLD_TENSOR_LIMIT_BYTES for value in values):
        return False
    if not budget.admits(total):
        budget.refuse(node.name, total)
        return False
    budget.spend(total)
    return True


def check_shape_probe(
    node: GraphNode,
    types: _Types,
    constants: Mapping[str, np.ndarray],
    budget: FoldBudget,
    shape_positions: Sequence[int],
) -> tuple[tuple[int, ...], np.dtype[Any]] | None:
    """How to learn the output shape that onnx left unknown for ``node`` (all input shapes known).

    Returns the output's (shape, dtype) for ``ConstantOfShape``, ``Expand``, ``Tile`` and ``Range``, computed
    from their constant inputs without computing the output; None when running the node's reference on its
    constants and zeros (for the other inputs) may be used instead.  Raises ``ModelError`` for a shape-deciding
    input (``shape_positions``) that is not a constant (zeros would give a wrong shape), for the other
    :data:`GROWING_OPS` (their output may be anything), and for zeros over :data:`FOLD_TENSOR_LIMIT_BYTES`:
    nothing big is materialized to learn a shape.
    """
    for position in shape_positions:
        name = node.inputs[position] if position < len(node.inputs) else ""
        if name and name not in constants:
            raise ModelError(
                f"cannot infer the output shapes of {node.describe()}: they depend on the value of tensor {name!r}, "
                f"which is only computed when the model runs{budget.note()}"
            )
    if node.op_type in GROWING_OPS:
        found = _growing_output(node, types, constants)
        if found is None:
            raise ModelError(
                f"cannot infer the output shapes of {node.describe()} from its constant inputs (onnx's shape "
                "inference failed for them); check its shape inputs"
            )
        return found
    zeros = _known_bytes([name for name in node.inputs if name and name not in constants], types) or 0
    if zeros > FOLD_TENSOR_LIMIT_BYTES:
        raise ModelError(
            f"cannot infer the output shapes of {node.describe()} (onnx's shape inference could not) without "
            f"running it on {zeros} bytes of inputs, over the {FOLD_TENSOR_LIMIT_BYTES}-byte limit for that"
        )
    return None


def _growing_output(
    node: GraphNode, types: _Types, constants: Mapping[str, np.ndarray]
) -> tuple[tuple[int, ...], np.dtype[Any]] | None:
    """The output (shape, dtype) of ConstantOfShape/Expand/Tile/Range from their constant inputs, as their
    references compute it (Python ints: no overflow), or None (another op, or inputs it would reject)."""
    values = [constants.get(name) if name else None for name in node.inputs]
    try:
        if node.op_type == "ConstantOfShape" and values[0] is not None:
            fill = node.attrs.get("value")
            dims = tuple(int(d) for d in values[0].reshape(-1))
            dtype = np.asarray(fill).dtype if fill is not None else np.dtype(np.float32)
            return (dims, dtype) if all(d >= 0 for d in dims) else None
        source = types.get(node.inputs[0]) if node.inputs else None
        if source is None or not all(isinstance(d, int) for d in source[0]):
            return None
        if node.op_type == "Expand" and len(values) > 1 and values[1] is not None:
            return _broadcast(tuple(source[0]), tuple(int(d) for d in values[1].reshape(-1))), source[1]
        if node.op_type == "Tile" and len(values) > 1 and values[1] is not None:
            repeats = [int(r) for r in values[1].reshape(-1)]
            if len(repeats) != len(source[0]) or any(r < 0 for r in repeats):
                return None
            return tuple(d * r for d, r in zip(source[0], repeats)), source[1]
        if node.op_type == "Range" and len(values) == 3 and all(v is not None and v.size == 1 for v in values):
            first, last, step = (v.item() for v in values if v is not None)
            if step == 0:
                return None
            return (max(int(math.ceil((last - first) / step)), 0),), source[1]
    except (ValueError, OverflowError, TypeError, ZeroDivisionError):
        return None
    return None


def _broadcast(left: tuple[int, ...], right: tuple[int, ...]) -> tuple[int, ...]:
    """numpy's broadcast of two shapes, in Python ints (``ValueError`` if they do not broadcast)."""
    rank = max(len(left), len(right))
    padded = [(1,) * (rank - len(shape)) + shape for shape in (left, right)]
    dims = []
    for a, b in zip(*padded):
        if a != b and 1 not in (a, b):
            raise ValueError(f"shapes {left} and {right} do not broadcast")
        dims.append(b if a == 1 else a)
    if any(d < 0 for d in dims):
        raise ValueError(f"negative dimension in {right}")
    return tuple(dims)


# ---------------------------------------------------------------------------
# external data

_EXTERNAL_KEYS = ("location", "offset", "length", "checksum", "basepath")


def _external_int(info: dict[str, str], key: str, what: str) -> int | None:
    text = info.get(key)
    if text is None:
        return None
    if not re.fullmatch(r"[0-9]+", text):
        raise InvalidModelError(
            f"{what}: external data {key} {text!r} is not a non-negative decimal integer; the model is corrupt"
        )
    return int(text)


def _stored_bytes(tensor: onnx.TensorProto) -> int | None:
    """Bytes the tensor's data takes in raw form, or None when that is not a fixed multiple of its shape."""
    dtype = numpy_dtype_of(tensor.data_type)
    # None or kind "V": unknown or sub-byte element types, which the loader reports later
    if dtype is None or dtype.kind not in "biuf":
        return None
    if any(d < 0 for d in tensor.dims):
        raise InvalidModelError(f"tensor {tensor.name!r} has a negative dimension in its shape {list(tensor.dims)}")
    return tensor_bytes(tensor.dims, dtype)


def check_external_data(model: onnx.ModelProto, model_dir: str | None) -> bool:
    """Validate every external-data entry *before* anything is read; True if there is any.

    Raises :class:`InvalidModelError` for: unknown or repeated keys, a model given as bytes, a location that is
    empty, absolute, holds a NUL byte, leaves the model's folder (``..``, symlinks), names a folder, a missing
    file or anything but a regular file, an offset or length that is not a decimal integer, a range past the
    file's end, and a length that differs from what the tensor's shape and dtype need.
    """
    found = False
    for tensor in external_data_helper._get_all_tensors(model):  # noqa: SLF001 - the documented walker
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        found = True
        what = f"initializer {tensor.name!r}"
        info: dict[str, str] = {}
        for entry in tensor.external_data:
            if entry.key not in _EXTERNAL_KEYS:
                raise InvalidModelError(
                    f"{what}: unknown external data key {entry.key[:100]!r} (allowed: {', '.join(_EXTERNAL_KEYS)}); "
                    "the model is corrupt"
                )
            if entry.key in info:
                raise InvalidModelError(f"{what}: external data key {entry.key!r} is given twice; the model is corrupt")
            info[entry.key] = entry.value
        location = info.get("location", "")
        if model_dir is None:
            raise InvalidModelError(
                f"{what} keeps its data in an external file ({location!r}); "
                "load the model from its path so the file can be found"
            )
        if "\0" in location:
            raise InvalidModelError(
                f"{what} names external data {location!r}, a path with a NUL byte; the model is corrupt"
            )
        if not location or os.path.isabs(location) or os.path.splitdrive(location)[0]:
            raise InvalidModelError(
                f"{what} names external data {location!r}: only relative paths inside the model's folder are allowed"
            )
        try:
            root = os.path.realpath(model_dir)
            target = os.path.realpath(os.path.join(root, location))
        except (OSError, ValueError) as error:
            raise InvalidModelError(
                f"{what} names external data {location!r}, which is not a usable path: {error}"
            ) from None
        if os.path.commonpath([root, target]) != root:
            raise InvalidModelError(
                f"{what} names external data {location!r}, which leaves the model's "
                f"folder {model_dir!r}; move the data file next to the model"
            )
        if os.path.isdir(target):
            raise InvalidModelError(f"{what} names external data {location!r}, which is a folder, not a file")
        if not os.path.exists(target):
            raise InvalidModelError(f"{what}: external data file {location!r} is missing from {model_dir!r}")
        if not os.path.isfile(target):
            raise InvalidModelError(f"{what} names external data {location!r}, which is not a regular file")
        offset = _external_int(info, "offset", what)
        length = _external_int(info, "length", what)
        try:
            size = os.path.getsize(target)
        except OSError as error:
            raise InvalidModelError(f"{what}: cannot read external data file {location!r}: {error}") from None
        start = offset or 0
        if start > size or (length is not None and start + length > size):
            raise InvalidModelError(
                f"{what}: external data range (offset {offset}, length {length}) lies "
                f"outside {location!r} ({size} bytes); the file is truncated or the model is corrupt"
            )
        needed = _stored_bytes(tensor)
        stored = length if length is not None else size - start
        if needed is not None and stored != needed:
            raise InvalidModelError(
                f"{what}: its shape {list(tensor.dims)} needs {needed} bytes, but its external data "
                f"(offset {start}, length {stored}) in {location!r} holds {stored}; the model is corrupt"
            )
    return found
