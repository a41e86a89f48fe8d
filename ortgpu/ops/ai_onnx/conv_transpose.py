"""ConvTranspose (N-d reference; 1-D and 2-D on the device): groups, strides, pads, auto_pad, output_padding,
output_shape, dilations, optional bias.

The device kernel gathers: one invocation per output element sums the input positions whose scattered taps
land on it (``oy + pad - ky * dilation`` divisible by the stride).  Like Conv it honours ``_epilogue`` (extra
inputs from index 3) after the bias, and takes float32 or float16 (loaded into f32, summed in f32, rounded once at
the store).
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from ..._types import element_count
from .._epilogue import apply_epilogue, epilogue_function
from .._kernel import Binding, DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo, check_loop_budget
from .._registry import register
from .._tiling import THREADS, BindingTable, grid_for_groups, require_float, single_kernel_plan, workgroup_index
from .conv import _auto_pad, _conv_steps, ints, load_f32, same_padding, widened

__all__ = ["ConvTranspose", "conv_transpose_geometry"]


def conv_transpose_geometry(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: Mapping[str, Any]
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(kernel, strides, dilations, pads_begin, output_padding, out spatial) per the ONNX spec."""
    rank = len(x_shape) - 2
    if rank < 1 or len(w_shape) != len(x_shape):
        raise UnsupportedOpError(f"ConvTranspose: X {x_shape} and W {w_shape} must have the same rank >= 3")
    group = int(attrs.get("group", 1))
    if x_shape[1] != w_shape[0] or w_shape[0] % group:
        raise UnsupportedOpError(f"ConvTranspose: channels of X {x_shape} and W {w_shape} do not match group={group}")
    kernel = ints(attrs.get("kernel_shape"), w_shape[2:])
    strides = ints(attrs.get("strides"), [1] * rank)
    dilations = ints(attrs.get("dilations"), [1] * rank)
    output_padding = ints(attrs.get("output_padding"), [0] * rank)
    spatial = x_shape[2:]
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    full = [s * (n - 1) + op + e for s, n, op, e in zip(strides, spatial, output_padding, extents)]
    auto_pad = _auto_pad(attrs)
    output_shape = attrs.get("output_shape")
    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if output_shape is not None:
            out = list(ints(output_shape, []))[-rank:]
        else:
            out = [n * s for n, s in zip(spatial, strides)]
        # An output_shape beyond the full output pads nothing at the head: the extra positions are zeros
        # at the tail (onnxruntime clamps the total padding at 0, and onnx's reference agrees).
        totals = [max(0, f - o) for f, o in zip(full, out)]
        if output_shape is None:
            # auto_pad SAME asks for input * stride, but never pads negatively: where that exceeds the full output
            # (a kernel shorter than the stride), the output is the full one, as onnxruntime and onnx's shape
            # inference size it (onnx's reference evaluator alone pads on to input * stride).
            out = [f - t for f, t in zip(full, totals)]
        begin, _ = same_padding(auto_pad, totals)  # totals are never negative: as onnxruntime distributes them
    else:
        pads = ints(attrs.get("pads"), [0] * (2 * rank)) if auto_pad != "VALID" else (0,) * (2 * rank)
        if len(pads) != 2 * rank:
            raise UnsupportedOpError(f"ConvTranspose: pads must have {2 * rank} entries")
        begin = list(pads[:rank])
        out = [f - b - e for f, b, e in zip(full, pads[:rank], pads[rank:])]
    return kernel, strides, dilations, tuple(begin), output_padding, tuple(out)


@register
class ConvTranspose(Operator):
    """ConvTranspose-1/11."""

    op_type = "ConvTranspose"
    since_version = 1

    def output_shapes(
        self, inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
    ) -> list[tuple[int, ...]] | None:
        x, w = inputs[0], inputs[1]
        if x is None or w is None:
            return None
        out = conv_transpose_geometry(x.shape, w.shape, attrs)[5]
        return [(x.shape[0], w.shape[1] * int(attrs.get("group", 1))) + tuple(out)]

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, w = inputs[0], inputs[1]
        assert x is not None and w is not None
        kernel, strides, dilations, begin, _, out = conv_transpose_geometry(x.shape, w.shape, attrs)
        group = int(attrs.get("group", 1))
        batch, channels = x.shape[:2]
        cout_g = w.shape[1]
        spatial = x.shape[2:]
        shift = [max(0, -b) for b in begin]
        lengths = [
            sh + max((n - 1) * s + (k - 1) * d + 1, b + o)
            for sh, n, s, k, d, b, o in zip(shift, spatial, strides, kernel, dilations, begin, out)
        ]
        buffer = np.zeros((batch, group, cout_g) + tuple(lengths), dtype=np.float64)
        xs = x.reshape((batch, group, channels // group) + spatial).astype(np.float64)
        ws = w.reshape((group, channels // group, cout_g) + tuple(kernel)).astype(np.float64)
        for offset in itertools.product(*(range(k) for k in kernel)):
            tap = ws[(slice(None),) * 3 + tuple(offset)]
            target = tuple(
                slice(sh + k * d, sh + k * d + (n - 1) * s + 1, s)
                for sh, k, d, n, s in zip(shift, offset, dilations, spatial, strides)
            )
            buffer[(slice(None),) * 3 + target] += np.einsum("ngc...,gcm->ngm...", xs, tap)
        crop = tuple(slice(sh + b, sh + b + o) for sh, b, o in zip(shift, begin, out))
        y = buffer[(slice(None),) * 3 + crop].reshape((batch, group * cout_g) + tuple(out)).astype(widened(x.dtype))
        shapes = [None if a is None else tuple(a.shape) for a in inputs]
        steps = _conv_steps(attrs, shapes, tuple(y.shape), "ConvTranspose")
        return [apply_epilogue(y, steps, inputs).astype(x.dtype, copy=False)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x, w = inputs[0], inputs[1]
        assert x is not None and w is not None
        element = require_float("ConvTranspose", list(inputs) + list(outputs), caps)
        if len(x.shape) not in (3, 4):
            raise NotOnDevice(f"ConvTranspose: the WebGPU kernel covers 1-D and 2-D, not {len(x.shape) - 2}-D")
        kernel, strides, dilations, begin, _, out = conv_transpose_geometry(x.shape, w.shape, attrs)
        group = int(attrs.get("group", 1))
        out_shape = (x.shape[0], w.shape[1] * group) + out
        steps = _conv_steps(attrs, [None if a is None else a.shape for a in inputs], out_shape, "ConvTranspose")
        total = element_count(out_shape)
        if total == 0:
            return OpPlan()
        if element_count(x.shape) == 0 or element_count(w.shape) == 0:
            # 0 input channels: every output is the bias (or 0), which the twin computes; the kernels would bind
            # a 0-byte buffer (a validation error) or leave the output unwritten.
            raise NotOnDevice("ConvTranspose: the input or the weight is empty (0 channels) but the output is not")
        if len(x.shape) == 3:
            kernel, strides, dilations, begin, out = (
                (1,) + kernel,
                (1,) + strides,
                (1,) + dilations,
                (0,) + begin,
                (1,) + out,
            )
            in_h, in_w = 1, x.shape[2]
        else:
            in_h, in_w = x.shape[2], x.shape[3]
        table = BindingTable()
        x_name = table.add(Binding("input", 0), element)
        w_name = table.add(Binding("input", 1), element)
        output = table.add(Binding("output", 0), element, writable=True)
        epilogue = epilogue_function(steps, out_shape, table, element)
        grid = grid_for_groups(-(-total // THREADS), caps)
        channels, cout_g = x.shape[1], w.shape[1]
        # the ky / kx / ci loops of each output element
        check_loop_budget("ConvTranspose", (kernel[0] + 1) * (kernel[1] + 1) * (channels // group + 1), caps)
        x_at = load_f32(x_name, element, "(image * CIN + c) * u32(H * W) + x_offset")
        w_at = load_f32(w_name, element, "((c * COUT_G + m) * KH + ky) * KW + kx")
        wgsl = f"""{table.enables()}{table.declarations()}
const CIN: u32 = {channels}u;
const CIN_G: u32 = {channels // group}u;
const COUT: u32 = {cout_g * group}u;
const COUT_G: u32 = {cout_g}u;
const H: i32 = {in_h};
const W: i32 = {in_w};
const KH: u32 = {kernel[0]}u;
const KW: u32 = {kernel[1]}u;
const SH: i32 = {strides[0]};
const SW: i32 = {strides[1]};
const DH: i32 = {dilations[0]};
const DW: i32 = {dilations[1]};
const PH: i32 = {begin[0]};
const PW: i32 = {begin[1]};
const OH: u32 = {out[0]}u;
const OW: u32 = {out[1]}u;
const TOTAL: u32 = {total}u;
{epilogue}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let index = {workgroup_index(grid)} * {THREADS}u + li;
    if (index >= TOTAL) {{ return; }}
    let ox = i32(index % OW);
    let oy = i32((index / OW) % OH);
    let co = (index / (OW * OH)) % COUT;
    let image = index / (OW * OH * COUT);
    let g = co / COUT_G;
    let m = co % COUT_G;
    var acc = 0.0;
    for (var ky = 0u; ky < KH; ky = ky + 1u) {{
        let ty = oy + PH - i32(ky) * DH;
        if (ty < 0 || ty % SH != 0 || ty / SH >= H) {{ continue; }}
        let iy = ty / SH;
        for (var kx = 0u; kx < KW; kx = kx + 1u) {{
            let tx = ox + PW - i32(kx) * DW;
            if (tx < 0 || tx % SW != 0 || tx / SW >= W) {{ continue; }}
            let ix = tx / SW;
            let x_offset = u32(iy * W + ix);
            for (var ci = 0u; ci < CIN_G; ci = ci + 1u) {{
                let c = g * CIN_G + ci;
                acc = fma({x_at},
                          {w_at}, acc);
            }}
        }}
    }}
    {output}[index] = epilogue(acc, index);
}}
"""
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        return single_kernel_plan("ConvTranspose", wgsl, grid, table, compute, inputs, outputs, caps)
