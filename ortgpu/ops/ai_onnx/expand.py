"""Expand: broadcast the input to ``shape`` (numpy's rules in both directions, opset 8+).

A bit-exact copy for any dtype.  The plan reads the broadcast from the output
shape, so a ``shape`` computed at run time needs nothing more.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._kernel import Binding, DeviceCaps, Operator, OpPlan, TensorInfo, reference_twin
from .._registry import register
from .._wgsl import broadcast_index_function
from .._wgsl_kernels import gather_kernel

__all__ = ["Expand"]


@register
class Expand(Operator):
    op_type = "Expand"
    since_version = 8

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        data, shape = inputs[0], inputs[1]
        assert data is not None and shape is not None
        requested = tuple(int(d) for d in np.asarray(shape).reshape(-1))
        try:
            target = np.broadcast_shapes(data.shape, requested)
        except ValueError:
            raise UnsupportedOpError(
                f"Expand (opset {self.opset}): shape {data.shape} does not broadcast to {requested}"
            ) from None
        return [np.array(np.broadcast_to(data, target), order="C")]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        data = inputs[0]
        assert data is not None
        out = outputs[0]
        if out.size == 0:
            return OpPlan()
        if out.size == data.size:
            return OpPlan(alias={0: 0})  # only size-1 axes were added: same bytes
        source = broadcast_index_function("index_data", data.shape, out.shape) + (
            "fn source(j: u32) -> vec2<u32> { return vec2<u32>(0u, index_data(j)); }\n"
        )
        bindings = [Binding("input", 0), Binding("output", 0)]

        def function(array: np.ndarray) -> np.ndarray:
            return np.broadcast_to(array, out.shape)

        kernel = gather_kernel(
            "Expand", [(bindings[0], data)], [], out, source, caps, reference_twin(function, bindings, inputs, outputs)
        )
        return OpPlan(kernels=(kernel,))
