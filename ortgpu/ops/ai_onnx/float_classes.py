"""IsNaN (opset 9) and IsInf (opset 10, ``detect_positive``/``detect_negative``): bool outputs.

The device kernels classify the IEEE bits (not float comparisons, which a
driver may fold away for NaN): float32, float16 (read as f32, which keeps NaN
and infinities), and float64 read as ``vec2<u32>(low, high)`` words.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._kernel import DeviceCaps, Operator, OpPlan, TensorInfo
from .._registry import register
from .._wgsl import require_device_dtype
from .._wgsl_kernels import Operand, elementwise_plan

__all__ = ["IsNaN", "IsInf"]

_FLOATS = ("float32", "float16", "float64")


def _check_float(op_type: str, opset: int, x: np.ndarray) -> None:
    if x.dtype.kind != "f":
        raise UnsupportedOpError(f"{op_type} (opset {opset}) takes floats, not {x.dtype.name}")


def _magnitude(dtype: np.dtype[Any]) -> tuple[str, str, str]:
    """WGSL for (the exponent-and-high-fraction bits without sign, whether the low word is zero, the sign bit set)
    of ``x0``, and the infinity pattern of the first."""
    if dtype.itemsize == 8:
        return "(x0.y & 0x7fffffffu)", "x0.x == 0u", "0x7ff00000u"
    return "(bitcast<u32>(x0) & 0x7fffffffu)", "true", "0x7f800000u"


@register
class IsNaN(Operator):
    op_type = "IsNaN"
    since_version = 9

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        _check_float("IsNaN", self.opset, x)
        return [np.isnan(x)]

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
        require_device_dtype("IsNaN", x.dtype, _FLOATS)
        magnitude, low_zero, infinity = _magnitude(x.dtype)
        expression = f"{magnitude} > {infinity} || ({magnitude} == {infinity} && !({low_zero}))"
        pair = x.dtype.itemsize == 8
        return elementwise_plan("IsNaN", [Operand(0, x, int64_pair=pair)], outputs, expression, caps, np.isnan, inputs)


@register
class IsInf(Operator):
    op_type = "IsInf"
    since_version = 10

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        _check_float("IsInf", self.opset, x)
        return [_isinf(x, attrs)]

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
        require_device_dtype("IsInf", x.dtype, _FLOATS)
        magnitude, low_zero, infinity = _magnitude(x.dtype)
        pair = x.dtype.itemsize == 8
        negative = "(x0.y & 0x80000000u) != 0u" if pair else "(bitcast<u32>(x0) & 0x80000000u) != 0u"
        positive = int(attrs.get("detect_positive", 1)) != 0
        negative_too = int(attrs.get("detect_negative", 1)) != 0
        infinite = f"({magnitude} == {infinity} && {low_zero})"
        if positive and negative_too:
            expression = infinite
        elif positive:
            expression = f"{infinite} && !({negative})"
        elif negative_too:
            expression = f"{infinite} && ({negative})"
        else:
            expression = "false"

        def function(a: np.ndarray) -> np.ndarray:
            return _isinf(a, attrs)

        return elementwise_plan("IsInf", [Operand(0, x, int64_pair=pair)], outputs, expression, caps, function, inputs)


def _isinf(x: np.ndarray, attrs: Mapping[str, Any]) -> np.ndarray:
    positive = int(attrs.get("detect_positive", 1)) != 0
    negative = int(attrs.get("detect_negative", 1)) != 0
    return np.asarray((np.isposinf(x) & positive) | (np.isneginf(x) & negative), dtype=np.bool_)
