"""Activation functions: Elu Selu Celu Softplus Softsign ThresholdedRelu Shrink Mish Swish.

Device kernels for float32 and float16 (computed in f32); Shrink also for 8- and 16-bit integers
(exact in f32).  float64 and the other integer types run on the CPU.  Formulations avoid
cancellation: ``exp(x) - 1`` is ``expm1_f32``, softplus is ``max(x, 0) + log1p(exp(-|x|))``, and
Mish is ``x * n / (n + 2)`` with ``n = e^x (e^x + 2)`` (``tanh(log(1 + e^x))`` in closed form).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._registry import register
from .._wgsl import wgsl_float
from .trigonometric import MATH_WGSL, FloatUnary
from .unary import SIGMOID_WGSL

__all__ = ["Elu", "Selu", "Celu", "Softplus", "Softsign", "ThresholdedRelu", "Shrink", "Mish", "Swish"]

_SELU_ALPHA = 1.67326319217681884765625
_SELU_GAMMA = 1.05070102214813232421875


def _attr(attrs: Mapping[str, Any], name: str, default: float) -> float:
    return float(attrs.get(name, default))


def _typed(value: float, x: np.ndarray) -> np.ndarray:
    """An attribute (a float32 in the model) as a scalar of ``x``'s dtype."""
    return np.asarray(np.float32(value), dtype=x.dtype)


@register
class Elu(FloatUnary):
    op_type = "Elu"
    since_version = 1

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        alpha = _typed(_attr(attrs, "alpha", 1.0), x)
        return np.where(x >= 0, x, alpha * np.expm1(x))

    def formula(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        alpha = wgsl_float(_attr(attrs, "alpha", 1.0))
        return f"select({alpha} * expm1_f32(x0), x0, x0 >= 0.0)"


@register
class Selu(FloatUnary):
    op_type = "Selu"
    since_version = 1

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        alpha = _typed(_attr(attrs, "alpha", _SELU_ALPHA), x)
        gamma = _typed(_attr(attrs, "gamma", _SELU_GAMMA), x)
        return gamma * np.where(x > 0, x, alpha * np.expm1(x))

    def formula(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        alpha = wgsl_float(_attr(attrs, "alpha", _SELU_ALPHA))
        gamma = wgsl_float(_attr(attrs, "gamma", _SELU_GAMMA))
        return f"{gamma} * select({alpha} * expm1_f32(x0), x0, x0 > 0.0)"


@register
class Celu(FloatUnary):
    """Celu: ``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``; alpha must not be 0."""

    op_type = "Celu"
    since_version = 12

    def check_attrs(self, attrs: Mapping[str, Any]) -> None:
        if _attr(attrs, "alpha", 1.0) == 0.0:
            raise UnsupportedOpError(f"Celu (opset {self.opset}): alpha=0 divides by zero")

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        alpha = _typed(_attr(attrs, "alpha", 1.0), x)
        zero = np.zeros((), dtype=x.dtype)
        return np.maximum(zero, x) + np.minimum(zero, alpha * np.expm1(x / alpha))

    def formula(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        alpha = wgsl_float(_attr(attrs, "alpha", 1.0))
        return f"max(x0, 0.0) + min(0.0, {alpha} * expm1_f32(x0 / {alpha}))"


@register
class Softplus(FloatUnary):
    op_type = "Softplus"
    since_version = 1

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        return np.maximum(x, np.zeros((), dtype=x.dtype)) + np.log1p(np.exp(-np.abs(x)))

    def formula(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        return "max(x0, 0.0) + log1p_f32(exp(-abs(x0)))"


@register
class Softsign(FloatUnary):
    op_type = "Softsign"
    since_version = 1

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        return x / (np.ones((), dtype=x.dtype) + np.abs(x))

    def formula(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        # x / (1 + |x|) is inf / inf = NaN at infinities in C and numpy alike; said explicitly for WGSL.
        return "select(nan_f32(x0), x0 / (1.0 + abs(x0)), is_finite_f32(x0))"


@register
class ThresholdedRelu(FloatUnary):
    op_type = "ThresholdedRelu"
    since_version = 10
    nan_passthrough = False  # NaN > alpha is false: 0

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        alpha = _typed(_attr(attrs, "alpha", 1.0), x)
        return np.where(x > alpha, x, np.zeros((), dtype=x.dtype))

    def formula(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        return f"select(0.0, x0, x0 > {wgsl_float(_attr(attrs, 'alpha', 1.0))})"


@register
class Mish(FloatUnary):
    op_type = "Mish"
    since_version = 18

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        wide = x.astype(np.float64)
        return wide * np.tanh(np.logaddexp(wide, 0.0))

    def formula(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        # tanh(log(1 + e)) = ((1 + e)^2 - 1) / ((1 + e)^2 + 1) = n / (n + 2), n = e (e + 2); 1 in f32 past 20.
        return "mish_f32(x0)"

    helpers = (
        MATH_WGSL
        + """
fn mish_f32(x: f32) -> f32 {
  if (!(x <= 20.0)) { return x; }
  let e = exp(x);
  let n = e * (e + 2.0);
  return x * (n / (n + 2.0));
}
"""
    )


@register
class Swish(FloatUnary):
    """Swish (opset 24): ``x * sigmoid(alpha * x)``."""

    op_type = "Swish"
    since_version = 24
    helpers = MATH_WGSL + SIGMOID_WGSL

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        z = x * _typed(_attr(attrs, "alpha", 1.0), x)
        e = np.exp(-np.abs(z))
        one = np.ones((), dtype=x.dtype)
        return x * np.where(z >= 0, one / (one + e), e / (one + e))

    def formula(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        return f"x0 * sigmoid_f32({wgsl_float(_attr(attrs, 'alpha', 1.0))} * x0)"


@register
class Shrink(FloatUnary):
    """Shrink: ``x + bias`` below ``-lambd``, ``x - bias`` above ``lambd``, else 0; floats and integers.

    Integer inputs compare and add in float64 and convert back truncating toward zero (as a C cast
    does); on the device 8- and 16-bit integers (exact in f32), float32 and float16.
    """

    op_type = "Shrink"
    since_version = 9
    device_dtypes = ("float32", "float16", "int8", "uint8", "int16", "uint16")
    nan_passthrough = False  # NaN fails both comparisons: 0

    def reference(self, inputs: Any, attrs: Mapping[str, Any], outputs: Any) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        if x.dtype.kind not in "fiu":
            raise UnsupportedOpError(f"Shrink (opset {self.opset}) does not support dtype {x.dtype.name}")
        lambd = float(np.float32(_attr(attrs, "lambd", 0.5)))
        bias = float(np.float32(_attr(attrs, "bias", 0.0)))
        if x.dtype.kind == "f":
            # float16 compares and adds in float32 and rounds once, as the kernel does.
            wide = x.astype(np.float32) if x.dtype == np.float16 else x
            typed_lambd, typed_bias = _typed(lambd, wide), _typed(bias, wide)
            with np.errstate(all="ignore"):
                result = np.where(
                    wide < -typed_lambd, wide + typed_bias, np.where(wide > typed_lambd, wide - typed_bias, 0)
                )
            return [np.asarray(result, dtype=x.dtype)]
        wide = x.astype(np.float64)
        value = np.where(wide < -float(lambd), wide + float(bias), np.where(wide > float(lambd), wide - float(bias), 0))
        with np.errstate(all="ignore"):
            return [np.trunc(value).astype(np.int64).astype(x.dtype)]

    helpers = (
        MATH_WGSL
        + """
fn shrink_f32(v: f32, lambd: f32, bias: f32) -> f32 {
  return select(select(0.0, v - bias, v > lambd), v + bias, v < -lambd);
}
"""
    )

    def formula(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        lambd = wgsl_float(_attr(attrs, "lambd", 0.5))
        bias = wgsl_float(_attr(attrs, "bias", 0.0))
        if dtype.kind == "f":
            return f"shrink_f32(x0, {lambd}, {bias})"
        # 8/16-bit integers are exact in f32; i32() truncates toward zero, the store keeps the low bits.
        value = f"i32(trunc(shrink_f32(f32(x0), {lambd}, {bias})))"
        return value if dtype.kind == "i" else f"bitcast<u32>({value})"
