"""Floor, Ceil, Round (half to even) and Sign, elementwise.

Floor/Ceil/Round take floats; on the device float32 and float16 (computed in
f32, whose integral results are exact in float16 too); WGSL's ``round`` rounds
halves to even, as ONNX's Round does.  Sign takes every numeric type: on the
device floats (NaN stays NaN), integers up to 32 bits and int64/uint64 (on
``vec2<u32>`` pairs).  float64 runs on the CPU.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._kernel import DeviceCaps, Operator, OpPlan, TensorInfo
from .._registry import register
from .._wgsl import INT64_WGSL, require_device_dtype, wgsl_compute_type
from .._wgsl_kernels import Operand, elementwise_plan

__all__ = ["RoundingOperator", "Floor", "Ceil", "Round", "Sign"]

_FLOATS = ("float32", "float16")
_NUMBERS = ("float32", "float16", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


class RoundingOperator(Operator):
    """A float-to-integral-float elementwise operator."""

    #: the WGSL builtin applied to ``x0``.
    builtin = ""

    def compute(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        if x.dtype.kind != "f":
            raise UnsupportedOpError(f"{self.op_type} (opset {self.opset}) takes floats, not {x.dtype.name}")
        return [np.asarray(self.compute(x), dtype=x.dtype)]

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
        require_device_dtype(self.op_type, x.dtype, _FLOATS)

        def function(a: np.ndarray) -> np.ndarray:
            return np.asarray(self.compute(a), dtype=a.dtype)

        return elementwise_plan(self.op_type, [Operand(0, x)], outputs, f"{self.builtin}(x0)", caps, function, inputs)


@register
class Floor(RoundingOperator):
    op_type = "Floor"
    since_version = 1
    builtin = "floor"

    def compute(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(np.floor(x))


@register
class Ceil(RoundingOperator):
    op_type = "Ceil"
    since_version = 1
    builtin = "ceil"

    def compute(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(np.ceil(x))


@register
class Round(RoundingOperator):
    op_type = "Round"
    since_version = 11
    builtin = "round"

    def compute(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(np.round(x))  # numpy rounds halves to even


def _sign_expression(dtype: np.dtype[Any]) -> str:
    if dtype.itemsize == 8:
        one = "vec2<u32>(1u, 0u)"
        zero = "vec2<u32>(0u, 0u)"
        positive = f"select({zero}, {one}, any(x0 != {zero}))"
        if dtype.kind == "u":
            return positive
        return f"select({positive}, vec2<u32>(0xffffffffu, 0xffffffffu), is_negative64(x0))"
    compute = wgsl_compute_type(dtype)
    if compute == "f32":
        # NaN is neither above nor below zero: it (and +-0) passes through.
        return "select(select(x0, 1.0, x0 > 0.0), -1.0, x0 < 0.0)"
    if compute == "u32":
        return "select(0u, 1u, x0 != 0u)"
    return "select(select(0, 1, x0 > 0), -1, x0 < 0)"


@register
class Sign(Operator):
    op_type = "Sign"
    since_version = 9

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        if x.dtype.kind not in "fiu":
            raise UnsupportedOpError(f"Sign (opset {self.opset}) does not support dtype {x.dtype.name}")
        return [np.asarray(np.sign(x), dtype=x.dtype)]

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
        require_device_dtype("Sign", x.dtype, _NUMBERS)
        pair = x.dtype.itemsize == 8

        def function(a: np.ndarray) -> np.ndarray:
            return np.asarray(np.sign(a), dtype=a.dtype)

        return elementwise_plan(
            "Sign",
            [Operand(0, x, int64_pair=pair)],
            outputs,
            _sign_expression(x.dtype),
            caps,
            function,
            inputs,
            helpers=INT64_WGSL if pair else "",
            pair_output=pair,
        )
