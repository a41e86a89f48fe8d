"""Unary elementwise math: Sqrt Exp Log Neg Abs Reciprocal Relu LeakyRelu Sigmoid Tanh Erf Gelu
HardSigmoid HardSwish.

Each class pairs a numpy reference with a WGSL expression in ``x0`` (the
input in its compute type, f32 for float32/float16) for
:func:`~ortgpu.ops._wgsl_kernels.elementwise_kernel`.  Floating ops run on device for
float32 and float16 (computed in f32); Neg, Abs and Relu also for every
integer type (int64 exactly, on ``vec2<u32>`` pairs).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo, reference_twin
from .._registry import register
from .._wgsl import INT64_WGSL, require_device_dtype, wgsl_float
from .._wgsl_kernels import Operand, elementwise_kernel, kernel_bindings

__all__ = [
    "UnaryOperator",
    "Sqrt",
    "Exp",
    "Log",
    "Neg",
    "Abs",
    "Reciprocal",
    "Relu",
    "LeakyRelu",
    "Sigmoid",
    "Tanh",
    "Erf",
    "Gelu",
    "HardSigmoid",
    "HardSwish",
    "ERF_WGSL",
    "erf_numpy",
]

_FLOATS = ("float32", "float16")
_FLOATS_AND_INTS = ("float32", "float16", "int32", "int16", "int8", "uint32", "uint16", "uint8", "int64")

#: WGSL ``fn erf_f32(x: f32) -> f32`` (WGSL has no erf).  For |x| < 0.5 the
#: Maclaurin series to x^13 (truncation below 2e-8 relative); beyond,
#: Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7), odd in x.
ERF_WGSL = """
fn erf_f32(x: f32) -> f32 {
  let a = abs(x);
  if (a < 0.5) {
    let z = x * x;
    let series = 1.0 + z * (-1.0 / 3.0 + z * (1.0 / 10.0 + z * (-1.0 / 42.0 + z * (1.0 / 216.0
        + z * (-1.0 / 1320.0 + z * (1.0 / 9360.0))))));
    return 1.1283791670955126 * x * series;
  }
  if (a >= 4.0) {
    return sign(x);
  }
  let t = 1.0 / (1.0 + 0.3275911 * a);
  let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
  return sign(x) * (1.0 - poly * exp(-a * a));
}
"""

#: WGSL ``fn tanh_f32(x: f32) -> f32``: ``-expm1(-2a) / (2 + expm1(-2a))`` for ``a = min(|x|, 10)`` (tanh(10)
#: rounds to 1 in f32), with expm1 as its series above -0.5, so small |x| keep their relative precision (the
#: built-in lost it on lavapipe: 19% error at 1e-7) and large |x| never divide overflowed exponentials.
#: NaN is returned as NaN (tested on the bits).
TANH_WGSL = """
fn tanh_f32(x: f32) -> f32 {
  if ((bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u) { return x; }
  let y = -2.0 * min(abs(x), 10.0);
  var e = exp(y) - 1.0;
  if (y > -0.5) {
    e = y * (1.0 + y * (0.5 + y * (1.0 / 6.0 + y * (1.0 / 24.0 + y * (1.0 / 120.0 + y * (1.0 / 720.0
        + y * (1.0 / 5040.0 + y * (1.0 / 40320.0 + y * (1.0 / 362880.0)))))))));
  }
  let t = -e / (2.0 + e);
  return select(t, -t, x < 0.0);
}
"""

#: WGSL ``fn sigmoid_f32(x: f32) -> f32``, never dividing by an overflowed exp.
SIGMOID_WGSL = """
fn sigmoid_f32(x: f32) -> f32 {
  let e = exp(-abs(x));
  return select(e / (1.0 + e), 1.0 / (1.0 + e), x >= 0.0);
}
"""


def erf_numpy(x: np.ndarray) -> np.ndarray:
    """Elementwise erf in the dtype of ``x`` (numpy has none; math.erf in float64)."""
    erf = np.frompyfunc(math.erf, 1, 1)
    return np.asarray(erf(np.asarray(x, dtype=np.float64)), dtype=np.float64).astype(x.dtype)


class UnaryOperator(Operator):
    """An elementwise operator of one input; subclasses give ``compute`` and ``expression``."""

    #: dtype names the WGSL kernel accepts.
    device_dtypes: tuple[str, ...] = _FLOATS
    #: WGSL helper functions the expression calls.
    helpers: str = ""

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        raise NotImplementedError

    def expression(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        raise NotImplementedError

    def pair_expression(self) -> str:
        """The expression on an int64 ``x0`` read as ``vec2<u32>`` (see ``INT64_WGSL``); empty: no kernel."""
        return ""

    def check_attrs(self, attrs: Mapping[str, Any]) -> None:
        """Raise :class:`UnsupportedOpError` for attribute values this implementation lacks."""

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        self.check_attrs(attrs)
        x = inputs[0]
        assert x is not None
        if x.dtype.kind not in "fiub":
            raise UnsupportedOpError(f"{self.op_type} (opset {self.opset}) does not support dtype {x.dtype.name}")
        return [np.asarray(self.compute(x, attrs), dtype=x.dtype)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        self.check_attrs(attrs)
        x = inputs[0]
        assert x is not None
        require_device_dtype(self.op_type, x.dtype, self.device_dtypes)
        if outputs[0].size == 0:
            return OpPlan()
        pair = x.dtype.itemsize == 8
        if pair and not self.pair_expression():
            raise NotOnDevice(f"{self.op_type} on {x.dtype.name} runs on the CPU: no 64-bit WebGPU kernel")
        operands = [Operand(0, x, int64_pair=pair)]

        def function(array: np.ndarray) -> np.ndarray:
            return self.reference([array], attrs, outputs)[0]

        kernel = elementwise_kernel(
            self.op_type,
            operands,
            outputs[0],
            self.pair_expression() if pair else self.expression(x.dtype, attrs),
            caps,
            reference_twin(function, kernel_bindings(1), inputs, outputs),
            helpers=INT64_WGSL if pair else self.helpers,
            pair_output=pair,
        )
        return OpPlan(kernels=(kernel,))


def _float(attrs: Mapping[str, Any], name: str, default: float) -> float:
    value = attrs.get(name, default)
    return float(value)


@register
class Sqrt(UnaryOperator):
    op_type = "Sqrt"
    since_version = 1

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        with np.errstate(invalid="ignore"):
            return np.sqrt(x)

    def expression(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        return "sqrt(x0)"


@register
class Exp(UnaryOperator):
    op_type = "Exp"
    since_version = 1

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        with np.errstate(over="ignore"):
            return np.exp(x)

    def expression(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        return "exp(x0)"


@register
class Log(UnaryOperator):
    op_type = "Log"
    since_version = 1

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.log(x)

    def expression(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        return "log(x0)"


@register
class Neg(UnaryOperator):
    op_type = "Neg"
    since_version = 1
    device_dtypes = _FLOATS_AND_INTS

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        return np.negative(x)

    def expression(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        # 0 - x wraps for i32::MIN as numpy does (unary minus on the literal would not be the point).
        if dtype.kind == "f":
            return "-x0"
        return "0u - x0" if dtype.kind == "u" else "bitcast<i32>(0u - bitcast<u32>(x0))"

    def pair_expression(self) -> str:
        return "neg64(x0)"


@register
class Abs(UnaryOperator):
    op_type = "Abs"
    since_version = 1
    device_dtypes = _FLOATS_AND_INTS

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        return np.abs(x)

    def expression(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        return "abs(x0)"

    def pair_expression(self) -> str:
        return "abs64(x0)"


@register
class Reciprocal(UnaryOperator):
    op_type = "Reciprocal"
    since_version = 1

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        with np.errstate(divide="ignore"):
            return np.reciprocal(x)

    def expression(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        return "1.0 / x0"


@register
class Relu(UnaryOperator):
    op_type = "Relu"
    since_version = 1
    device_dtypes = _FLOATS_AND_INTS

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        return np.maximum(x, np.zeros((), dtype=x.dtype))

    def expression(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        if dtype.kind == "f":
            return "max(x0, 0.0)"
        return "x0" if dtype.kind == "u" else "max(x0, 0)"

    def pair_expression(self) -> str:
        return "select(x0, vec2<u32>(0u, 0u), is_negative64(x0))"


@register
class LeakyRelu(UnaryOperator):
    op_type = "LeakyRelu"
    since_version = 1

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        alpha = np.asarray(_float(attrs, "alpha", 0.01), dtype=x.dtype)
        return np.where(x >= 0, x, x * alpha)

    def expression(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        return f"select(x0 * {wgsl_float(_float(attrs, 'alpha', 0.01))}, x0, x0 >= 0.0)"


@register
class Sigmoid(UnaryOperator):
    op_type = "Sigmoid"
    since_version = 1
    helpers = SIGMOID_WGSL

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        e = np.exp(-np.abs(x))
        return np.where(x >= 0, 1 / (1 + e), e / (1 + e))

    def expression(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        return "sigmoid_f32(x0)"


@register
class Tanh(UnaryOperator):
    op_type = "Tanh"
    since_version = 1
    helpers = TANH_WGSL

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        return np.tanh(x)

    def expression(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        return "tanh_f32(x0)"


@register
class Erf(UnaryOperator):
    op_type = "Erf"
    since_version = 9
    helpers = ERF_WGSL

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        return erf_numpy(x)

    def expression(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        return "erf_f32(x0)"


@register
class Gelu(UnaryOperator):
    """Gelu (opset 20): ``approximate="none"`` (erf form) or ``"tanh"``."""

    op_type = "Gelu"
    since_version = 20
    helpers = ERF_WGSL + TANH_WGSL

    def check_attrs(self, attrs: Mapping[str, Any]) -> None:
        approximate = _approximate(attrs)
        if approximate not in ("none", "tanh"):
            raise UnsupportedOpError(f"Gelu (opset {self.opset}): approximate={approximate!r} is not supported")

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        wide = x.astype(np.float64)
        if _approximate(attrs) == "tanh":
            inner = math.sqrt(2.0 / math.pi) * (wide + 0.044715 * wide**3)
            return 0.5 * wide * (1.0 + np.tanh(inner))
        return 0.5 * wide * (1.0 + erf_numpy(wide / math.sqrt(2.0)))

    def expression(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        if _approximate(attrs) == "tanh":
            return "0.5 * x0 * (1.0 + tanh_f32(0.7978845608028654 * (x0 + 0.044715 * x0 * x0 * x0)))"
        return "0.5 * x0 * (1.0 + erf_f32(x0 * 0.7071067811865476))"


def _approximate(attrs: Mapping[str, Any]) -> str:
    value = attrs.get("approximate", "none")
    return value.decode() if isinstance(value, bytes) else str(value)


@register
class HardSigmoid(UnaryOperator):
    op_type = "HardSigmoid"
    since_version = 1

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        alpha = np.asarray(_float(attrs, "alpha", 0.2), dtype=x.dtype)
        beta = np.asarray(_float(attrs, "beta", 0.5), dtype=x.dtype)
        return np.clip(x * alpha + beta, 0, 1)

    def expression(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        alpha = wgsl_float(_float(attrs, "alpha", 0.2))
        beta = wgsl_float(_float(attrs, "beta", 0.5))
        return f"clamp(x0 * {alpha} + {beta}, 0.0, 1.0)"


@register
class HardSwish(UnaryOperator):
    op_type = "HardSwish"
    since_version = 14

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        return x * np.clip(x * np.asarray(1.0 / 6.0, dtype=x.dtype) + np.asarray(0.5, dtype=x.dtype), 0, 1)

    def expression(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        return f"x0 * clamp(x0 * {wgsl_float(1.0 / 6.0)} + 0.5, 0.0, 1.0)"
