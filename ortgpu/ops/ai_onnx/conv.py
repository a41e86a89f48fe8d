"""Conv (N-d reference; 1-D and 2-D on the device) with groups, strides, pads, auto_pad and dilations, and the
fused epilogue of :mod:`ortgpu.ops.ai_onnx.matmul` (extra inputs from index 3; the bias input 2 is added first).
float32 or float16 (on a device with ``shader-f16``): float16 tensors are loaded into f32, the sums and the
epilogue run in f32 and the store rounds once.

Device kernels: an implicit GEMM (``out[n, g, m, p] = sum_k W[g, m, k] * im2col(X)[n, g, k, p]`` on the tiled
GEMM of :mod:`._tiling`, im2col computed on the fly while filling the shared-memory tile) when a group has
at least 8 output channels; otherwise (depthwise and narrow groups) a direct kernel, one invocation per
output element.

The spatial geometry helpers here (:func:`spatial_geometry`) also serve ConvTranspose and the pools.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ..._types import element_count
from .._epilogue import EpilogueStep, apply_epilogue, epilogue_function, parse_epilogue
from .._kernel import Binding, DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo, check_loop_budget
from .._registry import register
from .._tiled_gemm import GemmLoad, GemmProblem, binding_name, plan_tiled_gemm
from .._tiling import THREADS, BindingTable, grid_for_groups, require_float, single_kernel_plan, workgroup_index

__all__ = ["Conv", "SpatialGeometry", "spatial_geometry", "ints"]


def widened(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The dtype a reference computes ``dtype`` in before its epilogue: float16 in float32, as the kernels do (one
    rounding, at the store); anything else itself."""
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def load_f32(name: str, element: str, index: str) -> str:
    """WGSL reading element ``index`` of the binding ``name`` (``array<element>``) as f32."""
    return f"{name}[{index}]" if element == "f32" else f"f32({name}[{index}])"


def ints(value: Any, default: Sequence[int]) -> tuple[int, ...]:
    """An integer-list attribute (or its default) as a tuple."""
    if value is None:
        return tuple(int(v) for v in default)
    return tuple(int(v) for v in value)


@dataclass(frozen=True)
class SpatialGeometry:
    """Kernel, strides, dilations, padding and output size per spatial axis."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    out: tuple[int, ...]


def _auto_pad(attrs: Mapping[str, Any]) -> str:
    value = attrs.get("auto_pad", "NOTSET")
    return value.decode() if isinstance(value, bytes) else str(value)


def same_padding(auto_pad: str, totals: Sequence[int]) -> tuple[list[int], list[int]]:
    """Each axis's total padding split as ``auto_pad`` says: ``SAME_UPPER`` puts the odd one at the end,
    ``SAME_LOWER`` at the beginning.  Returns the begin and end pads.  (The one statement of the rule: Conv,
    ConvTranspose, the pools and the integer convolutions all split with it.)"""
    begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in totals]
    return begin, [t - b for t, b in zip(totals, begin)]


def conv_same_totals(spatial: Sequence[int], strides: Sequence[int], extents: Sequence[int]) -> list[int]:
    """The total padding per axis that auto_pad SAME gives a convolution: ``ceil(size / stride)`` outputs for
    windows of the dilated ``extents``, never negative."""
    return [max(0, (-(-size // s) - 1) * s + e - size) for size, s, e in zip(spatial, strides, extents)]


def _divide_toward_zero(numerator: int, denominator: int) -> int:
    """``numerator / denominator`` rounded toward zero, as C integer division does (``denominator`` > 0)."""
    return numerator // denominator if numerator >= 0 else -(-numerator // denominator)


def spatial_geometry(
    op_type: str,
    spatial: tuple[int, ...],
    kernel: tuple[int, ...],
    attrs: Mapping[str, Any],
    *,
    ceil_mode: bool = False,
) -> SpatialGeometry:
    """Output size and explicit pads of a sliding window over ``spatial`` (Conv, MaxPool, AveragePool)."""
    rank = len(spatial)
    strides = ints(attrs.get("strides"), [1] * rank)
    dilations = ints(attrs.get("dilations"), [1] * rank)
    if len(kernel) != rank or len(strides) != rank or len(dilations) != rank:
        raise UnsupportedOpError(f"{op_type}: kernel_shape/strides/dilations must have {rank} entries")
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    auto_pad = _auto_pad(attrs)
    pooling = op_type != "Conv"
    if auto_pad in ("SAME_UPPER", "SAME_LOWER") and pooling:
        # Pools size SAME padding as onnxruntime does: for the undilated window (onnx's spec uses the dilated
        # extent; the two agree without dilations), and refuse it negative (a stride longer than the window); the
        # output then follows from those pads like explicit ones, ceil_mode included.
        needed = [(-(-size // s) - 1) * s + k - size for size, s, k in zip(spatial, strides, kernel)]
        if any(n < 0 for n in needed):
            raise ShapeError(
                f"{op_type}: auto_pad {auto_pad} would need negative padding (strides {list(strides)} longer than "
                f"the kernel {list(kernel)} over {list(spatial)}), which onnxruntime refuses too; use explicit pads "
                "or auto_pad VALID"
            )
        begin, end = same_padding(auto_pad, needed)
        out = _window_counts(spatial, begin, end, extents, strides, ceil_mode)
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [-(-size // s) for size, s in zip(spatial, strides)]
        begin, end = same_padding(auto_pad, conv_same_totals(spatial, strides, extents))
    elif auto_pad in ("NOTSET", "VALID"):
        if auto_pad == "VALID":
            begin, end = [0] * rank, [0] * rank
        else:
            pads = ints(attrs.get("pads"), [0] * (2 * rank))
            if len(pads) != 2 * rank:
                raise UnsupportedOpError(f"{op_type}: pads must have {2 * rank} entries")
            begin, end = list(pads[:rank]), list(pads[rank:])
        out = _window_counts(spatial, begin, end, extents, strides, ceil_mode)
    else:
        raise UnsupportedOpError(f"{op_type}: auto_pad {auto_pad!r} is not supported")
    return SpatialGeometry(tuple(kernel), strides, dilations, tuple(begin), tuple(end), tuple(out))


def _window_counts(
    spatial: Sequence[int],
    begin: Sequence[int],
    end: Sequence[int],
    extents: Sequence[int],
    strides: Sequence[int],
    ceil_mode: bool,
) -> list[int]:
    """Output positions per axis for windows of ``extents`` over the padded input."""
    out = []
    for size, b, e, extent, s in zip(spatial, begin, end, extents, strides):
        span = size + b + e - extent
        # onnxruntime (and onnx's shape inference) divide in C integers, which round toward zero: a window longer
        # than the padded input still gives one output when it overhangs by less than a stride (its taps past the
        # end read as padding).  Python's // rounds down, which gave no output there and left the planned one
        # unwritten.
        count = (-(-span // s) if ceil_mode else _divide_toward_zero(span, s)) + 1
        if ceil_mode and (count - 1) * s >= size + b:
            count -= 1  # the last window would start in the end padding
        if count < 0:
            # onnxruntime refuses it ("Calculated output dimension is negative"); an empty output would hide it
            raise ShapeError(
                f"a window spanning {extent} elements over {size} padded by {b} and {e} gives a negative output size; "
                "use a smaller kernel or dilation, or more padding"
            )
        out.append(count)
    return out


def window_slices(geometry: SpatialGeometry, offset: Sequence[int]) -> tuple[slice, ...]:
    """Slices of the padded input that the kernel tap ``offset`` reads for every output position."""
    return tuple(
        slice(k * d, k * d + (o - 1) * s + 1, s)
        for k, d, o, s in zip(offset, geometry.dilations, geometry.out, geometry.strides)
    )


def pad_spatial(x: np.ndarray, geometry: SpatialGeometry, value: float = 0.0) -> np.ndarray:
    """``x`` padded on its spatial axes (2..) by the geometry's pads, plus room for ceil-mode windows."""
    widths = [(0, 0), (0, 0)]
    for axis, (b, e) in enumerate(zip(geometry.pads_begin, geometry.pads_end)):
        needed = (
            (geometry.out[axis] - 1) * geometry.strides[axis]
            + (geometry.kernel[axis] - 1) * geometry.dilations[axis]
            + 1
        )
        extra = max(0, needed - (x.shape[axis + 2] + b + e))
        widths.append((b, e + extra))
    return np.pad(x, widths, constant_values=value)


def conv_reference(x: np.ndarray, w: np.ndarray, geometry: SpatialGeometry, group: int) -> np.ndarray:
    """Grouped N-d convolution (cross-correlation), no bias."""
    batch, channels = x.shape[:2]
    out_channels = w.shape[0]
    padded = pad_spatial(x, geometry)
    y = np.zeros((batch, group, out_channels // group) + geometry.out, dtype=np.float64)
    weights = w.reshape((group, out_channels // group) + w.shape[1:]).astype(np.float64)
    for offset in itertools.product(*(range(k) for k in geometry.kernel)):
        window = padded[(slice(None), slice(None)) + window_slices(geometry, offset)]
        window = window.reshape((batch, group, channels // group) + geometry.out)
        tap = weights[(slice(None), slice(None), slice(None)) + tuple(offset)]
        y += np.einsum("ngc...,gmc->ngm...", window, tap)
    return y.reshape((batch, out_channels) + geometry.out).astype(x.dtype)


def _conv_setup(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: Mapping[str, Any]
) -> tuple[SpatialGeometry, int]:
    if len(x_shape) < 3 or len(w_shape) != len(x_shape):
        raise UnsupportedOpError(f"Conv: X {x_shape} and W {w_shape} must have the same rank >= 3")
    group = int(attrs.get("group", 1))
    if x_shape[1] != w_shape[1] * group or w_shape[0] % group:
        raise UnsupportedOpError(f"Conv: channels of X {x_shape} and W {w_shape} do not match group={group}")
    kernel = ints(attrs.get("kernel_shape"), w_shape[2:])
    if kernel != tuple(w_shape[2:]):
        raise UnsupportedOpError(f"Conv: kernel_shape {kernel} differs from W's {w_shape[2:]}")
    geometry = spatial_geometry("Conv", tuple(x_shape[2:]), kernel, attrs)
    for axis, (size, b, e, k, d) in enumerate(
        zip(x_shape[2:], geometry.pads_begin, geometry.pads_end, kernel, geometry.dilations)
    ):
        if size + b + e < (k - 1) * d + 1:
            # A pooling window may overhang the input (its missing taps are padding); a convolution's may not, and
            # onnxruntime refuses it too ("Invalid input shape").
            raise ShapeError(
                f"Conv: the kernel spans {(k - 1) * d + 1} elements along spatial axis {axis}, more than the "
                f"{size + b + e} of the padded input {list(x_shape)}; use a larger input or more padding"
            )
    return geometry, group


def _conv_steps(
    attrs: Mapping[str, Any],
    shapes: Sequence[tuple[int, ...] | None],
    out_shape: tuple[int, ...],
    op_type: str = "Conv",
) -> list[EpilogueStep]:
    """The epilogue of a Conv or ConvTranspose: its own bias (input 2, per output channel), then any fused steps."""
    steps: list[EpilogueStep] = []
    bias = shapes[2] if len(shapes) > 2 else None
    if bias is not None:
        if bias != (out_shape[1],):
            raise UnsupportedOpError(f"{op_type}: bias of shape {bias} must be ({out_shape[1]},)")
        steps.append(EpilogueStep("add", 2, 1.0, (out_shape[1],) + (1,) * (len(out_shape) - 2)))
    return steps + parse_epilogue(op_type, attrs, 3, shapes, out_shape)


@register
class Conv(Operator):
    """Conv-1/11."""

    op_type = "Conv"
    since_version = 1

    def output_shapes(
        self, inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
    ) -> list[tuple[int, ...]] | None:
        x, w = inputs[0], inputs[1]
        if x is None or w is None:
            return None
        geometry, _ = _conv_setup(x.shape, w.shape, attrs)
        return [(x.shape[0], w.shape[0]) + geometry.out]

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, w = inputs[0], inputs[1]
        assert x is not None and w is not None
        geometry, group = _conv_setup(x.shape, w.shape, attrs)
        dtype = x.dtype
        if dtype == np.float16:  # as the kernels do: sums and the epilogue in float32, one rounding at the end
            x, w = x.astype(np.float32), w.astype(np.float32)
        y = conv_reference(x, w, geometry, group)
        shapes = [None if a is None else tuple(a.shape) for a in inputs]
        return [apply_epilogue(y, _conv_steps(attrs, shapes, tuple(y.shape)), inputs).astype(dtype, copy=False)]

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
        element = require_float("Conv", list(inputs) + list(outputs), caps)
        if len(x.shape) not in (3, 4):
            raise NotOnDevice(f"Conv: the WebGPU kernels cover 1-D and 2-D convolutions, not {len(x.shape) - 2}-D")
        geometry, group = _conv_setup(x.shape, w.shape, attrs)
        out_shape = (x.shape[0], w.shape[0]) + geometry.out
        steps = _conv_steps(attrs, [None if a is None else a.shape for a in inputs], out_shape)
        if element_count(out_shape) == 0:
            return OpPlan()
        if element_count(x.shape) == 0 or element_count(w.shape) == 0:
            # 0 input channels: every output is the bias (or 0), which the twin computes; the kernels would bind
            # a 0-byte buffer (a validation error) or leave the output unwritten.
            raise NotOnDevice("Conv: the input or the weight is empty (0 channels) but the output is not")
        if len(x.shape) == 3:  # 1-D: a 2-D convolution of height 1
            geometry = SpatialGeometry(
                (1,) + geometry.kernel,
                (1,) + geometry.strides,
                (1,) + geometry.dilations,
                (0,) + geometry.pads_begin,
                (0,) + geometry.pads_end,
                (1,) + geometry.out,
            )
            in_h, in_w = 1, x.shape[2]
        else:
            in_h, in_w = x.shape[2], x.shape[3]
        batch, channels, out_channels = x.shape[0], x.shape[1], w.shape[0]
        cin_g, cout_g = channels // group, out_channels // group
        kh, kw = geometry.kernel
        sh, sw = geometry.strides
        dh, dw = geometry.dilations
        ph, pw = geometry.pads_begin
        oh, ow = geometry.out
        table = BindingTable()
        x_name = table.add(Binding("input", 0), element)
        w_name = table.add(Binding("input", 1), element)
        output = table.add(Binding("output", 0), element, writable=True)
        epilogue = epilogue_function(steps, out_shape, table, element)
        constants_wgsl = f"""const CIN: u32 = {channels}u;
const CIN_G: u32 = {cin_g}u;
const COUT: u32 = {out_channels}u;
const COUT_G: u32 = {cout_g}u;
const GROUPS: u32 = {group}u;
const H: i32 = {in_h};
const W: i32 = {in_w};
const KH: u32 = {kh}u;
const KW: u32 = {kw}u;
const SH: u32 = {sh}u;
const SW: u32 = {sw}u;
const DH: u32 = {dh}u;
const DW: u32 = {dw}u;
const PH: i32 = {ph};
const PW: i32 = {pw};
const OH: u32 = {oh}u;
const OW: u32 = {ow}u;
"""
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        if cout_g >= 8:
            x_in, w_in = Binding("input", 0), Binding("input", 1)
            vec = f"vec4<{element}>"
            xs, ws = binding_name(x_in, element), binding_name(w_in, element)
            x4, w4 = binding_name(x_in, vec), binding_name(w_in, vec)

            def loaded(value: str, vector: bool) -> str:  # f16 storage widened to f32: the tiles and sums stay f32
                return value if element == "f32" else f"{'vec4<f32>' if vector else 'f32'}({value})"

            w_at = "((b % GROUPS) * COUT_G + m) * (CIN_G * KH * KW) + k"
            x_at = "((image * CIN + g * CIN_G + ci) * u32(H) + u32(ih)) * u32(W) + u32(iw)"
            x4_at = "(((b / GROUPS) * CIN + (b % GROUPS) * CIN_G + k) * OH * OW + n) / 4u"

            k_total = cin_g * kh * kw
            pointwise = kh == kw == 1 and sh == sw == 1 and ph == pw == 0 and oh == in_h and ow == in_w
            geometry2 = geometry

            def operands(full: list[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
                xv, wv = full[0], full[1]
                assert xv is not None and wv is not None
                xv = xv.reshape(batch, channels, in_h, in_w)
                padded = pad_spatial(xv, geometry2)
                columns = np.empty((batch, group, cin_g, kh, kw, oh, ow), dtype=np.float32)
                for ky in range(kh):
                    for kx in range(kw):
                        window = padded[(slice(None), slice(None)) + window_slices(geometry2, (ky, kx))]
                        columns[:, :, :, ky, kx] = window.reshape(batch, group, cin_g, oh, ow)
                b_matrix = columns.reshape(batch * group, k_total, oh * ow)
                a_matrix = np.broadcast_to(wv.reshape(1, group, cout_g, k_total), (batch, group, cout_g, k_total))
                return a_matrix.reshape(batch * group, cout_g, k_total), b_matrix

            problem = GemmProblem(
                batch=batch * group,
                m=cout_g,
                n=oh * ow,
                k=k_total,
                load_a=GemmLoad(f"    return {loaded(f'{ws}[{w_at}]', False)};", ((w_in, element),)),
                load_a4k=None
                if k_total % 4
                else GemmLoad(f"    return {loaded(f'{w4}[({w_at}) / 4u]', True)};", ((w_in, vec),)),
                load_b=GemmLoad(
                    f"""    let image = b / GROUPS;
    let g = b % GROUPS;
    let ci = k / (KH * KW);
    let tap = k % (KH * KW);
    let ih = i32((n / OW) * SH + (tap / KW) * DH) - PH;
    let iw = i32((n % OW) * SW + (tap % KW) * DW) - PW;
    if (ih < 0 || ih >= H || iw < 0 || iw >= W) {{ return 0.0; }}
    return {loaded(xs + "[" + x_at + "]", False)};""",
                    ((x_in, element),),
                ),
                load_b4n=GemmLoad(f"    return {loaded(f'{x4}[{x4_at}]', True)};", ((x_in, vec),))
                if pointwise and (oh * ow) % 4 == 0
                else None,
                prelude=constants_wgsl,
                operands=operands,
            )
            return plan_tiled_gemm(
                "Conv",
                problem,
                steps=steps,
                out_shape=out_shape,
                compute=compute,
                inputs=inputs,
                outputs=outputs,
                caps=caps,
            )
        check_loop_budget("Conv", cin_g * (kh + 1) * (kw + 1), caps)  # the direct kernel's ci / ky / kx loops
        total = element_count(out_shape)
        grid = grid_for_groups(-(-total // THREADS), caps)
        wgsl = f"""{table.enables()}{table.declarations()}
{constants_wgsl}
const TOTAL: u32 = {total}u;
{epilogue}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let index = {workgroup_index(grid)} * {THREADS}u + li;
    if (index >= TOTAL) {{ return; }}
    let ox = index % OW;
    let oy = (index / OW) % OH;
    let co = (index / (OW * OH)) % COUT;
    let image = index / (OW * OH * COUT);
    let g = co / COUT_G;
    var acc = 0.0;
    for (var ci = 0u; ci < CIN_G; ci = ci + 1u) {{
        let x_base = (image * CIN + g * CIN_G + ci) * u32(H * W);
        let w_base = (co * CIN_G + ci) * KH * KW;
        for (var ky = 0u; ky < KH; ky = ky + 1u) {{
            let iy = i32(oy * SH + ky * DH) - PH;
            if (iy < 0 || iy >= H) {{ continue; }}
            for (var kx = 0u; kx < KW; kx = kx + 1u) {{
                let ix = i32(ox * SW + kx * DW) - PW;
                if (ix < 0 || ix >= W) {{ continue; }}
                acc = fma({load_f32(x_name, element, "x_base + u32(iy * W + ix)")}, {load_f32(w_name, element, "w_base + ky * KW + kx")}, acc);
            }}
        }}
    }}
    {output}[index] = epilogue(acc, index);
}}
"""
        return single_kernel_plan("Conv", wgsl, grid, table, compute, inputs, outputs, caps)
