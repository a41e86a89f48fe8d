"""Binary arithmetic with numpy broadcasting: Add Sub Mul Div Pow.

On the device: float32 and float16 (computed in f32, rounded once); every
integer type up to 32 bits for Add/Sub/Mul/Div (computed in i32/u32 and
stored in the element's width, so results wrap like onnxruntime's C++; Div
truncates toward zero); int64 and uint64 for Add/Sub/Mul, exactly, on
``vec2<u32>(low, high)`` pairs with explicit carries (:data:`~ortgpu.ops._wgsl.INT64_WGSL`).
64-bit Div and float64 run on the CPU.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register
from .._wgsl import INT64_WGSL, require_device_dtype
from .._wgsl_kernels import Operand, elementwise_plan

__all__ = ["BinaryOperator", "Add", "Sub", "Mul", "Div", "Pow", "integer_divide", "POW_WGSL", "IPOW_WGSL"]

#: dtypes every binary kernel computes (integers narrower than 32 bits are computed in i32/u32).
_DEVICE_DTYPES = ("float32", "float16", "bfloat16", "int32", "uint32", "int16", "uint16", "int8", "uint8")
_PAIR_DTYPES = ("int64", "uint64")


def integer_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division truncating toward zero (C semantics, as onnxruntime computes it)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        quotient = np.floor_divide(a, b)
        remainder = np.remainder(a, b)
    adjust = (remainder != 0) & ((a < 0) != (b < 0))
    return np.asarray(quotient + adjust.astype(quotient.dtype), dtype=np.result_type(a, b))


class BinaryOperator(Operator):
    """An elementwise operator of two inputs of one dtype, broadcast numpy-style."""

    #: WGSL operator between ``x0`` and ``x1``.
    symbol = ""
    #: WGSL function of two ``vec2<u32>`` pairs for int64/uint64 (empty: 64-bit runs on the CPU).
    pair_function = ""

    def compute(self, a: np.ndarray, b: np.ndarray) -> Any:
        raise NotImplementedError

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        if self.opset < 7 and attrs.get("broadcast", 0):
            raise UnsupportedOpError(
                f"{self.op_type} (opset {self.opset}): the legacy 'broadcast' attribute is not supported"
            )
        if a.dtype != b.dtype:
            raise UnsupportedOpError(
                f"{self.op_type} (opset {self.opset}): inputs of different dtypes {a.dtype} and {b.dtype}"
            )
        if a.dtype.kind not in "fiu":
            raise UnsupportedOpError(f"{self.op_type} (opset {self.opset}) does not support dtype {a.dtype.name}")
        with np.errstate(all="ignore"):
            return [np.asarray(self.compute(a, b), dtype=a.dtype)]

    def expression(self, dtype: np.dtype[Any]) -> str:
        return f"x0 {self.symbol} x1"

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
        if a.dtype != b.dtype:
            raise NotOnDevice(f"{self.op_type}: inputs of different dtypes {a.dtype} and {b.dtype}")

        def function(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            return self.reference([x, y], attrs, outputs)[0]

        if a.dtype.name in _PAIR_DTYPES:
            if not self.pair_function:
                raise NotOnDevice(
                    f"{self.op_type} on {a.dtype.name} runs on the CPU: 64-bit integer division is not written for WGSL"
                )
            operands = [Operand(0, a, int64_pair=True), Operand(1, b, int64_pair=True)]
            return elementwise_plan(
                self.op_type,
                operands,
                outputs,
                f"{self.pair_function}(x0, x1)",
                caps,
                function,
                inputs,
                helpers=INT64_WGSL,
                pair_output=True,
            )
        require_device_dtype(self.op_type, a.dtype, _DEVICE_DTYPES)
        return elementwise_plan(
            self.op_type,
            [Operand(0, a), Operand(1, b)],
            outputs,
            self.expression(a.dtype),
            caps,
            function,
            inputs,
            helpers=self.wgsl_helpers(a.dtype),
        )

    def wgsl_helpers(self, dtype: np.dtype[Any]) -> str:
        """WGSL functions :meth:`expression` calls (none by default)."""
        return ""


@register
class Add(BinaryOperator):
    op_type = "Add"
    since_version = 1
    opset_changes = (7,)
    pair_function = "add64"
    symbol = "+"

    def compute(self, a: np.ndarray, b: np.ndarray) -> Any:
        return a + b


@register
class Sub(BinaryOperator):
    op_type = "Sub"
    since_version = 1
    opset_changes = (7,)
    pair_function = "sub64"
    symbol = "-"

    def compute(self, a: np.ndarray, b: np.ndarray) -> Any:
        return a - b


@register
class Mul(BinaryOperator):
    op_type = "Mul"
    since_version = 1
    opset_changes = (7,)
    pair_function = "mul64"
    symbol = "*"

    def compute(self, a: np.ndarray, b: np.ndarray) -> Any:
        return a * b


@register
class Div(BinaryOperator):
    """Div; float32 on the device is correctly rounded, like numpy and onnxruntime's CPU: WGSL's ``/`` may be off by
    2.5 ulp (NVIDIA's Vulkan driver's was), which flipped a later Round (DynamicQuantizeLinear's expansion gave 25 for 26), so the
    quotient is computed on the bits (:data:`~ortgpu.ops.ai_onnx.quantize.EXACT_DIVISION_WGSL`)."""

    op_type = "Div"
    since_version = 1
    opset_changes = (7,)
    symbol = "/"

    def expression(self, dtype: np.dtype[Any]) -> str:
        if dtype == np.float32:
            return "bitcast<f32>(div_bits(bitcast<u32>(x0), bitcast<u32>(x1)))"
        return super().expression(dtype)

    def wgsl_helpers(self, dtype: np.dtype[Any]) -> str:
        from .quantize import EXACT_DIVISION_WGSL  # noqa: PLC0415 - quantize imports this module

        return EXACT_DIVISION_WGSL if dtype == np.float32 else ""

    def compute(self, a: np.ndarray, b: np.ndarray) -> Any:
        if a.dtype.kind in "iu":
            return integer_divide(a, b)
        return a / b


#: WGSL ``fn pow_f32(x: f32, y: f32) -> f32`` with C's ``pow`` semantics for finite inputs: WGSL's
#: ``pow`` is ``exp2(y * log2(x))``, undefined for x <= 0, so signs, zero and y == 0 are handled here.
POW_WGSL = """
fn pow_f32(x: f32, y: f32) -> f32 {
  if (y == 0.0) {
    return 1.0;
  }
  let y_is_integer = fract(y) == 0.0;
  let y_is_odd = y_is_integer && fract(y * 0.5) != 0.0;
  if (x == 0.0) {
    // +-0 ** y: 0 for y > 0, infinity for y < 0; the sign survives only for odd y.
    let magnitude = select(0.0, 1.0 / abs(x), y < 0.0);
    return select(magnitude, -magnitude, y_is_odd && (bitcast<u32>(x) & 0x80000000u) != 0u);
  }
  let magnitude = pow(abs(x), y);
  if (x > 0.0) {
    return magnitude;
  }
  if (!y_is_integer) {
    return bitcast<f32>(0x7fc00000u | (bitcast<u32>(y) & 0u));
  }
  return select(magnitude, -magnitude, y_is_odd);
}
"""


#: WGSL integer powers by repeated squaring (wrapping, as C's integer multiplication does): ``ipow_i32``
#: and ``ipow64`` (int64 base as a ``vec2<u32>`` pair; needs ``INT64_WGSL``).  A negative exponent
#: truncates ``x ** y`` toward zero: 1 and -1 keep their powers, every other base gives 0.  The ``_f``
#: variants take a float exponent: an integral one goes through the exact loop, a fractional one
#: through ``pow_f32`` (then truncated).
IPOW_WGSL = """
fn ipow_i32(x: i32, y: i32) -> i32 {
  if (y < 0) {
    if (x == 1) { return 1; }
    if (x == -1) { return select(1, -1, (y & 1) != 0); }
    return 0;
  }
  var result = 1;
  var base = x;
  var e = u32(y);
  loop {
    if (e == 0u) { break; }
    if ((e & 1u) == 1u) { result = result * base; }
    base = base * base;
    e = e >> 1u;
  }
  return result;
}
fn ipow_f_i32(x: i32, y: f32) -> i32 {
  if (fract(y) == 0.0 && abs(y) < 2147483648.0) { return ipow_i32(x, i32(y)); }
  return i32(trunc(pow_f32(f32(x), y)));
}
"""
IPOW64_WGSL = """
fn ipow64(x: vec2<u32>, y: i32) -> vec2<u32> {
  let one = vec2<u32>(1u, 0u);
  if (y < 0) {
    if (all(x == one)) { return one; }
    if (all(x == vec2<u32>(0xffffffffu, 0xffffffffu))) { return select(one, x, (y & 1) != 0); }
    return vec2<u32>(0u, 0u);
  }
  var result = one;
  var base = x;
  var e = u32(y);
  loop {
    if (e == 0u) { break; }
    if ((e & 1u) == 1u) { result = mul64(result, base); }
    base = mul64(base, base);
    e = e >> 1u;
  }
  return result;
}
fn ipow_f64(x: vec2<u32>, y: f32) -> vec2<u32> {
  if (fract(y) == 0.0 && abs(y) < 2147483648.0) { return ipow64(x, i32(y)); }
  return f32_to_i64(trunc(pow_f32(i64_to_f32(x), y)));
}
"""


@register
class Pow(Operator):
    """Pow: float base (float32/float16) or integer base (int32, int64 on pairs) on the device; the exponent
    may be float or integer (uint64 exponents read exactly as pairs).

    A constant scalar exponent of 0.5, 1, 2 or 3 compiles to sqrt or multiplications
    (the x ** 2 of decomposed LayerNorms stays exact).  Integer bases use exact integer powers
    (:data:`IPOW_WGSL`), as ``static_cast<T>(std::pow(x, y))`` gives wherever the result fits; with a
    fractional float exponent the power is computed in f32 and truncated, so results beyond a few thousand
    may differ from the float64 reference by one.
    """

    op_type = "Pow"
    since_version = 1
    opset_changes = (7, 12)

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        base, exponent = inputs[0], inputs[1]
        assert base is not None and exponent is not None
        if self.opset < 12 and base.dtype != exponent.dtype:
            raise UnsupportedOpError(
                f"Pow (opset {self.opset}): base {base.dtype} and exponent {exponent.dtype} must have one dtype before opset 12"
            )
        if base.dtype.kind not in "fiu" or exponent.dtype.kind not in "fiu":
            raise UnsupportedOpError(f"Pow (opset {self.opset}) does not support dtypes {base.dtype}, {exponent.dtype}")
        with np.errstate(all="ignore"):
            result = np.power(base.astype(np.float64), exponent.astype(np.float64))
            if base.dtype.kind in "iu":
                return [result.astype(np.int64).astype(base.dtype)]
            return [result.astype(base.dtype)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        base, exponent = inputs[0], inputs[1]
        assert base is not None and exponent is not None
        require_device_dtype("Pow", base.dtype, ("float32", "float16", "int32", "int64"))
        require_device_dtype(
            "Pow",
            exponent.dtype,
            ("float32", "float16", "int32", "int64", "uint32", "uint64", "int16", "int8", "uint16", "uint8"),
        )
        if base.dtype.kind == "i":
            return self._integer_plan(base, exponent, inputs, outputs, attrs, caps)
        constant = constants.get(1)
        if constant is not None and constant.size == 1 and outputs[0].shape == base.shape:
            value = float(constant.reshape(-1)[0])
            special = {0.5: "sqrt(x0)", 1.0: "x0", 2.0: "x0 * x0", 3.0: "x0 * x0 * x0"}.get(value)
            if special is not None:
                exponent_array = constant

                def constant_function(x: np.ndarray) -> np.ndarray:
                    return self.reference([x, exponent_array], attrs, outputs)[0]

                return elementwise_plan("Pow", [Operand(0, base)], outputs, special, caps, constant_function, inputs)

        def function(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            return self.reference([x, y], attrs, outputs)[0]

        wide_exponent = exponent.dtype.name == "uint64"
        return elementwise_plan(
            "Pow",
            [Operand(0, base), Operand(1, exponent, int64_pair=wide_exponent)],
            outputs,
            "pow_f32(x0, u64_to_f32(x1))" if wide_exponent else "pow_f32(x0, f32(x1))",
            caps,
            function,
            inputs,
            helpers=POW_WGSL + (INT64_WGSL if wide_exponent else ""),
        )

    def _integer_plan(
        self,
        base: TensorInfo,
        exponent: TensorInfo,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
    ) -> OpPlan:
        """int32 / int64 bases: exact integer powers."""
        pair = base.dtype.name == "int64"
        kind = exponent.dtype.kind
        if kind == "f":
            expression = "ipow_f64(x0, x1)" if pair else "ipow_f_i32(x0, x1)"
        else:
            if exponent.dtype.name == "uint64":
                raise NotOnDevice("Pow with an integer base and a uint64 exponent runs on the CPU")
            # Integer exponents (int64's low word; unsigned ones clamped into i32 range).
            y = "x1" if kind == "i" else "i32(min(x1, 0x7fffffffu))"
            expression = f"ipow64(x0, {y})" if pair else f"ipow_i32(x0, {y})"

        def function(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            return self.reference([x, y], attrs, outputs)[0]

        return elementwise_plan(
            "Pow",
            [Operand(0, base, int64_pair=pair), Operand(1, exponent)],
            outputs,
            expression,
            caps,
            function,
            inputs,
            helpers=POW_WGSL + IPOW_WGSL + (INT64_WGSL + IPOW64_WGSL if pair else ""),
            pair_output=pair,
        )
