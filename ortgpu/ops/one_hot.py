"""OneHot: ``values[1]`` where an index equals the position along the new axis, ``values[0]`` elsewhere (CPU).

Indices may be negative (counted from ``depth``); indices outside
``[-depth, depth - 1]`` give a row of ``values[0]`` (the spec's rule).  ``depth``
is a shape-deciding input (its value sizes the output), so the node is planned
only where it is known.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ._kernel import Operator, TensorInfo
from ._registry import register

__all__ = ["OneHot"]


@register
class OneHot(Operator):
    op_type = "OneHot"
    since_version = 9

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        indices, depth_value, values = inputs[0], inputs[1], inputs[2]
        assert indices is not None and depth_value is not None and values is not None
        if depth_value.size != 1:
            raise ShapeError(f"OneHot: depth must hold one value, got shape {depth_value.shape}")
        if values.size != 2:
            raise ShapeError(f"OneHot: values must hold [off, on], got shape {values.shape}")
        if indices.dtype.kind not in "iuf" or depth_value.dtype.kind not in "iuf":
            raise UnsupportedOpError(f"OneHot: indices of dtype {indices.dtype} / depth {depth_value.dtype}")
        # A float depth is truncated toward zero, as a C cast does.
        depth = int(np.asarray(depth_value).reshape(-1)[0])
        if depth < 1:
            raise ShapeError(f"OneHot: depth {depth} must be positive")
        rank = indices.ndim
        axis = int(attrs.get("axis", -1))
        if not -rank - 1 <= axis <= rank:
            raise UnsupportedOpError(f"OneHot: axis {axis} is out of range for indices of rank {rank}")
        axis = axis + rank + 1 if axis < 0 else axis
        index = np.trunc(indices).astype(np.int64) if indices.dtype.kind == "f" else indices.astype(np.int64)
        index = np.where(index < 0, index + depth, index)
        positions = np.arange(depth, dtype=np.int64).reshape((depth,) + (1,) * (rank - axis))
        hot = np.expand_dims(index, axis) == positions
        flat = values.reshape(-1)
        return [np.array(np.where(hot, flat[1], flat[0]), dtype=values.dtype, order="C")]
