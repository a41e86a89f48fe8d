"""Where: ``output = condition ? X : Y`` with numpy broadcasting over all three.

On the device for every dtype of 1, 2, 4 or 8 bytes: the kernel copies the
chosen element bit for bit (int64 included), so it never computes in the
data's dtype.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._kernel import Binding, DeviceCaps, Operator, OpPlan, TensorInfo, reference_twin
from .._registry import register
from .._wgsl import broadcast_index_function
from .._wgsl_kernels import gather_kernel

__all__ = ["Where"]


@register
class Where(Operator):
    op_type = "Where"
    since_version = 9

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        condition, x, y = inputs[0], inputs[1], inputs[2]
        assert condition is not None and x is not None and y is not None
        if condition.dtype != np.bool_:
            raise UnsupportedOpError(
                f"Where (opset {self.opset}): the condition must be bool, not {condition.dtype.name}"
            )
        if x.dtype != y.dtype:
            raise UnsupportedOpError(
                f"Where (opset {self.opset}): X and Y have different dtypes {x.dtype} and {y.dtype}"
            )
        return [np.where(condition, x, y)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        condition, x, y = inputs[0], inputs[1], inputs[2]
        assert condition is not None and x is not None and y is not None
        out = outputs[0]
        if out.size == 0:
            return OpPlan()
        source = (
            broadcast_index_function("index_condition", condition.shape, out.shape)
            + broadcast_index_function("index_x", x.shape, out.shape)
            + broadcast_index_function("index_y", y.shape, out.shape)
            + "fn source(j: u32) -> vec2<u32> {\n"
            "  if (aux0(index_condition(j))) { return vec2<u32>(0u, index_x(j)); }\n"
            "  return vec2<u32>(1u, index_y(j));\n"
            "}\n"
        )
        bindings = [Binding("input", 1), Binding("input", 2), Binding("input", 0), Binding("output", 0)]

        def function(xs: np.ndarray, ys: np.ndarray, cs: np.ndarray) -> np.ndarray:
            return np.where(cs, xs, ys)

        kernel = gather_kernel(
            "Where",
            [(bindings[0], x), (bindings[1], y)],
            [(bindings[2], condition)],
            out,
            source,
            caps,
            reference_twin(function, bindings, inputs, outputs),
        )
        return OpPlan(kernels=(kernel,))
