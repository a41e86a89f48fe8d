"""MeanVarianceNormalization-9/13: ``(X - mean) / (sqrt(variance) + 1e-9)`` over ``axes`` (default
``[0, 2, 3]``), as the ONNX function body computes it (its epsilon is added to the standard deviation).

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

__all__ = ["MeanVarianceNormalization"]

#: the ONNX function body's epsilon
_EPSILON = 1e-9


def _axes(shape: Sequence[int], attrs: Mapping[str, Any]) -> tuple[int, ...]:
    rank = len(shape)
    axes = [int(a) for a in attrs.get("axes", (0, 2, 3))]
    for a in axes:
        if a < -rank or a >= rank:
            raise UnsupportedOpError(f"MeanVarianceNormalization: axis {a} out of range for rank {rank}")
    return tuple(sorted({a % rank for a in axes}))


@register
class MeanVarianceNormalization(Operator):
    """MeanVarianceNormalization-9/13."""

    op_type = "MeanVarianceNormalization"
    since_version = 9

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        axes = _axes(x.shape, attrs)
        if x.size == 0:
            return [np.zeros(x.shape, x.dtype)]
        wide = x.astype(np.float64)
        mean = np.mean(wide, axis=axes, keepdims=True)
        variance = np.mean((wide - mean) ** 2, axis=axes, keepdims=True)
        return [((wide - mean) / (np.sqrt(variance) + _EPSILON)).astype(x.dtype)]

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
        require_row_norm_dtypes("MeanVarianceNormalization", list(inputs) + list(outputs), caps)
        axes = _axes(x.shape, attrs)
        spec = RowNorm("std", epsilon=_EPSILON)
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        return row_norm_plan("MeanVarianceNormalization", spec, axes, inputs, outputs, caps, compute)
