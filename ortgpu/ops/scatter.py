"""ScatterElements, its deprecated alias Scatter (opsets 9-10), and ScatterND: CPU references.

``reduction`` (ScatterElements/ScatterND from opset 16; ``max``/``min`` from 18)
combines each update with what is already at its destination, in index order
(numpy's unbuffered ``ufunc.at``), so duplicate indices accumulate as ONNX says.
With ``none`` and duplicate indices ONNX leaves the result undefined; here the
last update wins, as in onnxruntime.  Out-of-range indices are a typed error.

These run on the CPU: a scatter with duplicate indices needs atomics (or an
ordered pass) that WGSL offers only for 32-bit integers.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import InvalidArgumentError, ShapeError, UnsupportedOpError

from ._kernel import Operator, TensorInfo
from ._registry import register

__all__ = ["ScatterElements", "Scatter", "ScatterND"]

_UFUNCS: dict[str, np.ufunc] = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _reduction(op_type: str, attrs: Mapping[str, Any], opset: int) -> str:
    reduction = str(attrs.get("reduction", "none"))
    allowed = (
        ("none",) if opset < 16 else ("none", "add", "mul") if opset < 18 else ("none", "add", "mul", "max", "min")
    )
    if reduction not in allowed:
        raise UnsupportedOpError(
            f"{op_type} (opset {opset}): reduction {reduction!r} is not one of {', '.join(allowed)}"
        )
    return reduction


def _normalised(indices: np.ndarray, size: int | np.ndarray, op_type: str) -> np.ndarray:
    if indices.dtype not in (np.int32, np.int64):
        raise UnsupportedOpError(f"{op_type}: indices of dtype {indices.dtype} (int32 or int64 expected)")
    wide = indices.astype(np.int64)
    bad = (wide < -size) | (wide >= size)
    if np.any(bad):
        raise InvalidArgumentError(f"{op_type}: an index is out of range (the first: {int(wide[bad].flat[0])})")
    return np.where(wide < 0, wide + size, wide)


def _apply(output: np.ndarray, where: tuple[np.ndarray, ...], updates: np.ndarray, reduction: str) -> None:
    if reduction == "none":
        # Fancy assignment keeps the last of duplicate destinations.
        output[where] = updates
    elif output.dtype == np.bool_:
        raise UnsupportedOpError(f"scatter reduction {reduction!r} on bool tensors is not supported")
    else:
        _UFUNCS[reduction].at(output, where, updates)


def scatter_elements(
    data: np.ndarray, indices: np.ndarray, updates: np.ndarray, axis: int, reduction: str, op_type: str
) -> np.ndarray:
    rank = data.ndim
    if not -rank <= axis < rank:
        raise UnsupportedOpError(f"{op_type}: axis {axis} is out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis
    if indices.shape != updates.shape or indices.ndim != rank:
        raise ShapeError(
            f"{op_type}: indices {indices.shape} and updates {updates.shape} must have one shape of the data's rank"
        )
    if any(n > s for d, (n, s) in enumerate(zip(indices.shape, data.shape)) if d != axis):
        raise ShapeError(f"{op_type}: indices {indices.shape} exceed the data {data.shape} off the axis")
    index = _normalised(indices, data.shape[axis], op_type)
    where: list[np.ndarray] = list(np.indices(indices.shape, sparse=True))
    where[axis] = index
    output = np.array(data, order="C", copy=True)
    _apply(output, tuple(np.broadcast_arrays(*where)), updates, reduction)
    return output


@register
class ScatterElements(Operator):
    op_type = "ScatterElements"
    since_version = 11

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        data, indices, updates = inputs[0], inputs[1], inputs[2]
        assert data is not None and indices is not None and updates is not None
        reduction = _reduction(self.op_type, attrs, self.opset)
        return [scatter_elements(data, indices, updates, int(attrs.get("axis", 0)), reduction, self.op_type)]


@register
class Scatter(ScatterElements):
    """Scatter (opsets 9 and 10): ScatterElements without reductions, deprecated in opset 11."""

    op_type = "Scatter"
    since_version = 9

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        data, indices, updates = inputs[0], inputs[1], inputs[2]
        assert data is not None and indices is not None and updates is not None
        return [scatter_elements(data, indices, updates, int(attrs.get("axis", 0)), "none", self.op_type)]


@register
class ScatterND(Operator):
    op_type = "ScatterND"
    since_version = 11

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        data, indices, updates = inputs[0], inputs[1], inputs[2]
        assert data is not None and indices is not None and updates is not None
        reduction = _reduction(self.op_type, attrs, self.opset)
        if indices.ndim < 1:
            raise ShapeError("ScatterND: indices must have rank >= 1")
        depth = indices.shape[-1]
        if depth > data.ndim:
            raise ShapeError(f"ScatterND: index tuples of length {depth} for data of rank {data.ndim}")
        expected = indices.shape[:-1] + data.shape[depth:]
        if updates.shape != expected:
            raise ShapeError(f"ScatterND: updates have shape {updates.shape}, expected {expected}")
        tuples = indices.reshape(-1, depth)
        bounds = np.array(data.shape[:depth], dtype=np.int64)
        tuples = _normalised(tuples, bounds, self.op_type)
        where = tuple(tuples[:, d] for d in range(depth))
        output = np.array(data, order="C", copy=True)
        _apply(output, where, updates.reshape((-1,) + data.shape[depth:]), reduction)
        return [output]
