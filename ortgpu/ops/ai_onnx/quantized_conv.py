"""ConvInteger and QLinearConv: exact integer convolutions (CPU references).

Zero points are subtracted before padding, so padded positions contribute 0
(as if padded with the zero point).  Products are summed in int64 and wrapped to
the int32 accumulator.  ``w``'s zero point (and QLinearConv's ``w_scale``) may
be per output channel.  QLinearConv adds the int32 bias and requantizes:
``saturate(round_half_even(acc * x_scale * w_scale / y_scale) + y_zero_point)``
with the multiplier in float32, as onnxruntime computes it.

Both run on the device for uint8/int8 tensors: one invocation per output
element (four per invocation for 8-bit outputs) sums over its window in WGSL's
i32 arithmetic, which wraps like the int32 accumulator (modular sums do not
depend on their order); padded positions are skipped (they contribute 0).  Zero
points and the bias are read at run time; QLinearConv needs its scales as
constants (the per-channel multipliers are computed on the host exactly as the
reference does and baked into the kernel), converts the sum to f32 exactly
(``f32(acc >> 16) * 65536 + f32(acc & 0xffff)``, rounded once), scales it with a
correctly rounded f32 product, rounds half to even (WGSL's ``round``) and
saturates.
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

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
    reference_twin,
)
from .._registry import register
from .._wgsl import (
    LINEAR_INVOCATION,
    check_binding_count,
    check_binding_sizes,
    contiguous_strides,
    elements_per_invocation,
    grid_for,
    kernel_entry,
    load_function,
    storage_declaration,
    store_statements,
    wgsl_float,
    workgroup_size_for,
)
from .conv import conv_same_totals, same_padding
from .quantize import saturate_round
from .quantized_matmul import wrap_int32

__all__ = ["ConvInteger", "QLinearConv", "integer_conv"]

_INTEGER_INPUTS = (np.dtype(np.uint8), np.dtype(np.int8))


def _pads(
    attrs: Mapping[str, Any],
    spatial: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    op_type: str,
) -> list[tuple[int, int]]:
    auto_pad = str(attrs.get("auto_pad", "NOTSET"))
    rank = len(spatial)
    if auto_pad == "NOTSET":
        pads = [int(p) for p in attrs.get("pads", [0] * (2 * rank))]
        if len(pads) != 2 * rank:
            raise ShapeError(f"{op_type}: pads {pads} for {rank} spatial axes")
        return [(pads[d], pads[d + rank]) for d in range(rank)]
    if auto_pad == "VALID":
        return [(0, 0)] * rank
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        extents = [(k - 1) * dil + 1 for k, dil in zip(kernel, dilations)]
        begin, end = same_padding(auto_pad, conv_same_totals(spatial, strides, extents))
        return list(zip(begin, end))
    raise UnsupportedOpError(f"{op_type}: auto_pad {auto_pad!r} is not supported")


def integer_conv(x: np.ndarray, w: np.ndarray, attrs: Mapping[str, Any], op_type: str) -> np.ndarray:
    """The convolution of int64 ``x`` (N, C, ...) and ``w`` (M, C/group, ...) in int64 (not yet wrapped)."""
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ShapeError(f"{op_type}: input {x.shape} and weight {w.shape} ranks")
    rank = x.ndim - 2
    group = int(attrs.get("group", 1))
    batch, channels = x.shape[:2]
    filters, per_group = w.shape[:2]
    kernel = list(w.shape[2:])
    if "kernel_shape" in attrs and [int(k) for k in attrs["kernel_shape"]] != kernel:
        raise ShapeError(f"{op_type}: kernel_shape {attrs['kernel_shape']} differs from the weight's {kernel}")
    if group < 1 or channels != per_group * group or filters % group:
        raise ShapeError(f"{op_type}: {channels} channels, weight {w.shape} and group {group} do not match")
    strides = [int(s) for s in attrs.get("strides", [1] * rank)]
    dilations = [int(d) for d in attrs.get("dilations", [1] * rank)]
    pads = _pads(attrs, x.shape[2:], kernel, strides, dilations, op_type)
    padded = np.pad(x, [(0, 0), (0, 0)] + pads)
    out_spatial = [(padded.shape[2 + d] - dilations[d] * (kernel[d] - 1) - 1) // strides[d] + 1 for d in range(rank)]
    if any(n <= 0 for n in out_spatial):
        raise ShapeError(f"{op_type}: the kernel {kernel} is larger than the padded input {padded.shape[2:]}")
    out = np.zeros((batch, filters) + tuple(out_spatial), dtype=np.int64)
    per_filter_group = filters // group
    for offset in itertools.product(*(range(k) for k in kernel)):
        window = tuple(
            slice(
                offset[d] * dilations[d], offset[d] * dilations[d] + (out_spatial[d] - 1) * strides[d] + 1, strides[d]
            )
            for d in range(rank)
        )
        patch = padded[(slice(None), slice(None)) + window]  # (N, C, *out)
        taps = w[(slice(None), slice(None)) + tuple(offset)]  # (M, C/group)
        for g in range(group):
            channels_g = slice(g * per_group, (g + 1) * per_group)
            filters_g = slice(g * per_filter_group, (g + 1) * per_filter_group)
            out[:, filters_g] += np.einsum("nc...,mc->nm...", patch[:, channels_g], taps[filters_g])
    return out


def _per_filter(value: np.ndarray | None, filters: int, op_type: str, what: str) -> np.ndarray:
    """A per-tensor or per-output-channel parameter shaped to broadcast over (M, C/group, ...) weights."""
    if value is None:
        return np.zeros((), dtype=np.int64)
    if value.size == 1:
        return value.reshape(())
    if value.ndim != 1 or value.shape[0] != filters:
        raise ShapeError(f"{op_type}: {what} of shape {value.shape} for {filters} output channels")
    return value.reshape(-1, 1)


def _check_dtype(op_type: str, name: str, value: np.ndarray) -> None:
    if value.dtype not in _INTEGER_INPUTS:
        raise UnsupportedOpError(f"{op_type}: {name} of dtype {value.dtype} (uint8 or int8 expected)")


def _shifted(
    x: np.ndarray, x_zero: np.ndarray | None, w: np.ndarray, w_zero: np.ndarray | None, op_type: str
) -> tuple[np.ndarray, np.ndarray]:
    _check_dtype(op_type, "x", x)
    _check_dtype(op_type, "w", w)
    if x_zero is not None and x_zero.size != 1:
        raise UnsupportedOpError(f"{op_type}: x_zero_point must be per tensor, got shape {x_zero.shape}")
    x_shift = 0 if x_zero is None else int(x_zero.reshape(-1)[0])
    filters = w.shape[0]
    w_shift = _per_filter(w_zero, filters, op_type, "w_zero_point").astype(np.int64).reshape(-1)
    if w_shift.size > 1:
        w_shift = w_shift.reshape((-1,) + (1,) * (w.ndim - 1))
    weights = w.astype(np.int64) - w_shift.reshape(w_shift.shape if w_shift.size > 1 else ())
    return x.astype(np.int64) - x_shift, weights


@register
class ConvInteger(Operator):
    op_type = "ConvInteger"
    since_version = 10

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, w = inputs[0], inputs[1]
        assert x is not None and w is not None
        x_zero = inputs[2] if len(inputs) > 2 else None
        w_zero = inputs[3] if len(inputs) > 3 else None
        shifted_x, shifted_w = _shifted(x, x_zero, w, w_zero, self.op_type)
        return [wrap_int32(integer_conv(shifted_x, shifted_w, attrs, self.op_type))]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        names = ("x", "w", "x_zero", "w_zero")
        positions = {name: i for i, name in enumerate(names) if i < len(inputs) and inputs[i] is not None}
        order = [positions[name] for name in names if name in positions]
        function = _bound_function(ConvInteger(), attrs, outputs, inputs, order, {})
        return integer_conv_kernel("ConvInteger", inputs, outputs, attrs, positions, caps, function)


@register
class QLinearConv(Operator):
    op_type = "QLinearConv"
    since_version = 10

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero = inputs[:8]
        bias = inputs[8] if len(inputs) > 8 else None
        assert x is not None and w is not None and x_scale is not None and w_scale is not None
        assert y_scale is not None
        for scale in (x_scale, w_scale, y_scale):
            if scale.dtype != np.float32:
                raise UnsupportedOpError(f"QLinearConv: scales of dtype {scale.dtype} (float32 expected)")
        if x_scale.size != 1 or y_scale.size != 1 or (y_zero is not None and y_zero.size != 1):
            raise UnsupportedOpError("QLinearConv: x_scale, y_scale and y_zero_point must be per tensor")
        out_dtype = x.dtype if y_zero is None else y_zero.dtype
        _check_dtype(self.op_type, "y_zero_point", np.zeros(0, out_dtype))
        shifted_x, shifted_w = _shifted(x, x_zero, w, w_zero, self.op_type)
        accumulated = integer_conv(shifted_x, shifted_w, attrs, self.op_type)
        filters = w.shape[0]
        spatial = (1,) * (x.ndim - 2)
        if bias is not None:
            if bias.dtype != np.int32 or bias.shape != (filters,):
                raise ShapeError(f"QLinearConv: bias {bias.dtype}{bias.shape} (int32 of {filters} expected)")
            accumulated = accumulated + bias.astype(np.int64).reshape((filters,) + spatial)
        total = wrap_int32(accumulated)
        w_scales = _per_filter(w_scale, filters, self.op_type, "w_scale").reshape(-1)
        multiplier = (np.float32(x_scale.reshape(-1)[0]) * w_scales.astype(np.float32)) / np.float32(
            y_scale.reshape(-1)[0]
        )
        multiplier = multiplier.reshape((-1,) + spatial) if multiplier.size > 1 else multiplier.reshape(())
        scaled = total.astype(np.float32) * multiplier.astype(np.float32)
        offset = 0.0 if y_zero is None else float(y_zero.reshape(-1)[0])
        return [saturate_round(np.rint(scaled.astype(np.float64)) + offset, out_dtype)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        if not all(position in constants for position in (1, 4, 6)):
            raise NotOnDevice("QLinearConv: scales computed at run time run on the CPU (the multipliers are planned)")
        x_scale, w_scale, y_scale = (np.asarray(constants[p]) for p in (1, 4, 6))
        w = inputs[3]
        assert w is not None
        filters = w.shape[0]
        if any(s.dtype != np.float32 for s in (x_scale, w_scale, y_scale)):
            raise NotOnDevice("QLinearConv: scales other than float32 run on the CPU")
        if x_scale.size != 1 or y_scale.size != 1 or w_scale.size not in (1, filters):
            raise NotOnDevice("QLinearConv: these scale shapes run on the CPU")
        if outputs[0].dtype not in _INTEGER_INPUTS:
            raise NotOnDevice(f"QLinearConv: outputs of dtype {outputs[0].dtype.name} run on the CPU")
        # The multipliers exactly as the reference computes them (float32 products and quotients).
        multipliers = (np.float32(x_scale.reshape(-1)[0]) * w_scale.reshape(-1).astype(np.float32)) / np.float32(
            y_scale.reshape(-1)[0]
        )
        # Every scaled sum must stay finite (WGSL need not produce infinities): |sum| < 2^31.
        if not np.all(np.isfinite(multipliers)) or float(np.abs(multipliers).max()) * 2.0**31 >= 3.4e38:
            raise NotOnDevice("QLinearConv: a non-finite requantization multiplier runs on the CPU")
        names = {"x": 0, "x_zero": 2, "w": 3, "w_zero": 5, "y_zero": 7, "bias": 8}
        positions = {name: p for name, p in names.items() if p < len(inputs) and inputs[p] is not None}
        order = [positions[name] for name in ("x", "w", "x_zero", "w_zero", "bias", "y_zero") if name in positions]
        scale_constants = {p: np.asarray(constants[p]) for p in (1, 4, 6)}
        function = _bound_function(QLinearConv(), attrs, outputs, inputs, order, scale_constants)
        return integer_conv_kernel(
            "QLinearConv", inputs, outputs, attrs, positions, caps, function, multipliers=multipliers
        )


def integer_conv_kernel(
    op_type: str,
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
    attrs: Mapping[str, Any],
    positions: Mapping[str, int],
    caps: DeviceCaps,
    function: Any,
    multipliers: np.ndarray | None = None,
) -> OpPlan:
    """The kernel of an integer convolution over the node inputs at ``positions`` (keys ``x``, ``w`` and, where
    present, ``x_zero``, ``w_zero``, ``bias``, ``y_zero``); with float32 ``multipliers`` (one, or one per output
    channel) the sums are requantized to the output's 8-bit type."""
    x, w = inputs[positions["x"]], inputs[positions["w"]]
    assert x is not None and w is not None
    out = outputs[0]
    for name, info in (("x", x), ("w", w)):
        if info.dtype not in _INTEGER_INPUTS:
            raise NotOnDevice(f"{op_type}: {name} of dtype {info.dtype.name} runs on the CPU")
    rank = len(x.shape) - 2
    if rank < 1 or len(w.shape) != len(x.shape):
        raise ShapeError(f"{op_type}: input {x.shape} and weight {w.shape} ranks")
    group = int(attrs.get("group", 1))
    channels, filters, per_group = x.shape[1], w.shape[0], w.shape[1]
    if group < 1 or channels != per_group * group or filters % group:
        raise ShapeError(f"{op_type}: {channels} channels, weight {w.shape} and group {group} do not match")
    kernel_shape = list(w.shape[2:])
    strides = [int(v) for v in attrs.get("strides", [1] * rank)]
    dilations = [int(v) for v in attrs.get("dilations", [1] * rank)]
    pads = _pads(attrs, x.shape[2:], kernel_shape, strides, dilations, op_type)
    if out.size == 0:
        return OpPlan()
    per = elements_per_invocation(out.dtype.itemsize)
    window = per_group * element_count(kernel_shape)
    check_loop_budget(op_type, per * window, caps)
    bindings: list[Binding] = []
    infos: list[TensorInfo] = []
    parts: list[str] = []
    for name in ("x", "w", "x_zero", "w_zero", "bias", "y_zero"):
        position = positions.get(name, -1)
        bound = inputs[position] if 0 <= position < len(inputs) else None
        if bound is None:
            parts.append(f"fn load_{name}(k: u32) -> i32 {{ return 0; }}\n")
            continue
        info = bound
        if name in ("x_zero", "y_zero") and info.size != 1:
            raise NotOnDevice(f"{op_type}: a per-channel {name} runs on the CPU")
        if name == "w_zero" and info.size not in (1, filters):
            raise ShapeError(f"{op_type}: w_zero_point of shape {info.shape} for {filters} output channels")
        if name == "bias" and (info.dtype != np.int32 or info.shape != (filters,)):
            raise ShapeError(f"{op_type}: bias {info.dtype}{info.shape} (int32 of {filters} expected)")
        if name != "bias" and info.dtype not in _INTEGER_INPUTS:
            raise NotOnDevice(f"{op_type}: {name} of dtype {info.dtype.name} runs on the CPU")
        parts.append(storage_declaration(len(bindings), f"buf_{name}", writable=False))
        parts.append(load_function(f"raw_{name}", f"buf_{name}", info.dtype))
        parts.append(f"fn load_{name}(k: u32) -> i32 {{ return i32(raw_{name}(k)); }}\n")
        bindings.append(Binding("input", position))
        infos.append(info)
    check_binding_count(op_type, len(bindings) + 1, caps)
    check_binding_sizes(op_type, infos + [out], caps)
    parts.append(storage_declaration(len(bindings), "dst", writable=True))
    bindings.append(Binding("output", 0))
    w_zero_info = inputs[positions["w_zero"]] if 0 <= positions.get("w_zero", -1) < len(inputs) else None
    per_channel_zero = w_zero_info is not None and w_zero_info.size > 1
    out_spatial = list(out.shape[2:])
    x_strides = contiguous_strides(x.shape)
    w_strides = contiguous_strides(w.shape)
    lines = [
        "fn accumulate(j: u32) -> i32 {\n",
        "  var rest = j;\n",
    ]
    for d in range(rank - 1, -1, -1):
        lines.append(f"  let o{d} = i32(rest % {out_spatial[d]}u);\n  rest = rest / {out_spatial[d]}u;\n")
    lines.append(f"  let m = rest % {filters}u;\n  let n = rest / {filters}u;\n")
    lines.append(f"  let c0 = (m / {filters // group}u) * {per_group}u;\n")
    lines.append("  let zx = load_x_zero(0u);\n")
    lines.append(f"  let zw = load_w_zero({'m' if per_channel_zero else '0u'});\n")
    lines.append("  var acc = load_bias(m);\n")
    lines.append(f"  for (var t = 0u; t < {window}u; t = t + 1u) {{\n")
    lines.append("    var r = t;\n")
    inside = []
    offset_terms = [f"(n * {channels}u + c0 + c) * {x_strides[1]}u"]
    for d in range(rank - 1, -1, -1):
        lines.append(f"    let k{d} = i32(r % {kernel_shape[d]}u);\n    r = r / {kernel_shape[d]}u;\n")
        lines.append(f"    let i{d} = o{d} * {strides[d]} - {pads[d][0]} + k{d} * {dilations[d]};\n")
        inside.append(f"i{d} >= 0 && i{d} < {x.shape[2 + d]}")
        offset_terms.append(f"u32(i{d}) * {x_strides[2 + d]}u")
    lines.append("    let c = r;\n")
    lines.append(f"    if ({' && '.join(inside)}) {{\n")
    lines.append(f"      let xv = load_x({' + '.join(offset_terms)}) - zx;\n")
    lines.append(f"      let wv = load_w(m * {w_strides[0]}u + t) - zw;\n")
    lines.append("      acc = acc + xv * wv;\n")
    lines.append("    }\n  }\n  return acc;\n}\n")
    parts.append("".join(lines))
    if multipliers is None:
        parts.append("fn value(j: u32) -> i32 { return accumulate(j); }\n")
    else:
        low, high = (0, 255) if out.dtype == np.uint8 else (-128, 127)
        flat = multipliers.reshape(-1)
        if flat.size == 1:
            multiplier = wgsl_float(float(flat[0]))
        else:
            parts.append(
                f"const MULTIPLIERS = array<f32, {flat.size}>({', '.join(wgsl_float(float(v)) for v in flat)});\n"
            )
            multiplier = f"MULTIPLIERS[(j / {element_count(out_spatial)}u) % {filters}u]"
        parts.append(
            "fn value(j: u32) -> i32 {\n"
            "  let acc = accumulate(j);\n"
            "  let exact = f32(acc >> 16u) * 65536.0 + f32(acc & 65535);\n"
            f"  let scaled = round(exact * {multiplier}) + f32(load_y_zero(0u));\n"
            f"  return i32(clamp(scaled, {low}.0, {high}.0));\n"
            "}\n"
        )
    count = out.size
    invocations = -(-count // per)
    workgroup = workgroup_size_for(caps.limits)
    guard = f"  let w = {LINEAR_INVOCATION};\n  if (w >= {invocations}u) {{ return; }}\n"
    kernel = KernelSpec(
        name=op_type,
        wgsl="".join(parts) + kernel_entry(workgroup, guard + store_statements(out.dtype, count, "value")),
        grid=grid_for(invocations, workgroup, caps.limits),
        bindings=tuple(bindings),
        twin=reference_twin(function, bindings, inputs, outputs),
    )
    return OpPlan(kernels=(kernel,))


def _bound_function(
    operator: Operator,
    attrs: Mapping[str, Any],
    outputs: Sequence[TensorInfo],
    inputs: Sequence[TensorInfo | None],
    order: Sequence[int],
    constants: Mapping[int, np.ndarray],
) -> Any:
    """A twin calling ``operator.reference`` with the bound arrays (node inputs ``order``, in binding order) and the
    constants at the other positions."""
    attributes = dict(attrs)

    def function(*arrays: np.ndarray) -> np.ndarray:
        values: list[np.ndarray | None] = [None] * len(inputs)
        for position, value in constants.items():
            values[position] = value
        for position, array in zip(order, arrays):
            values[position] = array
        return operator.reference(values, attributes, outputs)[0]

    return function
