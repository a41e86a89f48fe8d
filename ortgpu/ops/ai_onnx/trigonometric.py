"""Trigonometric and hyperbolic functions: Cos Sin Tan Acos Asin Atan Cosh Sinh Acosh Asinh Atanh.

Device kernels for float32 and float16 (computed in f32); float64 runs on the CPU.  WGSL's built-in
trigonometric functions have driver-dependent precision (Vulkan allows 2^-11 absolute error for sin/cos
on [-pi, pi] and leaves larger arguments unbounded, 4096 ULP for atan), so the kernels compute them
from arithmetic, ``sqrt``, ``exp`` and ``log`` alone:

* sin/cos/tan: Cody-Waite reduction by pi/2 (pi/2 split into three 8-bit pieces and an f32 rest, so
  ``k * piece`` is exact for quadrants ``|k| < 2^16``, i.e. ``|x| < 102943``) and Taylor polynomials
  on ``|r| <= pi/4``.  Beyond that bound, Payne-Hanek reduction: the argument's 24-bit significand times
  a 96-bit window of 2/pi (exact integer arithmetic on u32 words), so every finite f32 is reduced exactly.
* atan: reduction to ``[0, 1]`` by ``1/x``, two argument halvings, then the odd series; asin and acos
  through it, with ``(1 - x)(1 + x)`` forms that keep precision near +-1.
* sinh/cosh: series near zero, exponentials beyond, ``exp(a/2)^2/2`` past where ``exp`` overflows.
* asinh/acosh/atanh: :data:`LOG1P_WGSL` forms without cancellation near 0 (and near 1 for acosh);
  ``log(|x|) + log 2`` for large arguments, where ``x * x`` would overflow.

The operators are rows of :data:`TRIG_OPERATORS` over one class.  The WGSL helpers (:data:`MATH_WGSL`) are shared
with :mod:`ortgpu.ops.ai_onnx.activations`.
"""

from __future__ import annotations

import math
from decimal import Decimal, getcontext
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._kernel import TensorInfo
from .._registry import register_row
from .._wgsl import INT64_WGSL, wgsl_float
from .unary import UnaryOperator

__all__ = [
    "FloatUnary",
    "MATH_WGSL",
    "TRIG_WGSL",
    "TRIG_OPERATORS",
]


def _series(variable: str, coefficients: Sequence[float]) -> str:
    """Horner form of ``sum(c_i * variable^i)`` as WGSL."""
    text = wgsl_float(coefficients[-1])
    for c in reversed(coefficients[:-1]):
        text = f"({wgsl_float(c)} + {variable} * {text})"
    return text


def _half_pi_pieces() -> tuple[float, float, float, float]:
    """pi/2 as three pieces of 8 significant bits and an f32 rest (from 50 decimal digits of pi)."""
    getcontext().prec = 60
    rest = Decimal("3.14159265358979323846264338327950288419716939937510") / 2
    pieces = []
    for _ in range(3):
        exponent = math.frexp(float(rest))[1]  # rest = m * 2^exponent with 0.5 <= m < 1
        scale = Decimal(2) ** (8 - exponent)
        piece = (rest * scale).to_integral_value() / scale
        pieces.append(float(piece))
        rest -= piece
    pieces.append(float(np.float32(float(rest))))
    return pieces[0], pieces[1], pieces[2], pieces[3]


def _two_over_pi_words(count: int) -> list[int]:
    """The first ``32 * count`` bits of 2/pi after the binary point, as u32 words (pi by Machin's formula)."""
    precision = 32 * count + 64

    def arctan_inverse(n: int) -> int:  # arctan(1/n) * 2^precision
        term = (1 << precision) // n
        total, k, sign = term, 1, -1
        while term:
            term //= n * n
            total += sign * (term // (2 * k + 1))
            sign, k = -sign, k + 1
        return total

    pi = 16 * arctan_inverse(5) - 4 * arctan_inverse(239)
    bits = (2 << (2 * precision)) // pi >> 64  # 2/pi * 2^(32 count)
    return [(bits >> (32 * (count - 1 - j))) & 0xFFFFFFFF for j in range(count)]


_C1, _C2, _C3, _C4 = _half_pi_pieces()
_TWO_OVER_PI = ", ".join(f"{word}u" for word in _two_over_pi_words(8))
_INV = [1.0 / math.factorial(n) for n in range(16)]

#: WGSL helpers: NaN/infinity tests and makers (run-time values, since WGSL rejects constant NaN/inf),
#: ``expm1_f32``, ``log1p_f32`` and ``atan01_f32`` (atan on [0, 1]).
MATH_WGSL = f"""
fn is_nan_f32(a: f32) -> bool {{
  return (bitcast<u32>(a) & 0x7fffffffu) > 0x7f800000u;
}}
fn is_finite_f32(a: f32) -> bool {{
  return (bitcast<u32>(a) & 0x7f800000u) != 0x7f800000u;
}}
fn nan_f32(seed: f32) -> f32 {{
  return bitcast<f32>(0x7fc00000u | (bitcast<u32>(seed) & 0u));
}}
fn inf_f32(negative: bool) -> f32 {{
  return bitcast<f32>(select(0x7f800000u, 0xff800000u, negative));
}}
// exp(x) - 1 without cancellation near 0 (Taylor series for |x| < 0.5: truncation below 3e-10).
fn expm1_f32(x: f32) -> f32 {{
  if (abs(x) < 0.5) {{
    return x * {_series("x", _INV[1:11])};
  }}
  return exp(x) - 1.0;
}}
// log(1 + y) without cancellation near 0: 2 atanh(y / (2 + y)) as a series for |y| < 0.5.
fn log1p_f32(y: f32) -> f32 {{
  if (abs(y) < 0.5) {{
    let z = y / (2.0 + y);
    let w = z * z;
    return 2.0 * z * {_series("w", [1.0 / (2 * n + 1) for n in range(9)])};
  }}
  return log(1.0 + y);
}}
// atan(t) for t in [0, 1]: two halvings atan(t) = 2 atan(t / (1 + sqrt(1 + t^2))) bring t below
// tan(pi/16) ~ 0.199, where the odd series to t^15 is exact in f32.
fn atan01_f32(t0: f32) -> f32 {{
  var t = t0 / (1.0 + sqrt(1.0 + t0 * t0));
  t = t / (1.0 + sqrt(1.0 + t * t));
  let z = t * t;
  return 4.0 * t * {_series("z", [(-1.0) ** n / (2 * n + 1) for n in range(8)])};
}}
// atan(t) for t >= 0 (t may be +inf).
fn atan_pos_f32(t: f32) -> f32 {{
  return select(atan01_f32(t), {wgsl_float(math.pi / 2)} - atan01_f32(1.0 / t), t > 1.0);
}}
"""

#: WGSL sin/cos/tan with exact reduction by pi/2 (needs :data:`MATH_WGSL`).
TRIG_WGSL = f"""
fn sin_poly(r: f32) -> f32 {{
  let z = r * r;
  return r * {_series("z", [(-1.0) ** n * _INV[2 * n + 1] for n in range(6)])};
}}
fn cos_poly(r: f32) -> f32 {{
  let z = r * r;
  return {_series("z", [(-1.0) ** n * _INV[2 * n] for n in range(7)])};
}}
// (r, quadrant): x = r + quadrant * pi/2 with |r| <= pi/4 (for |x| < 102943).
fn reduce_half_pi(x: f32) -> vec2<f32> {{
  let k = round(x * {wgsl_float(2.0 / math.pi)});
  let r = (((x - k * {wgsl_float(_C1)}) - k * {wgsl_float(_C2)}) - k * {wgsl_float(_C3)}) - k * {wgsl_float(_C4)};
  return vec2<f32>(r, k);
}}
// Window of 32 bits of (hi, lo) starting b bits into hi.
fn window32(hi: u32, lo: u32, b: u32) -> u32 {{
  return select((hi << b) | (lo >> (32u - b)), hi, b == 0u);
}}
// (r, quadrant) for finite |x| >= 102943 (Payne-Hanek): |x| = m 2^e, and |x| 2/pi mod 4 is the
// 120-bit product of m with the 96 bits of 2/pi that follow the bits making multiples of 4.
fn reduce_large(x: f32) -> vec2<f32> {{
  var table = array<u32, 9>({_TWO_OVER_PI}, 0u);
  let bits = bitcast<u32>(x);
  let m = (bits & 0x7fffffu) | 0x800000u;
  let e = i32((bits >> 23u) & 0xffu) - 150;
  let s = u32(max(e - 2, 0));
  let t = select(u32(96 - e), 94u, e >= 2);  // the bit of the product of weight 2^0
  let j = s / 32u;
  let b = s % 32u;
  let a0 = mul_wide32(m, window32(table[j + 2u], table[j + 3u], b));
  let a1 = mul_wide32(m, window32(table[j + 1u], table[j + 2u], b));
  let a2 = mul_wide32(m, window32(table[j], table[j + 1u], b));
  let p1 = a0.y + a1.x;
  let c1 = select(0u, 1u, p1 < a1.x);
  let u = a1.y + a2.x;
  let p2 = u + c1;
  let c2 = select(0u, 1u, u < a2.x) + select(0u, 1u, p2 < u);
  var p = array<u32, 5>(a0.x, p1, p2, a2.y + c2, 0u);
  var q = product_bits(&p, t) & 3u;
  var fraction = vec2<u32>(product_bits(&p, t - 64u), product_bits(&p, t - 32u));
  let upper = (fraction.y & 0x80000000u) != 0u;  // fraction >= 1/2: r = (fraction - 1) pi/2
  if (upper) {{
    fraction = neg64(fraction);
    q = q + 1u;
  }}
  let magnitude = (f32(fraction.y) + f32(fraction.x) * {wgsl_float(2.0**-32)}) * {wgsl_float(2.0**-32)};
  var r = magnitude * {wgsl_float(math.pi / 2)};
  r = select(r, -r, upper);
  let k = f32(q & 3u);
  return select(vec2<f32>(r, k), vec2<f32>(-r, -k), x < 0.0);
}}
fn product_bits(p: ptr<function, array<u32, 5>>, lo: u32) -> u32 {{
  let w = lo / 32u;
  let b = lo % 32u;
  return select(((*p)[w] >> b) | ((*p)[w + 1u] << (32u - b)), (*p)[w], b == 0u);
}}
fn reduce_any(x: f32) -> vec2<f32> {{
  if (abs(x) < 102943.0) {{ return reduce_half_pi(x); }}
  return reduce_large(x);
}}
fn quadrant(k: f32) -> u32 {{
  return bitcast<u32>(i32(k)) & 3u;
}}
fn sin_f32(x: f32) -> f32 {{
  if (!is_finite_f32(x)) {{ return nan_f32(x); }}
  let rk = reduce_any(x);
  let q = quadrant(rk.y);
  let v = select(sin_poly(rk.x), cos_poly(rk.x), (q & 1u) == 1u);
  return select(v, -v, q >= 2u);
}}
fn cos_f32(x: f32) -> f32 {{
  if (!is_finite_f32(x)) {{ return nan_f32(x); }}
  let rk = reduce_any(x);
  let q = quadrant(rk.y);
  let v = select(cos_poly(rk.x), sin_poly(rk.x), (q & 1u) == 1u);
  return select(v, -v, q == 1u || q == 2u);
}}
fn tan_f32(x: f32) -> f32 {{
  if (!is_finite_f32(x)) {{ return nan_f32(x); }}
  let rk = reduce_any(x);
  let s = sin_poly(rk.x);
  let c = cos_poly(rk.x);
  return select(s / c, -c / s, (quadrant(rk.y) & 1u) == 1u);
}}
"""

#: WGSL inverse and hyperbolic functions (needs :data:`MATH_WGSL`).
INVERSE_WGSL = f"""
fn atan_f32(x: f32) -> f32 {{
  if (is_nan_f32(x)) {{ return x; }}
  let r = atan_pos_f32(abs(x));
  return select(r, -r, x < 0.0);
}}
fn asin_f32(x: f32) -> f32 {{
  let a = abs(x);
  if (!(a <= 1.0)) {{ return nan_f32(x); }}
  let d = sqrt((1.0 - a) * (1.0 + a));
  let r = select(atan01_f32(a / d), {wgsl_float(math.pi / 2)} - atan01_f32(d / a), a > d);
  return select(r, -r, x < 0.0);
}}
fn acos_f32(x: f32) -> f32 {{
  if (!(abs(x) <= 1.0)) {{ return nan_f32(x); }}
  // acos(x) = 2 atan(sqrt((1 - x) / (1 + x))), +inf at x = -1 giving pi.
  return 2.0 * atan_pos_f32(sqrt((1.0 - x) / (1.0 + x)));
}}
fn sinh_f32(x: f32) -> f32 {{
  if (is_nan_f32(x)) {{ return x; }}
  let a = abs(x);
  var r: f32;
  if (a < 1.0) {{
    let z = a * a;
    r = a * {_series("z", [_INV[2 * n + 1] for n in range(8)])};
  }} else if (a < 80.0) {{
    let e = exp(a);
    r = 0.5 * (e - 1.0 / e);
  }} else {{
    let h = exp(0.5 * a);  // exp(a) / 2 without overflowing before sinh does
    r = (0.5 * h) * h;
  }}
  return select(r, -r, x < 0.0);
}}
fn cosh_f32(x: f32) -> f32 {{
  if (is_nan_f32(x)) {{ return x; }}
  let a = abs(x);
  if (a < 80.0) {{
    let e = exp(a);
    return 0.5 * (e + 1.0 / e);
  }}
  let h = exp(0.5 * a);
  return (0.5 * h) * h;
}}
fn asinh_f32(x: f32) -> f32 {{
  if (is_nan_f32(x)) {{ return x; }}
  let a = abs(x);
  var r: f32;
  if (a > 4096.0) {{
    r = log(a) + {wgsl_float(math.log(2.0))};  // sqrt(a^2 + 1) rounds to a
  }} else {{
    // log(a + sqrt(a^2 + 1)) = log1p(a + a^2 / (1 + sqrt(a^2 + 1)))
    r = log1p_f32(a + a * a / (1.0 + sqrt(1.0 + a * a)));
  }}
  return select(r, -r, x < 0.0);
}}
fn acosh_f32(x: f32) -> f32 {{
  if (!(x >= 1.0)) {{ return nan_f32(x); }}
  if (x > 4096.0) {{ return log(x) + {wgsl_float(math.log(2.0))}; }}
  let t = x - 1.0;
  // log(x + sqrt(x^2 - 1)) = log1p(t + sqrt(t (x + 1)))
  return log1p_f32(t + sqrt(t * (x + 1.0)));
}}
fn atanh_f32(x: f32) -> f32 {{
  let a = abs(x);
  if (!(a <= 1.0)) {{ return nan_f32(x); }}
  if (a == 1.0) {{ return inf_f32(x < 0.0); }}
  let r = 0.5 * log1p_f32(2.0 * a / (1.0 - a));
  return select(r, -r, x < 0.0);
}}
"""


class FloatUnary(UnaryOperator):
    """A unary operator on floating tensors only (device: float32 and float16, computed in f32)."""

    helpers = MATH_WGSL
    #: the WGSL function of ``x0`` (for :meth:`formula`).
    function = ""
    #: NaN inputs give NaN (tested on the bits: drivers need not propagate NaN through max, exp...).
    nan_passthrough = True

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        if x.dtype.kind != "f":
            raise UnsupportedOpError(f"{self.op_type} (opset {self.opset}) does not support dtype {x.dtype.name}")
        self.check_attrs(attrs)
        with np.errstate(all="ignore"):
            if x.dtype == np.float16:
                # float16 is computed in float32 and rounded once, as the kernels (and onnxruntime) do.
                return [np.asarray(self.compute(x.astype(np.float32), attrs), dtype=np.float32).astype(np.float16)]
            return [np.asarray(self.compute(x, attrs), dtype=x.dtype)]

    def formula(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        """The WGSL value of ``x0`` (NaN handling added by :meth:`expression`)."""
        return f"{self.function}(x0)"

    def expression(self, dtype: np.dtype[Any], attrs: Mapping[str, Any]) -> str:
        formula = self.formula(dtype, attrs)
        if self.nan_passthrough and dtype.kind == "f":
            return f"select({formula}, x0, is_nan_f32(x0))"
        return formula


class _Trig(FloatUnary):
    helpers = INT64_WGSL + MATH_WGSL + TRIG_WGSL + INVERSE_WGSL
    #: the numpy ufunc
    ufunc: Any = None

    def compute(self, x: np.ndarray, attrs: Mapping[str, Any]) -> Any:
        return type(self).ufunc(x)


#: The trigonometric and hyperbolic operators, one row each: (op type, first opset, WGSL function of ``x0`` in
#: :data:`TRIG_WGSL` / :data:`INVERSE_WGSL`, numpy ufunc of the reference).
TRIG_OPERATORS: tuple[tuple[str, int, str, Any], ...] = (
    ("Sin", 7, "sin_f32", np.sin),
    ("Cos", 7, "cos_f32", np.cos),
    ("Tan", 7, "tan_f32", np.tan),
    ("Asin", 7, "asin_f32", np.arcsin),
    ("Acos", 7, "acos_f32", np.arccos),
    ("Atan", 7, "atan_f32", np.arctan),
    ("Sinh", 9, "sinh_f32", np.sinh),
    ("Cosh", 9, "cosh_f32", np.cosh),
    ("Asinh", 9, "asinh_f32", np.arcsinh),
    ("Acosh", 9, "acosh_f32", np.arccosh),
    ("Atanh", 9, "atanh_f32", np.arctanh),
)

for _op_type, _since_version, _function, _ufunc in TRIG_OPERATORS:
    register_row(_Trig, __name__, _op_type, _since_version, function=_function, ufunc=_ufunc)
