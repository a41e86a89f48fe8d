"""InstanceNormalization-1/6/22: ``y = scale * (x - mean) / sqrt(variance + epsilon) + B`` with mean and
variance over the spatial axes (2 on) of each instance and channel; ``scale`` and ``B`` are ``[C]``.

The device kernel is the shared normalisation row kernel (:mod:`._row_norm`), in float32;
float16 tensors are read and written as such where the device has ``shader-f16``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError

from ..._types import element_count
from .._kernel import DeviceCaps, Operator, OpPlan, TensorInfo
from .._registry import register
from .._row_norm import RowNorm, require_row_norm_dtypes, row_norm_plan

__all__ = ["InstanceNormalization"]


def _check(x_shape: Sequence[int], scale_shape: Sequence[int], bias_shape: Sequence[int]) -> int:
    """The channel count, after checking the shapes."""
    if len(x_shape) < 2:
        raise ShapeError(f"InstanceNormalization: input must have rank 2 or more, got shape {tuple(x_shape)}")
    channels = int(x_shape[1])
    for name, shape in (("scale", scale_shape), ("B", bias_shape)):
        if tuple(shape) != (channels,):
            raise ShapeError(f"InstanceNormalization: {name} must have shape ({channels},), got {tuple(shape)}")
    return channels


@register
class InstanceNormalization(Operator):
    """InstanceNormalization-1/6/22."""

    op_type = "InstanceNormalization"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, scale, bias = inputs[0], inputs[1], inputs[2]
        assert x is not None and scale is not None and bias is not None
        channels = _check(x.shape, scale.shape, bias.shape)
        if x.size == 0:
            return [np.zeros(x.shape, x.dtype)]
        epsilon = float(attrs.get("epsilon", 1e-5))
        axes = tuple(range(2, x.ndim))
        view = (1, channels) + (1,) * (x.ndim - 2)
        wide = x.astype(np.float64)
        mean = np.mean(wide, axis=axes, keepdims=True)
        variance = np.mean((wide - mean) ** 2, axis=axes, keepdims=True)
        y = (wide - mean) / np.sqrt(variance + epsilon) * scale.reshape(view) + bias.reshape(view)
        return [y.astype(x.dtype)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x, scale, bias = inputs[0], inputs[1], inputs[2]
        assert x is not None and scale is not None and bias is not None
        require_row_norm_dtypes("InstanceNormalization", list(inputs) + list(outputs), caps)
        channels = _check(x.shape, scale.shape, bias.shape)
        spatial = element_count(x.shape[2:])
        channel = f"return (at / {spatial}u) % {channels}u;"
        spec = RowNorm(
            "variance",
            epsilon=float(attrs.get("epsilon", 1e-5)),
            scale_input=1,
            scale_index=channel,
            bias_input=2,
            bias_index=channel,
        )
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        return row_norm_plan("InstanceNormalization", spec, range(2, len(x.shape)), inputs, outputs, caps, compute)
