"""SwiGLU-28: ``Y = A * sigmoid(alpha * A) * B`` for same-shaped A (gate) and B (value), no broadcasting.

The device kernel is elementwise (float32, and float16 read and written packed, computed in float32).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError

from .._kernel import DeviceCaps, Operator, OpPlan, TensorInfo
from .._registry import register
from .._wgsl import require_device_dtype, wgsl_float
from .._wgsl_kernels import Operand, elementwise_plan
from .unary import SIGMOID_WGSL

__all__ = ["SwiGLU"]


def _swiglu(a: np.ndarray, b: np.ndarray, alpha: float) -> np.ndarray:
    wide = a.astype(np.float64)
    z = alpha * wide
    e = np.exp(-np.abs(z))
    sigmoid = np.where(z >= 0, 1 / (1 + e), e / (1 + e))
    return (wide * sigmoid * b.astype(np.float64)).astype(a.dtype)


@register
class SwiGLU(Operator):
    """SwiGLU-28."""

    op_type = "SwiGLU"
    since_version = 28

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        if a.shape != b.shape:
            raise ShapeError(f"SwiGLU: A {a.shape} and B {b.shape} must have the same shape")
        return [_swiglu(a, b, float(attrs.get("alpha", 1.0)))]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        if a.shape != b.shape:
            raise ShapeError(f"SwiGLU: A {a.shape} and B {b.shape} must have the same shape")
        require_device_dtype("SwiGLU", a.dtype, ("float32", "float16"))
        alpha = float(attrs.get("alpha", 1.0))
        return elementwise_plan(
            "SwiGLU",
            [Operand(0, a), Operand(1, b)],
            outputs,
            f"x0 * sigmoid_f32({wgsl_float(alpha)} * x0) * x1",
            caps,
            lambda x, y: _swiglu(x, y, alpha),
            inputs,
            helpers=SIGMOID_WGSL,
        )
