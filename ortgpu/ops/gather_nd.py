"""GatherND: gather slices of ``data`` addressed by the index tuples in the last axis of ``indices`` (CPU).

``batch_dims`` (opset 12) leading axes are shared by data and indices: each
batch gathers from its own slice.  Negative indices count from the end; an
index out of range is a typed error, as in onnxruntime.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import InvalidArgumentError, ShapeError, UnsupportedOpError

from .._limits import element_count
from ._kernel import Operator, TensorInfo
from ._registry import register

__all__ = ["GatherND"]


def gather_nd(data: np.ndarray, indices: np.ndarray, batch_dims: int) -> np.ndarray:
    if indices.dtype != np.int64 and indices.dtype != np.int32:
        raise UnsupportedOpError(f"GatherND: indices of dtype {indices.dtype} (int64 expected)")
    b = batch_dims
    if indices.ndim < 1 or not 0 <= b < min(data.ndim, indices.ndim):
        raise ShapeError(f"GatherND: batch_dims {b} for data rank {data.ndim} and indices rank {indices.ndim}")
    if data.shape[:b] != indices.shape[:b]:
        raise ShapeError(f"GatherND: batch dims differ: data {data.shape[:b]}, indices {indices.shape[:b]}")
    depth = indices.shape[-1]
    if b + depth > data.ndim:
        raise ShapeError(f"GatherND: index tuples of length {depth} with batch_dims {b} exceed data rank {data.ndim}")
    batches = element_count(data.shape[:b])
    rest = data.shape[b + depth :]
    out_shape = indices.shape[:-1] + rest
    flat_data = data.reshape((batches,) + data.shape[b:])
    tuples = indices.reshape(batches, -1, depth).astype(np.int64)
    bounds = np.array(data.shape[b : b + depth], dtype=np.int64)
    bad = (tuples < -bounds) | (tuples >= bounds)
    if bad.any():
        raise InvalidArgumentError(f"GatherND: an index is out of range (the first: {int(tuples[bad].flat[0])})")
    tuples = np.where(tuples < 0, tuples + bounds, tuples)
    batch_index = np.arange(batches).reshape(batches, 1)
    picked = flat_data[(batch_index,) + tuple(tuples[..., d] for d in range(depth))]
    return np.array(picked.reshape(out_shape), order="C")


@register
class GatherND(Operator):
    op_type = "GatherND"
    since_version = 11

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        data, indices = inputs[0], inputs[1]
        assert data is not None and indices is not None
        return [gather_nd(data, indices, int(attrs.get("batch_dims", 0)))]
