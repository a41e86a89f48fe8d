"""Upsample-7/9 (deprecated by Resize): nearest or linear, asymmetric coordinates, scales >= 1.

The resampling engine and the device kernel are Resize's (:mod:`.resize`, :mod:`._resize_wgsl`); Upsample-7
takes ``scales`` as an attribute, Upsample-9 as input 1.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError

from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register
from ._resize_reference import ResizeConfig, resize_config, resize_reference

__all__ = ["Upsample"]


@register
class Upsample(Operator):
    """Upsample-7 (scales attribute) and Upsample-9 (scales input)."""

    op_type = "Upsample"
    since_version = 7
    opset_changes = (9,)

    def _config(self, x_shape: Sequence[int], attrs: Mapping[str, Any], scales: np.ndarray | None) -> ResizeConfig:
        if self.opset < 9:
            if attrs.get("scales") is None:
                raise ShapeError("Upsample: the scales attribute is required")
            scales = np.asarray(attrs["scales"], dtype=np.float32)
        if scales is None:
            raise ShapeError("Upsample: the scales input is required")
        if np.any(np.asarray(scales) < 1):
            raise ShapeError(f"Upsample: scales must be >= 1, got {np.asarray(scales).tolist()}")
        return resize_config("Upsample", self.opset, x_shape, attrs, None, scales, None)

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        scales = inputs[1] if len(inputs) > 1 else None
        return [resize_reference(x, self._config(x.shape, attrs, scales))]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        from ._resize_wgsl import resize_plan

        x = inputs[0]
        assert x is not None
        scales = None
        if self.opset >= 9:
            if 1 not in constants:
                raise NotOnDevice("Upsample: scales must be a constant for the WebGPU kernel")
            scales = np.asarray(constants[1])
        return resize_plan(self._config(x.shape, attrs, scales), x, outputs, inputs, caps)
