"""The WGSL kernels of Resize and Upsample (see :mod:`._resize_reference` for the semantics).

One invocation per output element (two for float16: the write rule of :mod:`._wgsl`).  The source coordinate
of every resized axis is computed with the same float32 operations as :func:`.resize.axis_coordinates`, the
taps (1 for nearest, 2 for linear, 4 for cubic per resized axis) are unrolled, and the weighted sum nests the
axes as the reference does (the first resized axis innermost).  Nearest resizes without extrapolation copy
elements of any dtype bit for bit (a gather); the others compute float32/float16.  Antialiased downsampling
loops over each axis's stretched filter window instead.  Integer linear/cubic and more than 64 unrolled taps
per output run on the CPU.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .._kernel import (
    Binding,
    DeviceCaps,
    KernelSpec,
    NotOnDevice,
    OpPlan,
    TensorInfo,
    check_loop_budget,
    reference_twin,
)
from .._tiling import wgsl_f32 as _wgsl_f32
from .._wgsl import (
    LINEAR_INVOCATION,
    check_binding_sizes,
    contiguous_strides,
    elements_per_invocation,
    grid_for,
    kernel_entry,
    load_function,
    storage_declaration,
    store_statements,
    workgroup_size_for,
)
from .._wgsl_kernels import gather_kernel
from ._resize_reference import (
    F32,
    ResizeConfig,
    align_denominator,
    crop_terms,
    half_pixel_symmetric_offset,
    resize_reference,
)
from .quantize import EXACT_DIVISION_WGSL

__all__ = ["resize_plan"]


def wgsl_f32(value: float | np.floating[Any]) -> str:
    """A WGSL f32 literal of a float32 value."""
    return _wgsl_f32(float(value))


#: The most taps one output element may read on the device (cubic over 3 axes).
MAX_TAPS = 64


#: ``fn fdiv(a, b)``: a correctly rounded f32 quotient, as the reference's float32 arithmetic gives (WGSL's ``/`` may
#: be 2.5 ulp off, and NVIDIA's Vulkan driver's was: a nearest ``ceil`` of an exact half-pixel coordinate picked the next row).
_FDIV = (
    EXACT_DIVISION_WGSL
    + "fn fdiv(a: f32, b: f32) -> f32 { return bitcast<f32>(div_bits(bitcast<u32>(a), bitcast<u32>(b))); }\n"
)


def _coordinate(config: ResizeConfig, axis: int) -> str:
    """WGSL f32 expression of the source coordinate of output position ``c{axis}``."""
    length_in = config.in_shape[axis]
    length_out = config.out_shape[axis]
    scale = F32(config.scales[axis])
    c = f"f32(c{axis})"
    s = wgsl_f32(scale)
    t = config.transform
    if t == "half_pixel" or (t == "pytorch_half_pixel" and length_out > 1):
        return f"(fdiv({c} + 0.5f, {s}) - 0.5f)"
    if t == "pytorch_half_pixel":
        return "0.0f"
    if t == "half_pixel_symmetric":
        offset = wgsl_f32(half_pixel_symmetric_offset(length_in, length_out, scale))
        return f"({offset} + fdiv({c} + 0.5f, {s}) - 0.5f)"
    if t == "align_corners":
        if length_out == 1:
            return "0.0f"
        return f"fdiv(f32(c{axis} * {length_in - 1}u), {wgsl_f32(align_denominator(config, axis))})"
    if t == "asymmetric":
        return f"fdiv({c}, {s})"
    if t == "tf_half_pixel_for_nn":
        return f"fdiv({c} + 0.5f, {s})"
    start, span = crop_terms(config, axis)
    if length_out == 1:
        return wgsl_f32(span)
    return f"({wgsl_f32(start)} + fdiv({c} * {wgsl_f32(span)}, {wgsl_f32(length_out - 1)}))"


def _nearest(config: ResizeConfig, axis: int, x: str) -> str:
    """WGSL i32 expression: the unclamped nearest index of coordinate variable ``x``."""
    mode = config.nearest
    if mode == "round_prefer_floor":
        return f"i32(select(floor({x}) + 1.0f, floor({x}), {x} - floor({x}) <= 0.5f))"
    if mode == "round_prefer_ceil":
        return f"i32(select(floor({x}) + 1.0f, floor({x}), {x} - floor({x}) < 0.5f))"
    if mode == "floor":
        return f"i32(floor({x}))"
    if mode == "ceil":
        return f"i32(ceil({x}))"
    return f"i32(ceil({x}))" if config.scales[axis] < 1.0 else f"i32(trunc({x}))"


def _axis_lines(config: ResizeConfig, axis: int) -> tuple[list[str], int]:
    """WGSL lines defining ``i{axis}_{t}`` (i32 indices) and ``w{axis}_{t}`` (f32 weights); the tap count."""
    last = config.in_shape[axis] - 1
    x = f"x{axis}"
    lines = [f"  let {x} = {_coordinate(config, axis)};"]
    if config.transform == "tf_crop_and_resize":
        lines.append(f"  if ({x} < 0.0f || {x} > {wgsl_f32(last)}) {{ outside = true; }}")
    if config.mode == "nearest":
        lines.append(f"  let i{axis}_0 = clamp({_nearest(config, axis, x)}, 0, {last});")
        lines.append(f"  let w{axis}_0 = 1.0f;")
        return lines, 1
    if config.mode == "linear":
        lines += [
            f"  let xc{axis} = clamp({x}, 0.0f, {wgsl_f32(last)});",
            f"  let i{axis}_0 = i32(floor(xc{axis}));",
            f"  let i{axis}_1 = min(i{axis}_0 + 1, {last});",
            f"  let w{axis}_1 = xc{axis} - f32(i{axis}_0);",
            f"  let w{axis}_0 = 1.0f - w{axis}_1;",
        ]
        return lines, 2
    a = F32(config.cubic_a)
    constants = [a + F32(2), a + F32(3), a, F32(5) * a, F32(8) * a, F32(4) * a]
    k = [wgsl_f32(v) for v in constants]
    lines += [f"  let f{axis} = floor({x});", f"  let t{axis} = {x} - f{axis};", f"  let b{axis} = i32(f{axis});"]
    distances = [f"t{axis} + 1.0f", f"t{axis}", f"1.0f - t{axis}", f"2.0f - t{axis}"]
    for tap, distance in enumerate(distances):
        raw = f"(b{axis} + {tap - 1})"
        lines.append(f"  let r{axis}_{tap} = {raw};")
        lines.append(f"  var w{axis}_{tap} = cubic(abs({distance}), {k[0]}, {k[1]}, {k[2]}, {k[3]}, {k[4]}, {k[5]});")
        if config.exclude_outside:
            lines.append(f"  if (r{axis}_{tap} < 0 || r{axis}_{tap} > {last}) {{ w{axis}_{tap} = 0.0f; }}")
        lines.append(f"  let i{axis}_{tap} = clamp(r{axis}_{tap}, 0, {last});")
    if config.exclude_outside:
        lines.append(f"  let sum{axis} = w{axis}_0 + w{axis}_1 + w{axis}_2 + w{axis}_3;")
        for tap in range(4):
            lines.append(f"  w{axis}_{tap} = w{axis}_{tap} / sum{axis};")
    return lines, 4


_CUBIC = """fn cubic(d: f32, a2: f32, a3: f32, a: f32, a5: f32, a8: f32, a4: f32) -> f32 {
  if (d <= 1.0f) { return (a2 * d - a3) * d * d + 1.0f; }
  if (d < 2.0f) { return ((a * d - a5) * d + a8) * d - a4; }
  return 0.0f;
}
"""


def _weighted_sum(axes: Sequence[int], taps: dict[int, int], position: dict[int, str], strides: list[int]) -> str:
    """The nested weighted sum: the last resized axis outermost (as the reference accumulates)."""
    if not axes:
        flat = " + ".join(f"u32({position[a]}) * {strides[a]}u" for a in sorted(position) if strides[a]) or "0u"
        return f"load0({flat})"
    axis = axes[-1]
    terms = []
    for tap in range(taps[axis]):
        inner = _weighted_sum(axes[:-1], taps, {**position, axis: f"i{axis}_{tap}"}, strides)
        terms.append(f"{inner} * w{axis}_{tap}")
    return "(" + " + ".join(terms) + ")"


def _value_kernel(config: ResizeConfig, x: TensorInfo, out: TensorInfo, caps: DeviceCaps) -> tuple[str, int]:
    """WGSL of the interpolating kernel and its invocation count."""
    rank = len(x.shape)
    axes = [a for a in range(rank) if config.resized(a)]
    strides = contiguous_strides(x.shape)
    lines = ["fn value(j: u32) -> f32 {", "  var rest = j;", "  var outside = false;"]
    for axis in reversed(range(rank)):
        lines.append(f"  let c{axis} = rest % {out.shape[axis]}u;")
        lines.append(f"  rest = rest / {out.shape[axis]}u;")
    taps: dict[int, int] = {}
    for axis in axes:
        axis_lines, taps[axis] = _axis_lines(config, axis)
        lines += axis_lines
    if config.transform == "tf_crop_and_resize":
        lines.append(f"  if (outside) {{ return {wgsl_f32(config.extrapolation)}; }}")
    position = {a: f"c{a}" for a in range(rank) if a not in taps}
    lines.append(f"  return {_weighted_sum(axes, taps, position, strides)};")
    lines.append("}")
    parts = [
        storage_declaration(0, "src", writable=False),
        storage_declaration(1, "dst", writable=True),
        load_function("load0", "src", x.dtype),
        _CUBIC if config.mode == "cubic" else "",
        _FDIV,
        "\n".join(lines) + "\n",
    ]
    invocations = -(-out.size // elements_per_invocation(out.dtype.itemsize))
    workgroup = workgroup_size_for(caps.limits)
    guard = f"  let w = {LINEAR_INVOCATION};\n  if (w >= {invocations}u) {{ return; }}\n"
    body = guard + store_statements(out.dtype, out.size, "value")
    return "".join(parts) + kernel_entry(workgroup, body), invocations


def _antialias_kernel(config: ResizeConfig, x: TensorInfo, out: TensorInfo, caps: DeviceCaps) -> tuple[str, int]:
    """WGSL of an antialiased linear/cubic resize: per resized axis, a loop over the filter window stretched
    by ``1 / scale`` (``scale`` capped at 1), its weights normalised by their sum (the reference's taps)."""
    rank = len(x.shape)
    axes = [a for a in range(rank) if config.resized(a)]
    strides = contiguous_strides(x.shape)
    support = F32(1) if config.mode == "linear" else F32(2)
    lines = ["fn value(j: u32) -> f32 {", "  var rest = j;", "  var outside = false;"]
    for axis in reversed(range(rank)):
        lines.append(f"  let c{axis} = rest % {out.shape[axis]}u;")
        lines.append(f"  rest = rest / {out.shape[axis]}u;")
    counts = {}
    for axis in axes:
        last = config.in_shape[axis] - 1
        scale = min(F32(config.scales[axis]), F32(1))
        window = F32(support / scale)
        counts[axis] = 2 * int(np.ceil(window)) + 2
        lines.append(f"  let x{axis} = {_coordinate(config, axis)};")
        if config.transform == "tf_crop_and_resize":
            lines.append(f"  if (x{axis} < 0.0f || x{axis} > {wgsl_f32(last)}) {{ outside = true; }}")
        lines.append(f"  let lo{axis} = i32(floor(x{axis} - {wgsl_f32(window)}));")
        lines.append(f"  var s{axis} = 0.0f;")
        lines.append(
            f"  for (var k = 0; k < {counts[axis]}; k = k + 1) {{ s{axis} = s{axis} + tap{axis}(lo{axis} + k, x{axis}); }}"
        )
    if config.transform == "tf_crop_and_resize":
        lines.append(f"  if (outside) {{ return {wgsl_f32(config.extrapolation)}; }}")
    lines.append("  var acc = 0.0f;")
    indent = "  "
    flat = [f"u32(c{a}) * {strides[a]}u" for a in range(rank) if a not in counts and strides[a]]
    weight = []
    for axis in reversed(axes):
        last = config.in_shape[axis] - 1
        lines.append(f"{indent}for (var k{axis} = 0; k{axis} < {counts[axis]}; k{axis} = k{axis} + 1) {{")
        indent += "  "
        lines.append(f"{indent}let i{axis} = lo{axis} + k{axis};")
        lines.append(f"{indent}let w{axis} = select(0.0f, tap{axis}(i{axis}, x{axis}) / s{axis}, s{axis} != 0.0f);")
        flat.append(f"u32(clamp(i{axis}, 0, {last})) * {strides[axis]}u")
        weight.append(f"w{axis}")
    lines.append(f"{indent}acc = acc + load0({' + '.join(flat) or '0u'}) * ({' * '.join(weight)});")
    for _ in axes:
        indent = indent[:-2]
        lines.append(f"{indent}}}")
    lines += ["  return acc;", "}"]
    helpers = []
    for axis in axes:
        last = config.in_shape[axis] - 1
        scale = min(F32(config.scales[axis]), F32(1))
        if config.mode == "linear":
            filt = "max(0.0f, 1.0f - abs(d))"
        else:
            a = F32(config.cubic_a)
            k = [wgsl_f32(v) for v in (a + F32(2), a + F32(3), a, F32(5) * a, F32(8) * a, F32(4) * a)]
            filt = f"cubic(abs(d), {', '.join(k)})"
        exclude = f"  if (i < 0 || i > {last}) {{ return 0.0f; }}\n" if config.exclude_outside else ""
        helpers.append(
            f"fn tap{axis}(i: i32, x: f32) -> f32 {{\n{exclude}  let d = (f32(i) - x) * {wgsl_f32(scale)};\n"
            f"  return {filt};\n}}\n"
        )
    iterations = 1
    for axis in axes:
        iterations = iterations * counts[axis]
    check_loop_budget(config.op_type, iterations + sum(counts.values()), caps)
    parts = [
        storage_declaration(0, "src", writable=False),
        storage_declaration(1, "dst", writable=True),
        load_function("load0", "src", x.dtype),
        _CUBIC if config.mode == "cubic" else "",
        _FDIV,
        "".join(helpers),
        "\n".join(lines) + "\n",
    ]
    invocations = -(-out.size // elements_per_invocation(out.dtype.itemsize))
    guard = f"  let w = {LINEAR_INVOCATION};\n  if (w >= {invocations}u) {{ return; }}\n"
    body = guard + store_statements(out.dtype, out.size, "value")
    return "".join(parts) + kernel_entry(workgroup_size_for(caps.limits), body), invocations


def _nearest_source(config: ResizeConfig, out: TensorInfo, strides: list[int]) -> str:
    """The gather kernel's ``source`` function of a nearest resize (no extrapolation)."""
    rank = len(out.shape)
    lines = ["fn source(j: u32) -> vec2<u32> {", "  var rest = j;", "  var outside = false;"]
    for axis in reversed(range(rank)):
        lines.append(f"  let c{axis} = rest % {out.shape[axis]}u;")
        lines.append(f"  rest = rest / {out.shape[axis]}u;")
    terms = []
    for axis in range(rank):
        if config.resized(axis):
            lines += _axis_lines(config, axis)[0]
            terms.append(f"u32(i{axis}_0) * {strides[axis]}u")
        elif strides[axis]:
            terms.append(f"c{axis} * {strides[axis]}u")
    lines.append(f"  return vec2<u32>(0u, {' + '.join(terms) or '0u'});")
    lines.append("}")
    return _FDIV + "\n".join(lines) + "\n"


def resize_plan(
    config: ResizeConfig,
    x: TensorInfo,
    outputs: Sequence[TensorInfo],
    inputs: Sequence[TensorInfo | None],
    caps: DeviceCaps,
) -> OpPlan:
    """The one-kernel plan of a resize (raises :class:`NotOnDevice` for the CPU-only variants)."""
    out = outputs[0]
    if x.dtype.kind not in "biuf":
        raise NotOnDevice(f"{config.op_type}: {x.dtype} tensors stay on the CPU")
    if tuple(out.shape) != config.out_shape:
        raise NotOnDevice(f"{config.op_type}: the planned output shape {out.shape} is not {config.out_shape}")
    if out.size == 0:
        return OpPlan()
    if x.size >= 2**31 or out.size >= 2**31:
        raise NotOnDevice(f"{config.op_type}: tensors beyond 2^31 elements run on the CPU")
    resized = [a for a in range(len(x.shape)) if config.resized(a)]
    antialias = config.antialias and config.mode != "nearest" and any(config.scales[a] < 1 for a in resized)
    bindings = [Binding("input", 0), Binding("output", 0)]
    twin = reference_twin(lambda array: resize_reference(array, config), bindings, inputs, outputs)
    extrapolates = config.transform == "tf_crop_and_resize"
    if config.mode == "nearest" and not extrapolates:
        source = _nearest_source(config, out, contiguous_strides(x.shape))
        kernel = gather_kernel(config.op_type, [(bindings[0], x)], [], out, source, caps, twin)
        return OpPlan(kernels=(kernel,))
    if x.dtype.name not in ("float32", "float16"):
        raise NotOnDevice(f"{config.op_type}: {config.mode} resize of {x.dtype.name} runs on the CPU")
    check_binding_sizes(config.op_type, [x, out], caps)
    if antialias:
        wgsl, invocations = _antialias_kernel(config, x, out, caps)
    else:
        per_axis = {"nearest": 1, "linear": 2, "cubic": 4}[config.mode]
        if per_axis ** len(resized) > MAX_TAPS:
            raise NotOnDevice(f"{config.op_type}: {per_axis ** len(resized)} taps per output element run on the CPU")
        wgsl, invocations = _value_kernel(config, x, out, caps)
    grid = grid_for(invocations, workgroup_size_for(caps.limits), caps.limits)
    return OpPlan(kernels=(KernelSpec(config.op_type, wgsl, grid, tuple(bindings), twin),))
