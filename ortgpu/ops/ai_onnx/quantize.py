"""QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear (CPU references).

Quantization granularity follows the scale's shape: a scalar (or one value) is
per tensor; a 1-D scale of the axis's length is per axis (opset 13); with
``block_size`` (opset 21) the scale has the input's rank and each of its
entries covers ``block_size`` consecutive entries along ``axis``.

``QuantizeLinear``: ``y = saturate(round_half_even(x / scale) + zero_point)``,
the division in the scale's dtype (or ``precision``'s, opset 23).  NaN
quantizes to the type's lowest value and infinities saturate, as onnxruntime
does.  Output types uint8, int8, uint16 and int16; float8/4-bit/2-bit types are
refused (numpy cannot hold them).

``DequantizeLinear``: ``y = (x - zero_point) * scale``: the difference is exact,
the product is computed in float32 and rounded once to the output dtype (the
scale's, or ``output_dtype``).  Inputs uint8/int8/uint16/int16/int32 (int32 has
no zero point), and int4/uint4 (opset 21): the references widen them to int8/uint8,
and the planner widens 4-bit constants before planning (:mod:`ortgpu._four_bit`),
so the device reads them as 8-bit inputs.  It runs on the device per tensor and per axis (blocked scales
run on the CPU): WGSL's f32 product is correctly rounded, and the difference is
converted to f32 exactly (8/16-bit differences are exact in f32; int32 inputs
are converted as ``f32(x >> 16) * 65536 + f32(x & 0xffff)``, two exact terms
whose sum is rounded once, as numpy's conversion rounds).

QuantizeLinear runs on the device for float32/float16 inputs and float32 scales
(per tensor and per axis).  WGSL's f32 division is not correctly rounded (2.5 ULP),
which would move values across rounding ties, so the kernel divides on the
bits: an exact long division of the 24-bit significands, rounded to nearest
even (:data:`EXACT_DIVISION_WGSL`); NaN and infinities are recognised on the
bits too (WGSL implementations may assume floats are finite).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import onnx.helper

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ..._types import FOUR_BIT_DTYPES, element_count
from .._kernel import (
    Binding,
    DeviceCaps,
    KernelSpec,
    NotOnDevice,
    Operator,
    OpPlan,
    TensorInfo,
    check_loop_budget,
    reference_twin,
)
from .._registry import register
from .._wgsl import (
    LINEAR_INVOCATION,
    check_binding_sizes,
    grid_for,
    kernel_entry,
    storage_declaration,
    store_statements,
    workgroup_size_for,
)
from .._wgsl_kernels import Operand, elementwise_plan

__all__ = [
    "QuantizeLinear",
    "DequantizeLinear",
    "DynamicQuantizeLinear",
    "saturate_round",
    "expand_parameter",
    "EXACT_DIVISION_WGSL",
    "QUANTIZE_U8_WGSL",
    "dynamic_range_wgsl",
]

#: ``div_bits(a, b)``: the bits of the correctly rounded f32 quotient of the f32 values with bits ``a`` and ``b``
#: (round to nearest even, subnormal quotients included), by long division of the significands; IEEE results for
#: zeros, infinities and NaN.
EXACT_DIVISION_WGSL = """
fn significand_bits(bits: u32) -> vec2<u32> {
  let e = (bits >> 23u) & 0xffu;
  let f = bits & 0x7fffffu;
  if (e == 0u) {
    let s = countLeadingZeros(f) - 8u;
    return vec2<u32>(f << s, bitcast<u32>(1 - i32(s)));
  }
  return vec2<u32>(f | 0x800000u, e);
}
fn div_bits(a: u32, b: u32) -> u32 {
  let sign = (a ^ b) & 0x80000000u;
  let abs_a = a & 0x7fffffffu;
  let abs_b = b & 0x7fffffffu;
  if (abs_a > 0x7f800000u || abs_b > 0x7f800000u) { return 0x7fc00000u; }
  if (abs_a == 0x7f800000u) { return select(sign | 0x7f800000u, 0x7fc00000u, abs_b == 0x7f800000u); }
  if (abs_b == 0x7f800000u) { return sign; }
  if (abs_b == 0u) { return select(sign | 0x7f800000u, 0x7fc00000u, abs_a == 0u); }
  if (abs_a == 0u) { return sign; }
  let na = significand_bits(abs_a);
  let nb = significand_bits(abs_b);
  var r = na.x;
  let m = nb.x;
  var e = bitcast<i32>(na.y) - bitcast<i32>(nb.y) + 127;
  if (r < m) { r = r << 1u; e = e - 1; }
  var q = 0u;
  for (var i = 0u; i < 25u; i = i + 1u) {
    q = q << 1u;
    if (r >= m) { q = q | 1u; r = r - m; }
    r = r << 1u;
  }
  if (e <= 0) {
    // A subnormal quotient: q / 2^shift, rounded to nearest even with the remainder as sticky bit.
    let shift = u32(2 - e);
    if (shift >= 32u) { return sign; }
    let kept = q >> shift;
    let rest = q & ((1u << shift) - 1u);
    let half = 1u << (shift - 1u);
    let up = rest > half || (rest == half && (r != 0u || (kept & 1u) == 1u));
    return sign | (kept + select(0u, 1u, up));
  }
  var mantissa = q >> 1u;
  if ((q & 1u) == 1u && (r != 0u || (mantissa & 1u) == 1u)) { mantissa = mantissa + 1u; }
  if (mantissa == 0x1000000u) { mantissa = 0x800000u; e = e + 1; }
  if (e >= 255) { return sign | 0x7f800000u; }
  return sign | (u32(e) << 23u) | (mantissa & 0x7fffffu);
}
"""

#: ``quantize_u8(bits, scale, zero)``: DynamicQuantizeLinear's code of the float with bits ``bits``:
#: ``saturate(round_half_even(x / scale) + zero)`` with the exact quotient; NaN gives 0, infinities saturate.
#: Needs :data:`EXACT_DIVISION_WGSL`.
QUANTIZE_U8_WGSL = """
fn quantize_u8(bits: u32, scale: u32, zero: u32) -> u32 {
  let quotient = div_bits(bits, scale);
  let magnitude = quotient & 0x7fffffffu;
  if (magnitude > 0x7f800000u) { return 0u; }
  if (magnitude == 0x7f800000u) { return select(255u, 0u, (quotient >> 31u) == 1u); }
  let q = round(bitcast<f32>(quotient)) + f32(zero & 0xffu);
  return u32(clamp(q, 0.0, 255.0));
}
"""


def dynamic_range_wgsl(workgroup: int) -> str:
    """WGSL ``fn dynamic_range(lid: u32, first: u32, count: u32) -> vec2<u32>``: DynamicQuantizeLinear's (scale
    bits, zero point) of the ``count`` floats whose bits ``range_bits(first + i)`` returns (a function the kernel
    defines), found by one workgroup of ``workgroup`` invocations.  Every invocation calls it in uniform control
    flow and gets the result.  The range is taken on order-preserving integer keys of the float bits, NaN left out;
    the divisions are exact; an infinite range gives scale infinity and zero point 0 (255 when the minimum is -inf,
    as onnxruntime computes it).  Includes :data:`EXACT_DIVISION_WGSL`."""
    return (
        EXACT_DIVISION_WGSL
        + f"var<workgroup> range_lows: array<u32, {workgroup}>;\n"
        + f"var<workgroup> range_highs: array<u32, {workgroup}>;\n"
        # Float bits -> unsigned keys in the floats' order (-0 as +0).
        + "fn range_key(bits: u32) -> u32 {\n"
        "  if (bits == 0x80000000u) { return 0x80000000u; }\n"
        "  return select(bits | 0x80000000u, ~bits, (bits & 0x80000000u) != 0u);\n"
        "}\n"
        "fn range_unkey(k: u32) -> u32 { return select(~k, k & 0x7fffffffu, (k & 0x80000000u) != 0u); }\n"
        "fn dynamic_range(lid: u32, first: u32, count: u32) -> vec2<u32> {\n"
        "  var low = 0x80000000u;\n"
        "  var high = 0x80000000u;\n"
        f"  for (var i = lid; i < count; i = i + {workgroup}u) {{\n"
        "    let bits = range_bits(first + i);\n"
        "    if ((bits & 0x7fffffffu) <= 0x7f800000u) {\n"
        "      low = min(low, range_key(bits));\n"
        "      high = max(high, range_key(bits));\n"
        "    }\n"
        "  }\n"
        "  workgroupBarrier();\n"
        "  range_lows[lid] = low;\n"
        "  range_highs[lid] = high;\n"
        "  workgroupBarrier();\n"
        f"  for (var half = {workgroup // 2}u; half > 0u; half = half / 2u) {{\n"
        "    if (lid < half) {\n"
        "      range_lows[lid] = min(range_lows[lid], range_lows[lid + half]);\n"
        "      range_highs[lid] = max(range_highs[lid], range_highs[lid + half]);\n"
        "    }\n"
        "    workgroupBarrier();\n"
        "  }\n"
        "  let low_bits = range_unkey(range_lows[0]);\n"
        "  let high_bits = range_unkey(range_highs[0]);\n"
        "  workgroupBarrier();\n"
        "  var scale = 0x7f800000u;\n"
        # -inf / inf is NaN: onnxruntime's clamp makes that zero point 255
        "  var zero = select(0u, 255u, low_bits == 0xff800000u);\n"
        "  if ((low_bits & 0x7fffffffu) < 0x7f800000u && high_bits < 0x7f800000u) {\n"
        # two subnormals (exponent 0) add as integers, exactly: GPUs that flush subnormals (NVIDIA's) gave 0
        "    var range = bitcast<f32>(high_bits) - bitcast<f32>(low_bits);\n"
        "    if (((high_bits | low_bits) & 0x7f800000u) == 0u) {\n"
        "      range = bitcast<f32>(high_bits + (low_bits & 0x7fffffffu));\n"
        "    }\n"
        "    if (bitcast<u32>(range) < 0x7f800000u) {\n"
        "      scale = div_bits(bitcast<u32>(range), bitcast<u32>(255.0));\n"
        "      if (scale == 0u) { scale = bitcast<u32>(1.0); }\n"
        "      let shifted = round(-bitcast<f32>(div_bits(low_bits, scale)));\n"
        "      zero = u32(clamp(shifted, 0.0, 255.0));\n"
        "    }\n"
        "  }\n"
        "  return vec2<u32>(scale, zero);\n"
        "}\n"
    )


#: Quantized types numpy holds, by ONNX element type.
_QUANTIZED: dict[int, np.dtype[Any]] = {
    int(onnx.TensorProto.UINT8): np.dtype(np.uint8),
    int(onnx.TensorProto.INT8): np.dtype(np.int8),
    int(onnx.TensorProto.UINT16): np.dtype(np.uint16),
    int(onnx.TensorProto.INT16): np.dtype(np.int16),
}


def _widened_four_bit(value: np.ndarray) -> np.ndarray:
    """An int4/uint4 array as int8/uint8 of the same values (4-bit constants load as ml_dtypes arrays)."""
    if value.dtype in FOUR_BIT_DTYPES:
        return value.astype(np.int8 if value.dtype.name == "int4" else np.uint8)
    return value


def _element_type_name(element_type: int) -> str:
    try:
        return str(onnx.TensorProto.DataType.Name(element_type))
    except ValueError:
        return str(element_type)


def saturate_round(values: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """``values`` (float, already divided by the scale and offset by the zero point) rounded half to even and
    saturated to integer ``dtype``; NaN gives the lowest value (onnxruntime's result)."""
    info = np.iinfo(dtype)
    rounded = np.rint(values.astype(np.float64))
    rounded = np.where(np.isnan(rounded), info.min, rounded)
    return np.clip(rounded, info.min, info.max).astype(dtype)


def expand_parameter(
    op_type: str, value: np.ndarray, shape: tuple[int, ...], axis: int, block_size: int, opset: int
) -> np.ndarray:
    """A scale or zero point broadcast to ``shape`` by the granularity its own shape says."""
    rank = len(shape)
    if block_size > 0:
        if value.ndim != rank:
            raise ShapeError(f"{op_type}: a blocked scale must have the input's rank {rank}, got {value.shape}")
        if not -rank <= axis < rank:
            raise UnsupportedOpError(f"{op_type}: axis {axis} is out of range for rank {rank}")
        axis = axis + rank if axis < 0 else axis
        blocks = value.shape[axis]
        for d in range(rank):
            if d != axis and value.shape[d] != shape[d]:
                raise ShapeError(f"{op_type}: blocked scale {value.shape} does not match the input {shape} off axis")
        if blocks * block_size < shape[axis] or (blocks - 1) * block_size >= max(shape[axis], 1):
            raise ShapeError(
                f"{op_type}: {blocks} blocks of {block_size} do not cover axis {axis} of length {shape[axis]}"
            )
        repeated = np.repeat(value, block_size, axis=axis)
        return np.array(repeated[tuple(slice(0, n) for n in shape)])
    if value.size == 1 and value.ndim <= 1:
        return value.reshape(())
    if opset < 13:
        raise ShapeError(f"{op_type} (opset {opset}): the scale must be a scalar, got shape {value.shape}")
    if value.ndim != 1:
        raise ShapeError(f"{op_type}: a per-axis scale must be 1-D, got shape {value.shape} (block_size not set)")
    if not -rank <= axis < rank:
        raise UnsupportedOpError(f"{op_type}: axis {axis} is out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis
    if value.shape[0] != shape[axis]:
        raise ShapeError(f"{op_type}: a scale of {value.shape[0]} values for axis {axis} of length {shape[axis]}")
    return value.reshape((1,) * axis + (-1,) + (1,) * (rank - axis - 1))


def _per_axis_shape(
    op_type: str, shape: tuple[int, ...], scale_shape: tuple[int, ...], attrs: Mapping[str, Any], opset: int
) -> tuple[int, ...]:
    """The shape a per-tensor or per-axis scale broadcasts from (blocked scales are the caller's business)."""
    rank = len(shape)
    if element_count(scale_shape) == 1 and len(scale_shape) <= 1:
        return ()
    if opset >= 13 and len(scale_shape) == 1 and rank > 0:
        axis = int(attrs.get("axis", 1))
        if not -rank <= axis < rank or scale_shape[0] != shape[axis]:
            raise ShapeError(f"{op_type}: scale {scale_shape} for axis {axis} of {shape}")
        axis = axis + rank if axis < 0 else axis
        return (1,) * axis + (scale_shape[0],) + (1,) * (rank - axis - 1)
    raise ShapeError(f"{op_type} (opset {opset}): scale shape {scale_shape} for input {shape}")


def _float_dtype(op_type: str, element_type: int, what: str) -> np.dtype[Any]:
    if element_type == onnx.TensorProto.FLOAT:
        return np.dtype(np.float32)
    if element_type == onnx.TensorProto.FLOAT16:
        return np.dtype(np.float16)
    raise UnsupportedOpError(
        f"{op_type}: {what} {_element_type_name(element_type)} is not supported (float32 or float16)"
    )


def _check_parameters(op_type: str, scale: np.ndarray, zero_point: np.ndarray | None) -> None:
    if scale.dtype not in (np.float32, np.float16):
        raise UnsupportedOpError(f"{op_type}: scales of dtype {scale.dtype} are not supported (float32 or float16)")
    if zero_point is not None and zero_point.shape != scale.shape:
        if not (zero_point.size == 1 and scale.size == 1):
            raise ShapeError(f"{op_type}: zero point shape {zero_point.shape} differs from the scale's {scale.shape}")


@register
class QuantizeLinear(Operator):
    op_type = "QuantizeLinear"
    since_version = 10
    opset_changes = (13, 23)

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, scale = inputs[0], inputs[1]
        assert x is not None and scale is not None
        zero_point = inputs[2] if len(inputs) > 2 else None
        _check_parameters(self.op_type, scale, zero_point)
        if x.dtype not in (np.float32, np.float16, np.int32):
            raise UnsupportedOpError(f"QuantizeLinear: inputs of dtype {x.dtype} are not supported")
        dtype: np.dtype[Any] = np.dtype(np.uint8) if zero_point is None else zero_point.dtype
        output_dtype = int(attrs.get("output_dtype", 0))
        if output_dtype:
            if output_dtype not in _QUANTIZED:
                raise UnsupportedOpError(
                    f"QuantizeLinear: output_dtype {_element_type_name(output_dtype)} is not supported "
                    "(uint8, int8, uint16 or int16)"
                )
            if zero_point is not None and _QUANTIZED[output_dtype] != dtype:
                raise ShapeError("QuantizeLinear: output_dtype differs from the zero point's type")
            dtype = _QUANTIZED[output_dtype]
        if dtype not in _QUANTIZED.values():
            raise UnsupportedOpError(f"QuantizeLinear: quantizing to {dtype} is not supported")
        precision = scale.dtype if self.opset < 23 or not attrs.get("precision") else None
        if precision is None:
            precision = _float_dtype(self.op_type, int(attrs["precision"]), "precision")
        axis, block_size = int(attrs.get("axis", 1)), int(attrs.get("block_size", 0))
        full_scale = expand_parameter(self.op_type, scale, x.shape, axis, block_size, self.opset).astype(precision)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            quotient = (x.astype(precision) / full_scale).astype(precision)
        offset = (
            0.0
            if zero_point is None
            else expand_parameter(self.op_type, zero_point, x.shape, axis, block_size, self.opset).astype(np.float64)
        )
        # Round the quotient first, then add the zero point (exact in float64), then saturate.
        return [saturate_round(np.rint(quotient.astype(np.float64)) + offset, dtype)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x, scale = inputs[0], inputs[1]
        assert x is not None and scale is not None
        zero_point = inputs[2] if len(inputs) > 2 else None
        out = outputs[0]
        # float16 inputs convert to f32 exactly (the reference divides in the scale's float32 too).
        if x.dtype not in (np.float32, np.float16) or scale.dtype != np.float32:
            raise NotOnDevice(
                "QuantizeLinear: inputs other than float32/float16 or scales other than float32 run on the CPU"
            )
        if self.opset >= 23 and attrs.get("precision") and int(attrs["precision"]) != onnx.TensorProto.FLOAT:
            raise NotOnDevice("QuantizeLinear: a precision other than float32 runs on the CPU")
        if out.dtype.name not in ("uint8", "int8", "uint16", "int16"):
            raise NotOnDevice(f"QuantizeLinear: {out.dtype.name} outputs run on the CPU")
        if int(attrs.get("block_size", 0)) > 0:
            raise NotOnDevice("QuantizeLinear: blocked quantization runs on the CPU")
        broadcast_shape = _per_axis_shape(self.op_type, x.shape, scale.shape, attrs, self.opset)
        operands = [Operand(0, x), Operand(1, TensorInfo(broadcast_shape, scale.dtype))]
        if zero_point is not None:
            if zero_point.dtype != out.dtype or zero_point.size != scale.size:
                raise ShapeError(f"QuantizeLinear: zero point {zero_point.dtype}{zero_point.shape} does not fit")
            operands.append(Operand(2, TensorInfo(broadcast_shape, zero_point.dtype)))
        info = np.iinfo(out.dtype)
        helpers = EXACT_DIVISION_WGSL + (
            "fn quantize(x: f32, s: f32, zero: i32) -> i32 {\n"
            "  let bits = div_bits(bitcast<u32>(x), bitcast<u32>(s));\n"
            "  let magnitude = bits & 0x7fffffffu;\n"
            f"  if (magnitude > 0x7f800000u) {{ return {info.min}; }}\n"
            f"  if (magnitude == 0x7f800000u) {{ return select({info.max}, {info.min}, (bits >> 31u) == 1u); }}\n"
            "  let q = round(bitcast<f32>(bits)) + f32(zero);\n"
            f"  return i32(clamp(q, {float(info.min)}, {float(info.max)}));\n"
            "}\n"
        )
        expression = "quantize(x0, x1, i32(x2))" if zero_point is not None else "quantize(x0, x1, 0)"
        if out.dtype.kind == "u":  # the output's compute type is u32 (the value is in range)
            expression = f"u32({expression})"
        opset, attributes = self.opset, dict(attrs)

        def function(*arrays: np.ndarray) -> np.ndarray:
            operator = QuantizeLinear(opset)
            return operator.reference(list(arrays), attributes, outputs)[0]

        return elementwise_plan(
            "QuantizeLinear", operands, outputs, expression, caps, function, inputs, helpers=helpers
        )


@register
class DequantizeLinear(Operator):
    op_type = "DequantizeLinear"
    since_version = 10
    opset_changes = (13, 23)

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, scale = inputs[0], inputs[1]
        assert x is not None and scale is not None
        zero_point = inputs[2] if len(inputs) > 2 else None
        _check_parameters(self.op_type, scale, zero_point)
        if zero_point is not None and zero_point.dtype != x.dtype:
            raise ShapeError(f"DequantizeLinear: zero point {zero_point.dtype} differs from the input's {x.dtype}")
        # int4/uint4 (ml_dtypes arrays, opset 21) compute as the same values in int8/uint8
        x = _widened_four_bit(x)
        zero_point = None if zero_point is None else _widened_four_bit(zero_point)
        if x.dtype not in (np.uint8, np.int8, np.uint16, np.int16, np.int32):
            raise UnsupportedOpError(
                f"DequantizeLinear: inputs of dtype {x.dtype} are not supported (uint8, int8, uint16, int16, int32, "
                "int4, uint4)"
            )
        output_dtype = int(attrs.get("output_dtype", 0))
        dtype = scale.dtype if not output_dtype else _float_dtype(self.op_type, output_dtype, "output_dtype")
        axis, block_size = int(attrs.get("axis", 1)), int(attrs.get("block_size", 0))
        if x.dtype == np.int32 and zero_point is not None and np.any(zero_point != 0):
            raise UnsupportedOpError("DequantizeLinear: int32 inputs have no zero point (it must be 0)")
        difference = x.astype(np.int64)
        if zero_point is not None:
            difference = difference - expand_parameter(
                self.op_type, zero_point, x.shape, axis, block_size, self.opset
            ).astype(np.int64)
        full_scale = expand_parameter(self.op_type, scale, x.shape, axis, block_size, self.opset)
        product = difference.astype(np.float32) * full_scale.astype(np.float32)
        return [np.array(product.astype(dtype), order="C")]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x, scale = inputs[0], inputs[1]
        assert x is not None and scale is not None
        zero_point = inputs[2] if len(inputs) > 2 else None
        out = outputs[0]
        if x.dtype.name not in ("uint8", "int8", "uint16", "int16", "int32"):
            raise NotOnDevice(f"DequantizeLinear on {x.dtype.name} runs on the CPU")
        if scale.dtype.name not in ("float32", "float16") or out.dtype.name not in ("float32", "float16"):
            raise NotOnDevice("DequantizeLinear: scales and outputs other than float32/float16 run on the CPU")
        if int(attrs.get("block_size", 0)) > 0:
            raise NotOnDevice("DequantizeLinear: blocked quantization runs on the CPU")
        if out.dtype.name == "float16":
            # WGSL leaves pack2x16float of values beyond float16's range indeterminate: the device writes float16
            # only where constant scales bound every product inside it.
            span = 0 if x.dtype.name == "int32" else int(np.iinfo(x.dtype).max) - int(np.iinfo(x.dtype).min)
            bound = float(np.abs(np.asarray(constants[1], np.float64)).max()) * span if 1 in constants else np.inf
            if not bound <= 65504.0 or x.dtype.name == "int32":
                raise NotOnDevice(
                    "DequantizeLinear: float16 outputs that could exceed float16's range run on the CPU (WGSL leaves "
                    "their conversion indeterminate)"
                )
        if x.dtype.name == "int32" and zero_point is not None:
            raise NotOnDevice("DequantizeLinear: int32 with a zero point input runs on the CPU (it must be 0)")
        broadcast_shape = _per_axis_shape(self.op_type, x.shape, scale.shape, attrs, self.opset)
        if zero_point is not None and zero_point.size != scale.size:
            raise ShapeError(f"DequantizeLinear: zero point {zero_point.shape} differs from the scale {scale.shape}")
        operands = [Operand(0, x), Operand(1, TensorInfo(broadcast_shape, scale.dtype))]
        if x.dtype.name == "int32":
            # Exact int32 -> f32 conversion rounded once (WGSL leaves the rounding of f32(i32) to the device).
            difference = "(f32(x0 >> 16u) * 65536.0 + f32(x0 & 65535))"
        elif zero_point is not None:
            if zero_point.dtype != x.dtype:
                raise ShapeError(f"DequantizeLinear: zero point {zero_point.dtype} differs from the input's {x.dtype}")
            operands.append(Operand(2, TensorInfo(broadcast_shape, zero_point.dtype)))
            difference = "f32(i32(x0) - i32(x2))"
        else:
            difference = "f32(x0)"
        opset, attributes = self.opset, dict(attrs)

        def function(*arrays: np.ndarray) -> np.ndarray:
            operator = DequantizeLinear(opset)
            return operator.reference(list(arrays), attributes, outputs)[0]

        return elementwise_plan("DequantizeLinear", operands, outputs, f"{difference} * x1", caps, function, inputs)


@register
class DynamicQuantizeLinear(Operator):
    """uint8 quantization with a scale and zero point from the input's range (which always includes 0).

    A range of 0 (all zeros) gives scale 1, as onnxruntime does; NaN is left out of the range and quantizes to 0.

    On the device in two kernels: one workgroup finds the range (on order-preserving integer keys of the float
    bits, NaN skipped) and writes the scale and zero point (divisions exact, as in QuantizeLinear); then an
    elementwise kernel quantizes with them.  An infinite range (infinite inputs, or a range beyond float32) gives
    scale infinity and zero point 0 (255 when the minimum is -inf, as onnxruntime computes it).
    """

    op_type = "DynamicQuantizeLinear"
    since_version = 11

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        if x.dtype != np.float32:
            raise UnsupportedOpError(f"DynamicQuantizeLinear: inputs of dtype {x.dtype} (float32 expected)")
        finite = x[~np.isnan(x)]
        low = np.float32(min(0.0, float(finite.min()) if finite.size else 0.0))
        high = np.float32(max(0.0, float(finite.max()) if finite.size else 0.0))
        with np.errstate(invalid="ignore", over="ignore"):
            scale = np.float32((high - low) / np.float32(255))
            if scale == 0:
                scale = np.float32(1)
            shifted = np.float32(0) - low / scale
            # NaN (a range from -inf) saturates to 255 in onnxruntime's clamp; saturate_round would give 0.
            zero_point = np.uint8(255) if np.isnan(shifted) else saturate_round(np.asarray(shifted), np.dtype(np.uint8))
            quotient = (x / scale).astype(np.float32)
        y = saturate_round(np.rint(quotient.astype(np.float64)) + float(zero_point), np.dtype(np.uint8))
        return [y, np.array(scale, dtype=np.float32), np.array(zero_point, dtype=np.uint8)]

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
        if x.dtype != np.float32:
            raise NotOnDevice(f"DynamicQuantizeLinear on {x.dtype.name} runs on the CPU")
        count = x.size
        workgroup = workgroup_size_for(caps.limits)
        check_loop_budget("DynamicQuantizeLinear", -(-count // workgroup) + 2 * workgroup.bit_length(), caps)
        check_binding_sizes("DynamicQuantizeLinear", [x, *outputs], caps)
        range_wgsl = (
            storage_declaration(0, "src", writable=False)
            + storage_declaration(1, "scale_out", writable=True)
            + storage_declaration(2, "zero_out", writable=True)
            + dynamic_range_wgsl(workgroup)
            + "fn range_bits(i: u32) -> u32 { return src[i]; }\n"
            + f"@compute @workgroup_size({workgroup})\n"
            "fn main(@builtin(local_invocation_index) lid: u32) {\n"
            f"  let found = dynamic_range(lid, 0u, {count}u);\n"
            "  if (lid == 0u) {\n"
            "    scale_out[0] = found.x;\n"
            "    zero_out[0] = found.y;\n"
            "  }\n"
            "}\n"
        )
        range_bindings = (Binding("input", 0), Binding("output", 1), Binding("output", 2))

        def reference(array: np.ndarray) -> list[np.ndarray]:
            return DynamicQuantizeLinear().reference([array], {}, outputs)

        range_kernel = KernelSpec(
            name="DynamicQuantizeLinear",
            wgsl=range_wgsl,
            grid=(1, 1, 1),
            bindings=range_bindings,
            twin=reference_twin(reference, range_bindings, inputs, outputs),
        )
        kernels = [range_kernel]
        if count:
            kernels.append(self._quantize_kernel(x, outputs, caps, reference))
        return OpPlan(kernels=tuple(kernels))

    @staticmethod
    def _quantize_kernel(x: TensorInfo, outputs: Sequence[TensorInfo], caps: DeviceCaps, reference: Any) -> KernelSpec:
        """``y = saturate(round(x / scale) + zero_point)`` with the scale and zero point the range kernel wrote."""
        count = x.size
        workgroup = workgroup_size_for(caps.limits)
        invocations = -(-count // 4)
        wgsl = (
            storage_declaration(0, "src", writable=False)
            + storage_declaration(1, "scale_in", writable=False)
            + storage_declaration(2, "zero_in", writable=False)
            + storage_declaration(3, "dst", writable=True)
            + EXACT_DIVISION_WGSL
            + QUANTIZE_U8_WGSL
            + "fn value(j: u32) -> u32 { return quantize_u8(src[j], scale_in[0], zero_in[0]); }\n"
            + kernel_entry(
                workgroup,
                f"  let w = {LINEAR_INVOCATION};\n  if (w >= {invocations}u) {{ return; }}\n"
                + store_statements(np.dtype(np.uint8), count, "value"),
            )
        )
        bindings = (Binding("input", 0), Binding("output", 1), Binding("output", 2), Binding("output", 0))
        y = outputs[0]

        def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
            # Writes y only (the scale and zero point are this kernel's read-only inputs).
            values = arrays[0][: x.nbytes].view(np.float32).reshape(x.shape)
            result = np.ascontiguousarray(reference(values)[0], dtype=np.uint8)
            arrays[3][: y.nbytes] = result.reshape(-1).view(np.uint8)

        return KernelSpec(
            name="DynamicQuantizeLinear",
            wgsl=wgsl,
            grid=grid_for(invocations, workgroup, caps.limits),
            bindings=bindings,
            twin=twin,
        )
