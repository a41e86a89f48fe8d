"""PRelu: ``y = slope * x`` where ``x < 0``, else ``x``; ``slope`` broadcasts unidirectionally to ``x``.

Types: float16/32/64 from opset 6, also int32, int64, uint32, uint64 from opset 9.  On the device:
float32, float16 (computed in f32), int32 (products wrap, as C's do on two's complement hardware),
int64 exactly on ``vec2<u32>`` pairs, and unsigned types (never negative: ``y = x``).  float64 runs on
the CPU.  Before opset 7 the slope is accepted where numpy broadcasting reaches ``x``'s shape (size 1,
or the same shape, which is what those opsets describe).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import DeviceCaps, Operator, OpPlan, TensorInfo
from .._registry import register
from .._wgsl import INT64_WGSL, require_device_dtype
from .._wgsl_kernels import Operand, elementwise_plan

__all__ = ["PRelu"]

_DEVICE_DTYPES = ("float32", "float16", "int32", "uint32", "int64", "uint64")


@register
class PRelu(Operator):
    op_type = "PRelu"
    since_version = 1
    opset_changes = (9,)

    def _check(self, x: np.ndarray | TensorInfo, slope: np.ndarray | TensorInfo) -> None:
        if x.dtype != slope.dtype:
            raise UnsupportedOpError(f"PRelu (opset {self.opset}): X is {x.dtype.name} but slope is {slope.dtype.name}")
        allowed = "fiu" if self.opset >= 9 else "f"
        if x.dtype.kind not in allowed or x.dtype.name in ("int8", "int16", "uint8", "uint16"):
            raise UnsupportedOpError(f"PRelu (opset {self.opset}) does not support dtype {x.dtype.name}")
        try:
            shape = np.broadcast_shapes(tuple(x.shape), tuple(slope.shape))
        except ValueError:
            shape = None
        if shape != tuple(x.shape):
            raise ShapeError(
                f"PRelu (opset {self.opset}): slope of shape {tuple(slope.shape)} does not broadcast "
                f"unidirectionally to X of shape {tuple(x.shape)}"
            )

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, slope = inputs[0], inputs[1]
        assert x is not None and slope is not None
        self._check(x, slope)
        with np.errstate(all="ignore"):
            return [np.ascontiguousarray(np.where(x < 0, x * slope, x).astype(x.dtype))]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x, slope = inputs[0], inputs[1]
        assert x is not None and slope is not None
        self._check(x, slope)
        require_device_dtype("PRelu", x.dtype, _DEVICE_DTYPES)
        pair = x.dtype.itemsize == 8
        if x.dtype.kind == "u":
            expression = "x0"  # unsigned values are never negative
        elif pair:
            expression = "select(x0, mul64(x0, x1), is_negative64(x0))"
        elif x.dtype.kind == "i":
            expression = "select(x0, x0 * x1, x0 < 0)"
        else:
            expression = "select(x0, x0 * x1, x0 < 0.0)"

        def function(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            return self.reference([a, b], attrs, outputs)[0]

        operands = [Operand(0, x, int64_pair=pair), Operand(1, slope, int64_pair=pair)]
        return elementwise_plan(
            "PRelu",
            operands,
            outputs,
            expression,
            caps,
            function,
            inputs,
            helpers=INT64_WGSL if pair else "",
            pair_output=pair,
        )
