"""The arithmetic of onnxruntime's QLinear kernels (x86-64 MLAS, the CPU provider), emulated bit for bit in numpy.

onnxruntime computes these operators in float32 and rounds half to even, but not by the plain formula
``saturate(round((a - za) * sa / sc + ...) + zc)``: where the formula's intermediate roundings differ, the result
differs by one unit at ties, so each function here follows the order of operations of the kernel onnxruntime
runs on an AVX2 machine (checked exhaustively against onnxruntime 1.32 over all 65536 byte pairs for many scales):

* QLinearAdd (``MlasQLinearAdd``, AVX2): ratios ``ra = sa / sc``, ``rb = sb / sc``; a fixed part ``zc - fma(ra, za,
  rb * zb)``; then ``fma(a, ra, fma(b, rb, fixed))`` on the raw values (the zero points are in the fixed part), and
  where one input is a scalar per broadcast span (:func:`scalar_input`) the scalar's term is folded into the fixed
  part first.  The float is converted with ``cvtps2dq`` (half to even; out of range gives ``INT32_MIN``) and packed
  with saturation.
* QLinearMul (``MlasQLinearMul``, SSE2): ``((a - za) * (b - zb)) * (sa * sb / sc) + zc`` (a product, then a sum:
  the zero point is added before the rounding), converted and packed as above.
* The lookup-table operators (QLinearSigmoid, QLinearLeakyRelu, QLinearConcat): a 256-entry table per input, from
  ``sx * (x - zx)`` through the float function and ``MlasQuantizeLinear`` (``x / sy``, clamped to ``[min - zy, max -
  zy]``, half to even, plus ``zy``).  Sigmoid is MLAS's rational approximation (Eigen's coefficients, FMA steps).
* QLinearGlobalAveragePool: the int32 sum minus ``zx * image_size``, times ``sx / (sy * image_size)``, clamped,
  half to even, plus ``zy``.

The fused multiply-adds are computed exactly (:func:`fma32`).
"""

from __future__ import annotations

from typing import Any, Callable, Literal

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

__all__ = [
    "BYTE_DTYPES",
    "fma32",
    "convert_to_int32",
    "scalar_input",
    "add_values",
    "mul_values",
    "quantize_floats",
    "logistic",
    "lookup_table",
    "average_pool_scale",
    "scale_of",
    "zero_point_of",
]

BYTE_DTYPES = (np.dtype(np.uint8), np.dtype(np.int8))
F32 = np.float32
_INT32_MIN = -(2**31)

#: MLAS's logistic constants (float32): clamp range, numerator (odd powers) and denominator (even powers).
_LOGISTIC_RANGE = 18.0
_ALPHA = [4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05, 8.51377133304701e-03, 2.48287947061529e-01]
_BETA = [
    6.10247389755681e-13,
    5.76102136993427e-09,
    6.29106785017040e-06,
    1.70198817374094e-03,
    1.16817656904453e-01,
    9.93151921023180e-01,
]


def scale_of(op_type: str, value: np.ndarray | None, what: str) -> np.float32:
    """A per-tensor float32 scale (a scalar or one value), as onnxruntime requires."""
    if value is None:
        raise ShapeError(f"{op_type}: {what} is required")
    if value.dtype != np.float32:
        raise UnsupportedOpError(f"{op_type}: {what} of dtype {value.dtype} (float32 expected)")
    if value.size != 1 or value.ndim > 1:
        raise ShapeError(f"{op_type}: {what} must be a scalar or a 1-D tensor of one value, got shape {value.shape}")
    return F32(value.reshape(-1)[0])


def zero_point_of(op_type: str, value: np.ndarray | None, dtype: np.dtype[Any], what: str) -> int:
    """A per-tensor zero point of the data's ``dtype`` (absent: 0)."""
    if value is None:
        return 0
    if value.dtype != dtype:
        raise UnsupportedOpError(f"{op_type}: {what} of dtype {value.dtype} differs from the data's {dtype}")
    if value.size != 1 or value.ndim > 1:
        raise ShapeError(f"{op_type}: {what} must be a scalar or a 1-D tensor of one value, got shape {value.shape}")
    return int(value.reshape(-1)[0])


def fma32(x: Any, y: Any, z: Any) -> np.ndarray:
    """``x * y + z`` over float32 values, rounded once to float32 (a fused multiply-add).

    The product of two float32 values is exact in float64 and the float64 sum is rounded once; where that sum is
    inexact and lands exactly half-way between two float32 values, it is moved one float64 step toward the exact
    value so that the rounding to float32 goes the way the exact sum's would."""
    xs, ys, zs = (np.asarray(v, dtype=F32).astype(np.float64) for v in (x, y, z))
    product = xs * ys
    total = product + zs
    back = total - product
    error = (product - (total - back)) + (zs - back)
    bits = np.asarray(total).view(np.int64)
    halfway = (bits & ((1 << 29) - 1)) == (1 << 28)
    nudged = np.nextafter(total, np.where(error > 0, np.inf, -np.inf))
    result: np.ndarray = np.where((error != 0) & halfway, nudged, total).astype(F32)
    return result


def convert_to_int32(values: np.ndarray) -> np.ndarray:
    """float32 to int32 as ``cvtps2dq`` converts: half to even; NaN and values out of int32's range give INT32_MIN."""
    wide = np.rint(np.asarray(values, dtype=F32).astype(np.float64))
    inside = (wide >= _INT32_MIN) & (wide < 2.0**31)
    result: np.ndarray = np.where(inside, np.nan_to_num(wide), _INT32_MIN).astype(np.int64)
    return result


def _saturate(values: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    info = np.iinfo(dtype)
    result: np.ndarray = np.clip(values, info.min, info.max).astype(dtype)
    return result


def scalar_input(shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> Literal["a", "b", ""]:
    """Which input onnxruntime's broadcaster reads as one value per span: "a", "b" or "" (both as vectors).

    The innermost axis that is not 1 in both shapes (or the last common one) decides; a rank-0 input, or a size-1
    input on that axis, is the scalar, A first when both are."""
    if not shape_a:
        return "a"
    if not shape_b:
        return "a" if shape_a[-1] <= 1 else "b"
    common = min(len(shape_a), len(shape_b))
    for offset in range(1, common + 1):
        da, db = shape_a[-offset], shape_b[-offset]
        used = 0 if min(da, db) == 0 else max(da, db)
        if used <= 1 and offset < common:
            continue
        if da <= 1:
            return "a"
        return "b" if db <= 1 else ""
    return ""


def add_values(
    a: np.ndarray,
    b: np.ndarray,
    scales: tuple[np.float32, np.float32, np.float32],
    zeros: tuple[int, int, int],
    scalar: Literal["a", "b", ""],
    dtype: np.dtype[Any],
) -> np.ndarray:
    """QLinearAdd of the broadcast ``a`` and ``b`` (raw values), as onnxruntime's AVX2 kernel computes it."""
    sa, sb, sc = scales
    za, zb, zc = zeros
    ra, rb = F32(sa / sc), F32(sb / sc)
    av, bv = (np.asarray(v).astype(F32) for v in np.broadcast_arrays(a, b))
    if scalar == "":
        fixed = F32(F32(zc) - fma32(ra, F32(za), F32(rb * F32(zb))))
        total = fma32(av, ra, fma32(bv, rb, fixed))
    else:
        # onnxruntime passes the vector input first: (vector, its ratio, its zero point, scalar, ...).
        (vector, rv, zv), (single, rs, zs) = (
            ((bv, rb, zb), (av, ra, za)) if scalar == "a" else ((av, ra, za), (bv, rb, zb))
        )
        fixed = F32(F32(zc) - fma32(rv, F32(zv), F32(rs * F32(zs))))
        total = fma32(vector, rv, fma32(single, rs, fixed))
    return _saturate(convert_to_int32(total), dtype)


def mul_values(
    a: np.ndarray,
    b: np.ndarray,
    scales: tuple[np.float32, np.float32, np.float32],
    zeros: tuple[int, int, int],
    dtype: np.dtype[Any],
) -> np.ndarray:
    """QLinearMul of the broadcast ``a`` and ``b`` (raw values), as onnxruntime's kernel computes it."""
    sa, sb, sc = scales
    za, zb, zc = zeros
    ratio = F32(F32(sa * sb) / sc)
    av, bv = np.broadcast_arrays(np.asarray(a).astype(np.int64) - za, np.asarray(b).astype(np.int64) - zb)
    product = (av * bv).astype(F32)  # |product| <= 65536: exact
    scaled = ((product * ratio).astype(F32) + F32(zc)).astype(F32)
    return _saturate(convert_to_int32(scaled), dtype)


def quantize_floats(values: np.ndarray, scale: np.float32, zero: int, dtype: np.dtype[Any]) -> np.ndarray:
    """``MlasQuantizeLinear``: ``values / scale`` clamped to ``[min - zero, max - zero]`` (NaN to the low end), half
    to even, plus ``zero``."""
    info = np.iinfo(dtype)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        quotient = (np.asarray(values, dtype=F32) / scale).astype(F32)
    low, high = F32(info.min - zero), F32(info.max - zero)
    clamped = np.where(np.isnan(quotient), low, np.clip(quotient, low, high))
    return (np.rint(clamped.astype(np.float64)).astype(np.int64) + zero).astype(dtype)


def logistic(values: np.ndarray) -> np.ndarray:
    """MLAS's float32 logistic: a rational function of ``x`` clamped to [-18, 18] (FMA steps), plus 0.5, clamped to
    [0, 1]."""
    x = np.clip(np.asarray(values, dtype=F32), F32(-_LOGISTIC_RANGE), F32(_LOGISTIC_RANGE))
    square = (x * x).astype(F32)
    p = fma32(square, F32(_ALPHA[0]), F32(_ALPHA[1]))
    for coefficient in _ALPHA[2:]:
        p = fma32(p, square, F32(coefficient))
    p = (p * x).astype(F32)
    q = fma32(square, F32(_BETA[0]), F32(_BETA[1]))
    for coefficient in _BETA[2:]:
        q = fma32(q, square, F32(coefficient))
    result: np.ndarray = np.clip(((p / q).astype(F32) + F32(0.5)).astype(F32), F32(0), F32(1))
    return result


def lookup_table(
    function: Callable[[np.ndarray], np.ndarray],
    x_scale: np.float32,
    x_zero: int,
    y_scale: np.float32,
    y_zero: int,
    dtype: np.dtype[Any],
) -> np.ndarray:
    """The 256 output bytes of a lookup-table operator, indexed by the input's byte (its raw bits)."""
    raw = np.arange(256, dtype=np.uint8).view(dtype).astype(np.int64)
    dequantized = (x_scale * (raw - x_zero).astype(F32)).astype(F32)
    return quantize_floats(function(dequantized), y_scale, y_zero, dtype).view(np.uint8)


def average_pool_scale(op_type: str, x_scale: np.float32, y_scale: np.float32, image_size: int) -> np.float32:
    """``x_scale / (y_scale * image_size)`` in float32, within the range onnxruntime computes it in."""
    scale = F32(x_scale / F32(y_scale * F32(image_size)))
    if image_size >= 1 << 24 or not 2.0**-32 <= float(scale) < 256.0:
        raise UnsupportedOpError(
            f"{op_type}: x_scale / (y_scale * image_size) = {float(scale)} with an image of {image_size} values is "
            "outside the range onnxruntime computes ([2^-32, 256), fewer than 2^24 values); rescale the model"
        )
    return scale
