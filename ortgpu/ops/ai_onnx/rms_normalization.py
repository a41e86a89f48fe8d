"""RMSNormalization-23: ``Y = X / sqrt(mean(X^2) + epsilon) * scale`` over the axes from ``axis`` (default -1)
on; ``scale`` broadcasts to X.  ``stash_type`` 1 (the default) computes the first stage in float32.

The device kernel is the shared normalisation row kernel (:mod:`._row_norm`), in float32;
float16 tensors are read and written as such where the device has ``shader-f16``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import DeviceCaps, Operator, OpPlan, TensorInfo
from .._registry import register
from .._row_norm import RowNorm, require_row_norm_dtypes, row_norm_plan
from .._tiling import broadcast_strides, index_function

__all__ = ["RMSNormalization", "check_norm_scale", "norm_axis", "wide_mean_square"]


def norm_axis(op_type: str, shape: Sequence[int], attrs: Mapping[str, Any]) -> int:
    """The first normalised axis (``axis``, default -1) of an RMS-style normalisation, checked."""
    rank = len(shape)
    axis = int(attrs.get("axis", -1))
    if axis < -rank or axis >= rank:
        raise UnsupportedOpError(f"{op_type}: axis {axis} out of range for rank {rank}")
    return axis % rank


def check_norm_scale(op_type: str, scale_shape: Sequence[int], x_shape: Sequence[int]) -> None:
    """ShapeError unless the scale broadcasts to X's shape."""
    try:
        if np.broadcast_shapes(tuple(scale_shape), tuple(x_shape)) != tuple(x_shape):
            raise ValueError
    except ValueError:
        raise ShapeError(
            f"{op_type}: scale of shape {tuple(scale_shape)} does not broadcast to X's {tuple(x_shape)}"
        ) from None


def wide_mean_square(x: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """X in float64 and the mean of its squares over the axes from ``axis`` on (kept as size-1 axes; zeros for an
    empty X, whose mean is undefined but whose normalisation is empty anyway)."""
    axes = tuple(range(axis, x.ndim))
    wide = x.astype(np.float64)
    if x.size:
        return wide, np.mean(wide * wide, axis=axes, keepdims=True)
    return wide, np.zeros([1 if a in axes else d for a, d in enumerate(x.shape)])


@register
class RMSNormalization(Operator):
    """RMSNormalization-23."""

    op_type = "RMSNormalization"
    since_version = 23

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, scale = inputs[0], inputs[1]
        assert x is not None and scale is not None
        axis = norm_axis(self.op_type, x.shape, attrs)
        check_norm_scale(self.op_type, scale.shape, x.shape)
        epsilon = float(attrs.get("epsilon", 1e-5))
        wide, mean_square = wide_mean_square(x, axis)
        # rounded to X's type (the definition's cast), or to the scale's (Y's) where that is the narrower: a fused
        # graph that casts the normalised value to Y's type before its scale (as the kernel does)
        narrow = np.float16 if np.float16 in (x.dtype, scale.dtype) else x.dtype
        normalized = (wide / np.sqrt(mean_square + epsilon)).astype(narrow)
        wide_enough = np.promote_types(normalized.dtype, np.float32)  # a float16 product is exact in float32
        return [(normalized.astype(wide_enough) * scale).astype(scale.dtype)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x, scale = inputs[0], inputs[1]
        assert x is not None and scale is not None
        require_row_norm_dtypes("RMSNormalization", list(inputs) + list(outputs), caps)
        axis = norm_axis(self.op_type, x.shape, attrs)
        check_norm_scale(self.op_type, scale.shape, x.shape)
        index = index_function("scale_at", x.shape, broadcast_strides(scale.shape, x.shape))
        spec = RowNorm(
            "mean_square",
            epsilon=float(attrs.get("epsilon", 1e-5)),
            scale_input=1,
            scale_index="return scale_at(at);",
            helpers=index,
            round_normalized=True,
        )
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        return row_norm_plan("RMSNormalization", spec, range(axis, len(x.shape)), inputs, outputs, caps, compute)
