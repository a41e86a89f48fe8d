"""Comparisons with numpy broadcasting (Equal Less Greater LessOrEqual GreaterOrEqual) and Not.

Outputs are bool tensors, one byte per element; the kernels write four
elements (one ``u32`` word) per invocation.  int64 and uint64 inputs compare
exactly on the device through both words of each element (a comparison needs
no carries); every narrower integer type in its i32/u32 compute type.  The comparisons are rows of
:data:`COMPARISONS` over one class.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register, register_row
from .._wgsl import require_device_dtype
from .._wgsl_kernels import Operand, elementwise_plan

__all__ = ["ComparisonOperator", "COMPARISONS", "Not"]

_DEVICE_DTYPES = (
    "float32",
    "float16",
    "bfloat16",
    "int32",
    "uint32",
    "int16",
    "uint16",
    "int8",
    "uint8",
    "bool",
    "int64",
    "uint64",
)


class ComparisonOperator(Operator):
    """``output = compare(a, b)`` as bool, broadcast numpy-style."""

    numpy_function: Callable[..., Any]
    #: WGSL comparison operator for scalar compute types.
    symbol = ""
    allows_bool = False
    #: Whether string tensors (object arrays, on the host) compare too (Equal).
    allows_string = False

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        if a.dtype != b.dtype:
            raise UnsupportedOpError(
                f"{self.op_type} (opset {self.opset}): inputs of different dtypes {a.dtype} and {b.dtype}"
            )
        if a.dtype == object and self.allows_string:
            return [
                np.asarray(type(self).numpy_function(a, b), dtype=np.bool_).reshape(
                    np.broadcast_shapes(a.shape, b.shape)
                )
            ]
        if a.dtype.kind not in "fiu" and not (self.allows_bool and a.dtype.kind == "b"):
            raise UnsupportedOpError(f"{self.op_type} (opset {self.opset}) does not support dtype {a.dtype.name}")
        return [np.asarray(type(self).numpy_function(a, b), dtype=np.bool_)]

    def pair_expression(self, signed: bool = True) -> str:
        """The comparison of two int64 (or uint64) values read as ``vec2<u32>(low, high)``."""
        high_a, high_b = ("bitcast<i32>(x0.y)", "bitcast<i32>(x1.y)") if signed else ("x0.y", "x1.y")
        if self.symbol == "==":
            return "all(x0 == x1)"
        strict = self.symbol[0]
        return f"({high_a} {strict} {high_b}) || (x0.y == x1.y && x0.x {self.symbol} x1.x)"

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
        require_device_dtype(self.op_type, a.dtype, _DEVICE_DTYPES)
        if a.dtype != b.dtype:
            raise NotOnDevice(f"{self.op_type}: inputs of different dtypes {a.dtype} and {b.dtype}")
        pair = a.dtype.itemsize == 8
        expression = self.pair_expression(a.dtype.kind == "i") if pair else f"x0 {self.symbol} x1"

        def function(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            return self.reference([x, y], attrs, outputs)[0]

        operands = [Operand(0, a, int64_pair=pair), Operand(1, b, int64_pair=pair)]
        return elementwise_plan(self.op_type, operands, outputs, expression, caps, function, inputs)


#: The comparisons, one row each: (op type, first opset, WGSL operator, numpy function, bool inputs allowed).
#: Equal alone also compares strings (on the host).
COMPARISONS: tuple[tuple[str, int, str, Callable[..., Any], bool], ...] = (
    ("Equal", 1, "==", np.equal, True),
    ("Less", 1, "<", np.less, False),
    ("Greater", 1, ">", np.greater, False),
    ("LessOrEqual", 12, "<=", np.less_equal, False),
    ("GreaterOrEqual", 12, ">=", np.greater_equal, False),
)

for _op_type, _since_version, _symbol, _function, _allows_bool in COMPARISONS:
    register_row(
        ComparisonOperator,
        __name__,
        _op_type,
        _since_version,
        symbol=_symbol,
        numpy_function=staticmethod(_function),
        allows_bool=_allows_bool,
        allows_string=_op_type == "Equal",
    )


@register
class Not(Operator):
    op_type = "Not"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        if x.dtype != np.bool_:
            raise UnsupportedOpError(f"Not (opset {self.opset}) takes bool, not {x.dtype.name}")
        return [np.logical_not(x)]

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
        return elementwise_plan("Not", [Operand(0, x)], outputs, "!x0", caps, np.logical_not, inputs)
