"""Compress: the slices along ``axis`` (or the elements of the flattened input) where ``condition`` is true (CPU).

The output size depends on the condition's values, a shape-deciding input: the
node is planned only where the condition is known.  A condition shorter than
the axis selects among its first entries (the spec's rule); a longer one whose
extra entries are true is a ShapeError.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import Operator, TensorInfo
from .._registry import register

__all__ = ["Compress"]


@register
class Compress(Operator):
    op_type = "Compress"
    since_version = 9

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, condition = inputs[0], inputs[1]
        assert x is not None and condition is not None
        if condition.ndim != 1:
            raise ShapeError(f"Compress: the condition must be 1-D, got shape {condition.shape}")
        selected = condition.astype(np.bool_)
        axis = attrs.get("axis")
        if axis is None:
            x = x.reshape(-1)
            axis = 0
        axis = int(axis)
        if not -x.ndim <= axis < x.ndim:
            raise UnsupportedOpError(f"Compress: axis {axis} is out of range for rank {x.ndim}")
        axis = axis + x.ndim if axis < 0 else axis
        size = x.shape[axis]
        if selected.size > size:
            if selected[size:].any():
                raise ShapeError(f"Compress: the condition selects entries beyond the axis's {size}")
            selected = selected[:size]
        return [np.array(np.compress(selected, x, axis=axis), order="C")]
