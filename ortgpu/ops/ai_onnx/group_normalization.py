"""GroupNormalization-18/21: the channels of ``X [N, C, ...]`` split into ``num_groups`` groups, each instance's
group normalised as a whole: ``y = scale * (x - mean) / sqrt(variance + epsilon) + bias``.

Opset 18 has one ``scale``/``bias`` entry per group (``[num_groups]``); opset 21 one per channel (``[C]``) and a
``stash_type`` (the statistics in float32 by default).  The device kernel is the shared normalisation row kernel
(:mod:`._row_norm`) over the ``[N, num_groups, C / num_groups * spatial]`` view, in float32;
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

__all__ = ["GroupNormalization"]


class _GroupNormalizationBase(Operator):
    op_type = "GroupNormalization"
    #: True from opset 21: scale and bias per channel
    per_channel = True

    def _check(self, x_shape: Sequence[int], scale_shape: Sequence[int], bias_shape: Sequence[int], groups: int) -> int:
        if len(x_shape) < 2:
            raise ShapeError(f"GroupNormalization: input must have rank 2 or more, got shape {tuple(x_shape)}")
        channels = int(x_shape[1])
        if groups <= 0 or channels % groups:
            raise ShapeError(f"GroupNormalization: num_groups {groups} must divide the {channels} channels")
        want = channels if self.per_channel else groups
        for name, shape in (("scale", scale_shape), ("bias", bias_shape)):
            if tuple(shape) != (want,):
                raise ShapeError(
                    f"GroupNormalization: {name} must have shape ({want},) at opset {self.opset}, got {tuple(shape)}"
                )
        return channels

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, scale, bias = inputs[0], inputs[1], inputs[2]
        assert x is not None and scale is not None and bias is not None
        groups = int(attrs.get("num_groups", 0))
        channels = self._check(x.shape, scale.shape, bias.shape, groups)
        if x.size == 0:
            return [np.zeros(x.shape, x.dtype)]
        epsilon = float(attrs.get("epsilon", 1e-5))
        n = x.shape[0]
        grouped = x.astype(np.float64).reshape(n, groups, -1)
        mean = np.mean(grouped, axis=2, keepdims=True)
        variance = np.mean((grouped - mean) ** 2, axis=2, keepdims=True)
        normalized = ((grouped - mean) / np.sqrt(variance + epsilon)).reshape(x.shape)
        view = (1, channels) + (1,) * (x.ndim - 2)
        if self.per_channel:
            s, b = scale.astype(np.float64), bias.astype(np.float64)
        else:
            s = np.repeat(scale.astype(np.float64), channels // groups)
            b = np.repeat(bias.astype(np.float64), channels // groups)
        return [(normalized * s.reshape(view) + b.reshape(view)).astype(x.dtype)]

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
        require_row_norm_dtypes("GroupNormalization", list(inputs) + list(outputs), caps)
        groups = int(attrs.get("num_groups", 0))
        channels = self._check(x.shape, scale.shape, bias.shape, groups)
        spatial = element_count(x.shape[2:])
        if self.per_channel:
            index = f"return (at / {spatial}u) % {channels}u;"
        else:
            index = f"return (at / {spatial * (channels // groups)}u) % {groups}u;"
        spec = RowNorm(
            "variance",
            epsilon=float(attrs.get("epsilon", 1e-5)),
            scale_input=1,
            scale_index=index,
            bias_input=2,
            bias_index=index,
        )
        shape = (x.shape[0], groups, element_count(x.shape) // max(x.shape[0] * groups, 1))
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        return row_norm_plan("GroupNormalization", spec, (2,), inputs, outputs, caps, compute, shape=shape)


@register
class GroupNormalization18(_GroupNormalizationBase):
    """GroupNormalization-18: scale and bias per group."""

    since_version = 18
    per_channel = False


@register
class GroupNormalization(_GroupNormalizationBase):
    """GroupNormalization-21: scale and bias per channel."""

    since_version = 21
