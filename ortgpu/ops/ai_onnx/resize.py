"""Resize (opset 10, 11, 13, 18, 19): the operator over the shared resampling engine (:mod:`._resize_reference`,
which Upsample uses too) and its WGSL kernel (:mod:`._resize_wgsl`)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register
from ._resize_reference import ResizeConfig, resize_config, resize_reference
from ._resize_wgsl import resize_plan

__all__ = ["Resize"]


def _present(inputs: Sequence[Any], index: int) -> Any:
    return inputs[index] if len(inputs) > index else None


@register
class Resize(Operator):
    """Resize-10/11/13/18/19 (one class: the differences are attributes and input positions)."""

    op_type = "Resize"
    since_version = 10
    opset_changes = (11, 13, 18, 19)

    def _config(
        self, x_shape: Sequence[int], attrs: Mapping[str, Any], values: Sequence[np.ndarray | None]
    ) -> ResizeConfig:
        if self.opset < 11:
            roi, scales, sizes = None, _present(values, 1), None
        else:
            roi, scales, sizes = _present(values, 1), _present(values, 2), _present(values, 3)
        return resize_config("Resize", self.opset, x_shape, attrs, roi, scales, sizes)

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        return [resize_reference(x, self._config(x.shape, attrs, inputs))]

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
        values: list[np.ndarray | None] = []
        for i in range(len(inputs)):
            if i == 0 or inputs[i] is None:
                values.append(None)
            elif i in constants:
                values.append(np.asarray(constants[i]))
            else:
                raise NotOnDevice("Resize: scales, sizes and roi must be constants for the WebGPU kernel")
        config = self._config(x.shape, attrs, values)
        return resize_plan(config, x, outputs, inputs, caps)
