"""LpNormalization-1/22: ``x / ||x||_p`` along ``axis`` (default -1), ``p`` 1 or 2 (default 2); a zero norm
gives a zero output (opset 22 defines it so; earlier it was undefined).

The device kernel is the shared normalisation row kernel (:mod:`._row_norm`), in float32;
float16 tensors are read and written as such where the device has ``shader-f16``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._kernel import DeviceCaps, Operator, OpPlan, TensorInfo
from .._registry import register
from .._row_norm import RowNorm, require_row_norm_dtypes, row_norm_plan

__all__ = ["LpNormalization"]


def _settings(rank: int, attrs: Mapping[str, Any]) -> tuple[int, int]:
    axis = int(attrs.get("axis", -1))
    if axis < -rank or axis >= rank:
        raise UnsupportedOpError(f"LpNormalization: axis {axis} out of range for rank {rank}")
    p = int(attrs.get("p", 2))
    if p not in (1, 2):
        raise UnsupportedOpError(f"LpNormalization: p must be 1 or 2, got {p}")
    return axis % rank, p


@register
class LpNormalization(Operator):
    """LpNormalization-1/22."""

    op_type = "LpNormalization"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        axis, p = _settings(x.ndim, attrs)
        wide = x.astype(np.float64)
        if p == 1:
            norm = np.sum(np.abs(wide), axis=axis, keepdims=True)
        else:
            norm = np.sqrt(np.sum(wide * wide, axis=axis, keepdims=True))
        y = np.where(norm > 0, wide / np.where(norm > 0, norm, 1.0), 0.0)
        return [y.astype(x.dtype)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x = inputs[0]
        assert x is not None
        require_row_norm_dtypes("LpNormalization", list(inputs) + list(outputs), caps)
        axis, p = _settings(len(x.shape), attrs)
        spec = RowNorm("l1" if p == 1 else "l2")
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        return row_norm_plan("LpNormalization", spec, (axis,), inputs, outputs, caps, compute)
