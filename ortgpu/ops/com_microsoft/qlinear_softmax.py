"""com.microsoft's QLinearSoftmax: the Softmax of ``quantize_static``'s QOperator format, on uint8/int8 tensors.

Inputs X, X_scale, x_zero_point (optional, unused: softmax does not change when every input moves by the same
amount), y_scale, y_zero_point; attributes ``opset`` (required: the ai.onnx opset of the Softmax it replaces) and
``axis`` (default -1: the schema's default, which onnxruntime applies before its kernel's opset-dependent one).
Before opset 13 each row is everything from ``axis`` on (the input coerced to 2-D), from 13 the single ``axis``; D
is the row's length.

onnxruntime's CPU kernel, reproduced by the reference: a 256-entry float32 table of exponentials built in float64,
``T[i] = f32(exp((i - 255 + shift) * x_scale))`` with ``shift = max(0, log(f32(FLT_MAX / D)) - 5) / x_scale`` (so
that D terms sum below ``FLT_MAX``); per row, with ``m`` the row's largest byte, each element's term ``T[x - m +
255]``, the float32 sum of the terms in row order, then ``round_half_even(f32(f32(term / sum) * floor(1 / y_scale)))
+ y_zero_point`` saturated to the output type.  The kernel that onnxruntime 1.32 ships is not the one its published
source shows (the source wraps int8 results and overflows for one-element rows; the shipped kernel saturates and
does not), so the order of its last float32 operations is inferred from its outputs: random tests agree on every
element but a few near rounding ties, where the result is one quantization step away.

On the device (X_scale, y_scale and y_zero_point constant, as ``quantize_static`` writes them), two kernels compute
the reference's bytes.  The table is built on the host at plan time and rides in the kernels' uniform ``params``.
The first kernel gives each row its largest byte and the float32 sum of its terms, added one by one in row order
by one invocation per row: WGSL's f32 addition is correctly rounded, so the sum is the reference's, float for float
(a parallel reduction would add in another order and move sums by a few units in the last place, hence outputs by
one step near ties).  The second writes the outputs, four bytes per invocation, without any float arithmetic: the
quotient ``term / sum`` is divided out in integers (a 24-step long division of the significands, rounded to nearest
even: WGSL's own f32 division is not correctly rounded, its error bound is 2.5 units in the last place), and
since the output byte is a non-decreasing function of that quotient, the host lists (at plan time, with the
reference's own arithmetic) the smallest quotient giving each output step, and the kernel finds the quotient's step
by a binary search in that list.  Only a device that flushes subnormal partial sums to zero could differ, in rows
whose leading terms underflow and then only at a rounding tie.  Scales or a zero point computed at run time, and
scales no quantization uses (zero, negative, not finite), run on the CPU.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import InvalidModelError, ShapeError, UnsupportedOpError

from ..._types import element_count
from .._kernel import (
    Binding,
    DeviceCaps,
    KernelSpec,
    NotOnDevice,
    Operator,
    OpPlan,
    TensorInfo,
    check_loop_budget,
)
from .._registry import register
from .._wgsl import (
    LINEAR_INVOCATION,
    check_binding_sizes,
    grid_for,
    kernel_entry,
    load_function,
    storage_declaration,
    store_statements,
    workgroup_size_for,
)

__all__ = ["QLinearSoftmax", "exponential_table", "quotient_thresholds"]

F32 = np.float32
_BYTES = (np.dtype(np.uint8), np.dtype(np.int8))
#: The ai.onnx opset from which Softmax normalizes along one axis (before: everything from ``axis`` on).
_ONE_AXIS_OPSET = 13
#: The bits of float32 1.0, the largest quotient ``term / sum`` (a term is one of the sum's non-negative addends).
_ONE_BITS = 0x3F800000
#: The bits of float32's smallest normal value: the device's quotients below it are flushed to zero.
_SMALLEST_NORMAL_BITS = 0x00800000
#: An entry past the last step of :func:`quotient_thresholds` (above every quotient's bits).
_NO_STEP = 0xFFFFFFFF
#: The kernels' uniform ``params``: the table's 256 float32 bits, then the 256 quotient thresholds.
_PARAMS_WORDS = 512


def exponential_table(x_scale: float, length: int) -> np.ndarray:
    """onnxruntime's 256 float32 exponentials for rows of ``length`` terms (indexed by ``x - row_max + 255``)."""
    largest = F32(np.finfo(F32).max) / F32(length)
    # scales no quantization uses (zero, negative) give NaN or infinite terms, as they do in onnxruntime
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        shift = np.float64(max(0.0, math.log(float(largest)) - 5.0)) / np.float64(x_scale)
        return np.array([_exp((float(i) - 255.0 + float(shift)) * float(x_scale)) for i in range(256)]).astype(F32)


def _exp(value: float) -> float:
    """``exp`` in float64 (the C library's, as onnxruntime's), infinite where it overflows."""
    try:
        return math.exp(value)
    except OverflowError:
        return math.inf


def _requantize(quotients: np.ndarray, y_scale: np.float32, zero: int, dtype: np.dtype[Any]) -> np.ndarray:
    """The output bytes of float32 quotients ``term / sum``: ``round_half_even(f32(q * floor(1 / y_scale))) + zero``
    saturated (NaN to zero, infinities to the ends), as onnxruntime's kernel computes them."""
    info = np.iinfo(dtype)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        steps = F32(np.floor(F32(1.0) / y_scale))
        scaled = (np.asarray(quotients, dtype=F32) * steps).astype(F32)
    rounded = np.rint(np.nan_to_num(scaled.astype(np.float64), nan=0.0, posinf=info.max, neginf=info.min))
    result: np.ndarray = np.clip(rounded + zero, info.min, info.max).astype(dtype)
    return result


def quotient_thresholds(y_scale: np.float32, zero: int, dtype: np.dtype[Any]) -> np.ndarray:
    """256 uint32: entry ``k - 1`` holds the bits of the smallest float32 quotient in [0, 1] whose output byte is ``zero
    + k`` or more (:func:`_requantize`, for ``y_scale > 0``: non-decreasing in the quotient, ``zero`` at 0); entries
    past the last step hold ``0xFFFFFFFF``.  A quotient's output is ``zero`` plus the count of entries at or below its
    bits (non-negative float32 values order as their bits do)."""

    def level(bits: np.ndarray) -> np.ndarray:
        values = _requantize(bits.astype(np.uint32).view(F32), y_scale, zero, dtype)
        result: np.ndarray = values.astype(np.int64) - zero
        return result

    top = int(level(np.array([_ONE_BITS]))[0])
    targets = np.arange(1, top + 1)
    low = np.zeros(top, np.int64)  # level(low) < target
    high = np.full(top, _ONE_BITS, np.int64)  # level(high) >= target
    while np.any(high - low > 1):
        middle = (low + high) // 2
        reached = level(middle) >= targets
        high, low = np.where(reached, middle, high), np.where(reached, low, middle)
    thresholds = np.full(256, _NO_STEP, np.uint32)
    thresholds[:top] = high
    return thresholds


def _scalar(op_type: str, value: np.ndarray | None, what: str) -> Any:
    if value is None:
        raise ShapeError(f"{op_type}: {what} is required")
    if value.size != 1 or value.ndim > 1:
        raise ShapeError(f"{op_type}: {what} must be a scalar or one value, got shape {value.shape}")
    return value.reshape(-1)[0]


def _row_sums(rows: np.ndarray, table: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For ``rows`` of shape (before, D, after) (int64 values; each row runs along axis 1): each element's term, and
    each row's largest value and float32 sum of terms added in row order, as onnxruntime adds them."""
    largest = rows.max(axis=1)
    terms = table[rows - largest[:, None, :] + 255]
    sums = np.zeros(largest.shape, dtype=F32)
    for column in range(rows.shape[1]):
        sums = (sums + terms[:, column, :]).astype(F32)
    return terms, largest, sums


# ---------------------------------------------------------------------------------------------------------------------
# Device kernels.  Both bind X (binding 0) and the uniform params (binding 1: the table's float32 bits, then the
# quotient thresholds); the row statistics (each row's largest value as i32 bits, then its sum's f32 bits) live in
# scratch buffer 0, two words per row, rows in (before, after) order.

_CONSTANTS = (
    f"@group(0) @binding(1) var<uniform> constants: array<vec4<u32>, {_PARAMS_WORDS // 4}>;\n"
    "fn constant(i: u32) -> u32 { return constants[i >> 2u][i & 3u]; }\n"
)

#: The bits of ``t / s`` for the bits of a finite float32 ``t >= 0`` and a normal float32 ``s >= t``, rounded to
#: nearest even, in integers (a restoring division of the 24-bit significands: WGSL's f32 division is not correctly
#: rounded).  Quotients below float32's smallest normal value come back as 0.
_QUOTIENT_WGSL = """
fn quotient_bits(t: u32, s: u32) -> u32 {
  if (t == 0u) { return 0u; }
  var top = t & 0x7fffffu;
  var exponent = i32(t >> 23u);
  if (exponent == 0) {
    let shift = countLeadingZeros(top) - 8u;
    top = top << shift;
    exponent = 1 - i32(shift);
  } else {
    top = top | 0x800000u;
  }
  let bottom = (s & 0x7fffffu) | 0x800000u;
  exponent = exponent - i32(s >> 23u) + 127;
  var rest = top;
  if (rest < bottom) {
    rest = rest << 1u;
    exponent = exponent - 1;
  }
  var quotient = 0u;
  for (var i = 0u; i < 24u; i = i + 1u) {
    quotient = quotient << 1u;
    if (rest >= bottom) {
      rest = rest - bottom;
      quotient = quotient | 1u;
    }
    rest = rest << 1u;
  }
  if (exponent <= 0) { return 0u; }
  let up = select(0u, 1u, rest > bottom || (rest == bottom && (quotient & 1u) == 1u));
  return ((u32(exponent) << 23u) | (quotient & 0x7fffffu)) + up;
}
"""


def _byte_rows(info: TensorInfo, layout: tuple[int, int, int], data: np.ndarray) -> np.ndarray:
    """X's bytes as int64 values of shape ``layout``."""
    return data[: info.nbytes].view(info.dtype).reshape(layout).astype(np.int64)


def _statistics_kernel(x: TensorInfo, layout: tuple[int, int, int], params: bytes, caps: DeviceCaps) -> KernelSpec:
    """One invocation per row: its largest value, then the float32 sum of its terms in row order."""
    before, length, after = layout
    rows = before * after
    row_start = f"r * {length}u" if after == 1 else f"(r / {after}u) * {length * after}u + r % {after}u"
    wgsl = (
        storage_declaration(0, "src", writable=False)
        + _CONSTANTS
        + storage_declaration(2, "stats", writable=True)
        + load_function("load", "src", x.dtype)
        + "fn element(start: u32, d: u32) -> i32 {\n"
        f"  return i32(load(start + d * {after}u));\n"
        "}\n"
    )
    body = (
        f"  let r = {LINEAR_INVOCATION};\n"
        f"  if (r >= {rows}u) {{ return; }}\n"
        f"  let start = {row_start};\n"
        "  var largest = element(start, 0u);\n"
        f"  for (var d = 1u; d < {length}u; d = d + 1u) {{ largest = max(largest, element(start, d)); }}\n"
        "  var total: f32 = 0.0;\n"
        f"  for (var d = 0u; d < {length}u; d = d + 1u) {{\n"
        "    total = total + bitcast<f32>(constant(u32(element(start, d) - largest + 255)));\n"
        "  }\n"
        "  stats[2u * r] = bitcast<u32>(largest);\n"
        "  stats[2u * r + 1u] = bitcast<u32>(total);\n"
    )
    table = np.frombuffer(params, dtype=F32)[:256]

    def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        _, largest, sums = _row_sums(_byte_rows(x, layout, arrays[0]), table)
        stats = np.stack([largest.reshape(-1).astype(np.int32).view(np.uint32), sums.reshape(-1).view(np.uint32)], 1)
        arrays[2][: 8 * rows] = stats.reshape(-1).view(np.uint8)

    workgroup = workgroup_size_for(caps.limits, 64)
    return KernelSpec(
        name="QLinearSoftmax",
        wgsl=wgsl + kernel_entry(workgroup, body),
        grid=grid_for(rows, workgroup, caps.limits),
        bindings=(Binding("input", 0), Binding("params"), Binding("scratch", 0)),
        twin=twin,
        params=params,
    )


def _output_kernel(
    x: TensorInfo, layout: tuple[int, int, int], params: bytes, zero: int, caps: DeviceCaps
) -> KernelSpec:
    """Four output bytes per invocation: each element's term divided by its row's sum, then its output step."""
    before, length, after = layout
    rows = before * after
    row = f"j / {length}u" if after == 1 else f"(j / {length * after}u) * {after}u + j % {after}u"
    search = "".join(
        f"  if (constant({256 + size - 1}u + step) <= q) {{ step = step + {size}u; }}\n"
        for size in (128, 64, 32, 16, 8, 4, 2, 1)
    )
    wgsl = (
        storage_declaration(0, "src", writable=False)
        + _CONSTANTS
        + storage_declaration(2, "stats", writable=False)
        + storage_declaration(3, "dst", writable=True)
        + load_function("load", "src", x.dtype)
        + _QUOTIENT_WGSL
        + "fn value(j: u32) -> i32 {\n"
        f"  let r = {row};\n"
        "  let term = constant(u32(i32(load(j)) - bitcast<i32>(stats[2u * r]) + 255));\n"
        "  let q = quotient_bits(term, stats[2u * r + 1u]);\n"
        "  var step = 0u;\n"
        f"{search}"
        f"  return {zero} + i32(step);\n"
        "}\n"
    )
    count = before * length * after
    invocations = -(-count // 4)
    words = np.frombuffer(params, dtype=np.uint32)
    table, thresholds = words[:256].view(F32), words[256:]
    smallest_normal = np.uint32(_SMALLEST_NORMAL_BITS).view(F32)

    def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        values = _byte_rows(x, layout, arrays[0])
        stats = arrays[2][: 8 * rows].view(np.uint32).reshape(before, after, 2)
        largest, sums = stats[..., 0].view(np.int32).astype(np.int64), stats[..., 1].view(F32)
        terms = table[values - largest[:, None, :] + 255]
        quotients = (terms / sums[:, None, :]).astype(F32)
        quotients[quotients < smallest_normal] = 0
        steps = np.searchsorted(thresholds, quotients.view(np.uint32), side="right")
        arrays[3][:count] = (steps + zero).astype(x.dtype).reshape(-1).view(np.uint8)

    workgroup = workgroup_size_for(caps.limits)
    guard = f"  let w = {LINEAR_INVOCATION};\n  if (w >= {invocations}u) {{ return; }}\n"
    return KernelSpec(
        name="QLinearSoftmax",
        wgsl=wgsl + kernel_entry(workgroup, guard + store_statements(np.dtype(x.dtype), count, "value")),
        grid=grid_for(invocations, workgroup, caps.limits),
        bindings=(Binding("input", 0), Binding("params"), Binding("scratch", 0), Binding("output", 0)),
        twin=twin,
        params=params,
    )


@register
class QLinearSoftmax(Operator):
    op_type = "QLinearSoftmax"
    domain = "com.microsoft"
    since_version = 1

    def _rows(self, shape: tuple[int, ...], attrs: Mapping[str, Any]) -> tuple[int, int, int]:
        """The row layout (before, D, after): the input seen as (before, D, after) with rows along the middle axis."""
        if "opset" not in attrs:
            raise InvalidModelError(
                f"{self.op_type}: the 'opset' attribute is required (the ai.onnx opset of the Softmax it replaces)"
            )
        flattened = int(attrs["opset"]) < _ONE_AXIS_OPSET
        # the schema's default (-1) applies whatever the opset: onnxruntime reads it before its own opset-12 default
        axis = int(attrs.get("axis", -1))
        rank = len(shape)
        if rank == 0 or not -rank <= axis < rank:
            raise ShapeError(f"{self.op_type}: axis {axis} out of range for an input of shape {shape}")
        axis %= rank
        if flattened:
            return element_count(shape[:axis]), element_count(shape[axis:]), 1
        return element_count(shape[:axis]), int(shape[axis]), element_count(shape[axis + 1 :])

    def _parameters(
        self, x_dtype: np.dtype[Any], inputs: Sequence[np.ndarray | None]
    ) -> tuple[np.float32, np.float32, int]:
        """(X_scale, y_scale, y_zero_point) from the node's inputs, checked."""
        if x_dtype not in _BYTES:
            raise UnsupportedOpError(f"{self.op_type}: X of dtype {x_dtype} (uint8 or int8 expected)")
        x_scale, y_scale = inputs[1], inputs[3] if len(inputs) > 3 else None
        y_zero = inputs[4] if len(inputs) > 4 else None
        for value, what in ((x_scale, "X_scale"), (y_scale, "y_scale")):
            if value is not None and value.dtype != np.float32:
                raise UnsupportedOpError(f"{self.op_type}: {what} of dtype {value.dtype} (float32 expected)")
        if y_zero is not None and y_zero.dtype != x_dtype:
            raise UnsupportedOpError(f"{self.op_type}: y_zero_point of dtype {y_zero.dtype} differs from X's {x_dtype}")
        scale_in = F32(_scalar(self.op_type, x_scale, "X_scale"))
        scale_out = F32(_scalar(self.op_type, y_scale, "y_scale"))
        return scale_in, scale_out, int(_scalar(self.op_type, y_zero, "y_zero_point"))

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        scale_in, scale_out, zero = self._parameters(x.dtype, inputs)
        layout = self._rows(x.shape, attrs)
        if x.size == 0:
            return [np.empty(x.shape, dtype=x.dtype)]
        table = exponential_table(float(scale_in), layout[1])
        terms, _, sums = _row_sums(x.reshape(layout).astype(np.int64), table)
        with np.errstate(divide="ignore", invalid="ignore"):
            quotients = (terms / sums[:, None, :]).astype(F32)
        return [_requantize(quotients, scale_out, zero, x.dtype).reshape(x.shape)]

    def output_shapes(
        self, inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
    ) -> list[tuple[int, ...]] | None:
        x = inputs[0]
        assert x is not None
        self._rows(x.shape, attrs)  # a bad axis or a missing opset is the model's error
        return [tuple(x.shape)]

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
        layout = self._rows(tuple(x.shape), attrs)  # a bad axis or a missing opset is the model's error
        missing = [
            index for index in (1, 3, 4) if len(inputs) > index and inputs[index] is not None and index not in constants
        ]
        if missing:
            raise NotOnDevice(
                f"{self.op_type}: scales or zero points computed at run time (inputs {missing}) run on the CPU (the "
                "device kernels use a table of exponentials and output thresholds built from them at plan time)"
            )
        given = [constants.get(index) if index else None for index in range(len(inputs))]
        scale_in, scale_out, zero = self._parameters(np.dtype(x.dtype), given)
        if x.size == 0:
            return OpPlan()
        with np.errstate(divide="ignore", over="ignore"):
            usable = 0 < scale_in < np.inf and 0 < scale_out < np.inf and np.isfinite(F32(1.0) / scale_out)
        if not usable:
            raise NotOnDevice(
                f"{self.op_type}: X_scale {float(scale_in)} and y_scale {float(scale_out)} must be positive and finite "
                "(with 1 / y_scale finite) for the device kernels; this node runs on the CPU"
            )
        thresholds = quotient_thresholds(scale_out, zero, np.dtype(x.dtype))
        if thresholds[0] <= _SMALLEST_NORMAL_BITS:
            raise NotOnDevice(
                f"{self.op_type}: y_scale {float(scale_out)} makes quotients below float32's smallest normal value "
                "count, which the device kernel flushes to zero; this node runs on the CPU"
            )
        check_loop_budget(self.op_type, 2 * layout[1], caps)
        check_binding_sizes(self.op_type, [x, outputs[0]], caps)
        params = np.concatenate([exponential_table(float(scale_in), layout[1]).view(np.uint32), thresholds]).tobytes()
        if len(params) > caps.limits.max_uniform_buffer_binding_size:
            raise NotOnDevice(f"{self.op_type}: its {len(params)}-byte table exceeds the uniform binding limit")
        kernels = (_statistics_kernel(x, layout, params, caps), _output_kernel(x, layout, params, zero, caps))
        return OpPlan(kernels=kernels, scratch_sizes=(8 * layout[0] * layout[2],))
