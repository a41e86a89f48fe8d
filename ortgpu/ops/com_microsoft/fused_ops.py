"""onnxruntime's fused MatMul and Conv operators: FusedMatMul, FusedConv and NhwcConv.

Each is a standard operator with something folded in, and runs on the standard operator's kernels:

* FusedMatMul is MatMul with transposes and a scale.  ``transA``/``transB`` swap an operand's last two axes,
  ``transBatchA``/``transBatchB`` move its first axis to just before its last two (onnxruntime's reading; both
  operands then have one rank, at least 3): both are permutations of the operand's axes, which the MatMul kernels
  read through strides (the ``_input_perms`` attribute of :mod:`ortgpu.ops.ai_onnx.matmul`), and ``alpha`` is the
  fused epilogue's ``("scale", alpha)``.  No copy, no extra dispatch.
* FusedConv is Conv followed by ``activation(conv + B + Z)``: the optional sum input ``Z`` (index 3, where Conv's
  epilogue inputs start) and the activation become Conv's fused epilogue (Relu, Sigmoid, Tanh, LeakyRelu,
  Clip, HardSigmoid as scale, shift and clip).
* NhwcConv is Conv on channels-last tensors, as onnxruntime's transformer optimizer writes it: X (N, H, W, C),
  W (M, kH, kW, C / group) and Y (N, oH, oW, M).  Without groups it is one implicit GEMM per image on the tiled GEMM:
  rows are output pixels, columns output channels, and K runs over (ky, kx, c), the order both X's pixels and W's
  rows hold it in, so the loads along K are contiguous (vec4 where C is a multiple of 4) and Y's rows are the
  GEMM's rows.  Grouped NhwcConv (depthwise...) has a direct kernel, one invocation per output element, as Conv's
  narrow groups do; 3-D runs on the CPU.

float32 and float16 on the device, as the standard kernels take them.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ..._types import element_count
from .._epilogue import EpilogueStep, epilogue_function
from .._kernel import Binding, DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo, check_loop_budget
from .._registry import register
from .._tiled_gemm import GemmLoad, GemmProblem, binding_name, plan_tiled_gemm
from .._tiling import THREADS, BindingTable, grid_for_groups, require_float, single_kernel_plan, workgroup_index
from ..ai_onnx.conv import Conv, load_f32, pad_spatial, spatial_geometry, window_slices
from ..ai_onnx.matmul import MatMul, matmul_output_shape

__all__ = ["FusedMatMul", "FusedConv", "NhwcConv", "fused_matmul_perms", "fused_conv_epilogue"]

Perm = tuple[int, ...]


def _flag(attrs: Mapping[str, Any], name: str) -> bool:
    return bool(int(attrs.get(name, 0)))


def fused_matmul_perms(
    a_shape: tuple[int, ...], b_shape: tuple[int, ...], attrs: Mapping[str, Any]
) -> tuple[Perm | None, Perm | None]:
    """FusedMatMul's transposes as MatMul's folded input permutations (``None``: the operand as stored).

    Raises
    ------
    ShapeError
        ``transBatchA``/``transBatchB`` set on operands of different ranks or of rank below 3 (onnxruntime refuses
        them too), or operands whose transposed shapes do not multiply.
    """
    if (_flag(attrs, "transBatchA") or _flag(attrs, "transBatchB")) and not (len(a_shape) == len(b_shape) >= 3):
        raise ShapeError(
            f"FusedMatMul: transBatchA/transBatchB need operands of one rank, at least 3; got shapes {list(a_shape)} "
            f"and {list(b_shape)}"
        )
    perms: list[Perm | None] = []
    for shape, batch, swap in (
        (a_shape, _flag(attrs, "transBatchA"), _flag(attrs, "transA")),
        (b_shape, _flag(attrs, "transBatchB"), _flag(attrs, "transB")),
    ):
        rank = len(shape)
        if rank < 2:  # a vector has no axes to swap (onnxruntime ignores transA/transB there)
            perms.append(None)
            continue
        perm = list(range(1, rank - 1)) + [0, rank - 1] if batch else list(range(rank))
        if swap:
            perm[-2], perm[-1] = perm[-1], perm[-2]
        perms.append(None if perm == list(range(rank)) else tuple(perm))
    logical = [
        shape if perm is None else tuple(shape[p] for p in perm) for shape, perm in zip((a_shape, b_shape), perms)
    ]
    try:
        matmul_output_shape(logical[0], logical[1])
    except ValueError:
        raise ShapeError(
            f"FusedMatMul: operands of shapes {list(a_shape)} and {list(b_shape)} do not multiply once transposed "
            f"(as {list(logical[0])} x {list(logical[1])})"
        ) from None
    return perms[0], perms[1]


@register
class FusedMatMul(Operator):
    """FusedMatMul (com.microsoft): ``alpha * op(A) @ op(B)``, run as a MatMul (see the module docstring)."""

    op_type = "FusedMatMul"
    domain = "com.microsoft"
    since_version = 1

    def _matmul_attrs(self, shapes: Sequence[tuple[int, ...]], attrs: Mapping[str, Any]) -> dict[str, Any]:
        if len(shapes) != 2:
            raise UnsupportedOpError(f"FusedMatMul (com.microsoft): takes two inputs, A and B; got {len(shapes)}")
        perms = fused_matmul_perms(shapes[0], shapes[1], attrs)
        lowered: dict[str, Any] = {}
        if perms != (None, None):
            lowered["_input_perms"] = perms
        alpha = float(np.float32(attrs.get("alpha", 1.0)))
        if alpha != 1.0:
            lowered["_epilogue"] = (("scale", alpha),)
        return lowered

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        shapes = [tuple(x.shape) for x in inputs if x is not None]
        return MatMul(13).reference(inputs, self._matmul_attrs(shapes, attrs), outputs)

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        shapes = [x.shape for x in inputs if x is not None]
        return MatMul(13).plan(inputs, outputs, self._matmul_attrs(shapes, attrs), caps, constants)


#: FusedConv's activations: name -> (number of activation_params, epilogue steps from them).
_ACTIVATIONS: dict[str, tuple[int, Any]] = {
    "Relu": (0, lambda p: [("relu",)]),
    "Sigmoid": (0, lambda p: [("sigmoid",)]),
    "Tanh": (0, lambda p: [("tanh",)]),
    "LeakyRelu": (1, lambda p: [("leaky_relu", p[0])]),
    "Clip": (2, lambda p: [("clip", p[0], p[1])]),
    "HardSigmoid": (2, lambda p: [("scale", p[0]), ("shift", p[1]), ("clip", 0.0, 1.0)]),
}


def fused_conv_epilogue(attrs: Mapping[str, Any], has_sum: bool) -> tuple[tuple[Any, ...], ...]:
    """FusedConv's ``activation(conv + B + Z)`` after the bias, as Conv's ``_epilogue`` steps (Z is input 3).

    Raises
    ------
    UnsupportedOpError
        An activation FusedConv does not define, or ``activation_params`` of the wrong length for it.
    """
    raw = attrs.get("activation", "")
    name = raw.decode() if isinstance(raw, bytes) else str(raw)
    steps: list[tuple[Any, ...]] = [("add", 3)] if has_sum else []
    if not name:
        return tuple(steps)
    if name not in _ACTIVATIONS:
        raise UnsupportedOpError(
            f"FusedConv (com.microsoft): activation {name!r} is not one of {', '.join(sorted(_ACTIVATIONS))}"
        )
    count, make = _ACTIVATIONS[name]
    params = [float(np.float32(p)) for p in attrs.get("activation_params", ())]
    if len(params) != count:
        raise UnsupportedOpError(
            f"FusedConv (com.microsoft): activation {name} takes {count} activation_params, got {len(params)}"
        )
    return tuple(steps + make(params))


@register
class FusedConv(Operator):
    """FusedConv (com.microsoft): ``activation(Conv(X, W, B) + Z)``, run as a Conv with a fused epilogue."""

    op_type = "FusedConv"
    domain = "com.microsoft"
    since_version = 1

    def _conv_attrs(self, inputs: Sequence[Any], attrs: Mapping[str, Any]) -> dict[str, Any]:
        if len(inputs) < 2 or len(inputs) > 4 or inputs[0] is None or inputs[1] is None:
            raise UnsupportedOpError("FusedConv (com.microsoft): takes X, W and the optional B and Z")
        lowered = {k: v for k, v in attrs.items() if k not in ("activation", "activation_params")}
        z = inputs[3] if len(inputs) > 3 else None
        if z is not None:
            x, w = inputs[0], inputs[1]
            expected = Conv(11).output_shapes(
                [TensorInfo(tuple(x.shape), x.dtype), TensorInfo(tuple(w.shape), w.dtype)], attrs
            )
            assert expected is not None
            if tuple(z.shape) != expected[0]:
                raise ShapeError(
                    f"FusedConv: the sum input Z must have the output's shape {list(expected[0])}, got {list(z.shape)}"
                )
        lowered["_epilogue"] = fused_conv_epilogue(attrs, z is not None)
        return lowered

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        return Conv(11).reference(inputs, self._conv_attrs(inputs, attrs), outputs)

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        return Conv(11).plan(inputs, outputs, self._conv_attrs(inputs, attrs), caps, constants)


def _to_channels_first(rank: int) -> Perm:
    return (0, rank - 1) + tuple(range(1, rank - 1))


def _to_channels_last(rank: int) -> Perm:
    return (0,) + tuple(range(2, rank)) + (1,)


@register
class NhwcConv(Operator):
    """NhwcConv (com.microsoft): Conv on channels-last X (N, ..., C) and W (M, ..., C / group), giving (N, ..., M)."""

    op_type = "NhwcConv"
    domain = "com.microsoft"
    since_version = 1

    def _channels_first(self, inputs: Sequence[Any], attrs: Mapping[str, Any]) -> tuple[TensorInfo, TensorInfo]:
        if len(inputs) < 2 or len(inputs) > 3 or inputs[0] is None or inputs[1] is None:
            raise UnsupportedOpError("NhwcConv (com.microsoft): takes X, W and the optional B")
        x, w = inputs[0], inputs[1]
        if len(x.shape) < 3 or len(w.shape) != len(x.shape):
            raise ShapeError(
                f"NhwcConv: X {list(x.shape)} and W {list(w.shape)} must have one rank, at least 3 (N, ..., C)"
            )
        group = int(attrs.get("group", 1))
        if group < 1 or x.shape[-1] != w.shape[-1] * group or w.shape[0] % group:
            raise ShapeError(
                f"NhwcConv: X {list(x.shape)} has {x.shape[-1]} channels (its last axis), W {list(w.shape)} takes "
                f"{w.shape[-1]} per group (its last axis) for {w.shape[0]} outputs; with group={group} they must give "
                "channels = W's last axis * group, and outputs a multiple of group"
            )
        rank = len(x.shape)
        perm = _to_channels_first(rank)
        return (
            TensorInfo(tuple(x.shape[p] for p in perm), x.dtype),
            TensorInfo(tuple(w.shape[p] for p in perm), w.dtype),
        )

    def output_shapes(
        self, inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
    ) -> list[tuple[int, ...]] | None:
        x, w = self._channels_first(inputs, attrs)
        shapes = Conv(11).output_shapes([x, w], attrs)
        assert shapes is not None
        return [tuple(shapes[0][p] for p in _to_channels_last(len(x.shape)))]

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        self._channels_first(inputs, attrs)
        x, w = inputs[0], inputs[1]
        assert x is not None and w is not None
        rank = x.ndim
        first = _to_channels_first(rank)
        y = Conv(11).reference([np.transpose(x, first), np.transpose(w, first), *inputs[2:]], attrs, outputs)[0]
        return [np.ascontiguousarray(np.transpose(y, _to_channels_last(rank)))]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x_first, w_first = self._channels_first(inputs, attrs)
        x, w = inputs[0], inputs[1]
        assert x is not None and w is not None
        element = require_float("NhwcConv", list(inputs) + list(outputs), caps)
        if len(x.shape) not in (3, 4):
            raise NotOnDevice(f"NhwcConv: the WebGPU kernel covers 1-D and 2-D convolutions, not {len(x.shape) - 2}-D")
        shapes = Conv(11).output_shapes([x_first, w_first], attrs)  # checks channels, kernel_shape and geometry
        assert shapes is not None
        out_shape = tuple(shapes[0][p] for p in _to_channels_last(len(x.shape)))
        if element_count(out_shape) == 0:
            return OpPlan()
        if element_count(x.shape) == 0:
            raise NotOnDevice("NhwcConv: the input is empty (0 channels) but the output is not")
        steps: list[EpilogueStep] = []
        bias = inputs[2] if len(inputs) > 2 else None
        channels_out = w.shape[0]
        if bias is not None:
            if bias.shape != (channels_out,):
                raise ShapeError(f"NhwcConv: B must have shape [{channels_out}], got {list(bias.shape)}")
            steps.append(EpilogueStep("add", 2, 1.0, (1,) * (len(out_shape) - 1) + (channels_out,)))
        geometry = spatial_geometry("Conv", tuple(x_first.shape[2:]), tuple(w_first.shape[2:]), attrs)
        two_d = len(x.shape) == 4

        def axis(values: tuple[int, ...], index: int, default: int) -> int:
            return values[index] if two_d else (default if index == 0 else values[0])

        batch, channels = x.shape[0], x.shape[-1]
        in_h, in_w = (x.shape[1], x.shape[2]) if two_d else (1, x.shape[1])
        kh, kw = axis(geometry.kernel, 0, 1), axis(geometry.kernel, 1, 1)
        sh, sw = axis(geometry.strides, 0, 1), axis(geometry.strides, 1, 1)
        dh, dw = axis(geometry.dilations, 0, 1), axis(geometry.dilations, 1, 1)
        ph, pw = axis(geometry.pads_begin, 0, 0), axis(geometry.pads_begin, 1, 0)
        oh, ow = axis(geometry.out, 0, 1), axis(geometry.out, 1, 1)
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        group = int(attrs.get("group", 1))
        if group != 1:
            # Grouped (depthwise...): one invocation per output element, looping over its group's taps; each tap's
            # channels are contiguous in X and in W.
            cin_g, cout_g = w.shape[-1], channels_out // group
            check_loop_budget("NhwcConv", kh * kw * (cin_g + 1) + kh, caps)
            table = BindingTable()
            x_name = table.add(Binding("input", 0), element)
            w_name = table.add(Binding("input", 1), element)
            out = table.add(Binding("output", 0), element, writable=True)
            epilogue = epilogue_function(steps, out_shape, table, element)
            total = element_count(out_shape)
            grid = grid_for_groups(-(-total // THREADS), caps)
            product = f"{load_f32(x_name, element, 'x_base + ci')} * {load_f32(w_name, element, 'w_base + ci')}"
            wgsl = f"""{table.enables()}{table.declarations()}
{epilogue}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let index = {workgroup_index(grid)} * {THREADS}u + li;
    if (index >= {total}u) {{ return; }}
    let co = index % {channels_out}u;
    let pixel = index / {channels_out}u;
    let ox = pixel % {ow}u;
    let oy = (pixel / {ow}u) % {oh}u;
    let image = pixel / {ow * oh}u;
    let g = co / {cout_g}u;
    var acc = 0.0;
    for (var ky = 0u; ky < {kh}u; ky = ky + 1u) {{
        let iy = i32(oy * {sh}u + ky * {dh}u) - {ph};
        if (iy < 0 || iy >= {in_h}) {{ continue; }}
        for (var kx = 0u; kx < {kw}u; kx = kx + 1u) {{
            let ix = i32(ox * {sw}u + kx * {dw}u) - {pw};
            if (ix < 0 || ix >= {in_w}) {{ continue; }}
            let x_base = ((image * {in_h}u + u32(iy)) * {in_w}u + u32(ix)) * {channels}u + g * {cin_g}u;
            let w_base = ((co * {kh}u + ky) * {kw}u + kx) * {cin_g}u;
            for (var ci = 0u; ci < {cin_g}u; ci = ci + 1u) {{
                acc = acc + {product};
            }}
        }}
    }}
    {out}[index] = epilogue(acc, index);
}}
"""
            return single_kernel_plan("NhwcConv", wgsl, grid, table, compute, inputs, outputs, caps)
        k_total = kh * kw * channels
        x_in, w_in = Binding("input", 0), Binding("input", 1)
        vec = f"vec4<{element}>"
        xs, ws = binding_name(x_in, element), binding_name(w_in, element)
        x4, w4 = binding_name(x_in, vec), binding_name(w_in, vec)

        def loaded(value: str, vector: bool) -> str:  # f16 storage widened to f32: the tiles and sums stay f32
            return value if element == "f32" else f"{'vec4<f32>' if vector else 'f32'}({value})"

        # A(b, m, k): image b, output pixel m, k = (ky * KW + kx) * C + c; the pixel's C channels are contiguous.
        pixel = f"""    let tap = k / {channels}u;
    let ih = i32((m / {ow}u) * {sh}u + (tap / {kw}u) * {dh}u) - {ph};
    let iw = i32((m % {ow}u) * {sw}u + (tap % {kw}u) * {dw}u) - {pw};
    if (ih < 0 || ih >= {in_h} || iw < 0 || iw >= {in_w}) {{ return {{zero}}; }}
    let at = ((b * {in_h}u + u32(ih)) * {in_w}u + u32(iw)) * {channels}u + k % {channels}u;
"""
        load_a = GemmLoad(
            pixel.replace("{zero}", "0.0") + f"    return {loaded(f'{xs}[at]', False)};", ((x_in, element),)
        )
        load_a4k = None
        if channels % 4 == 0:  # four k from a multiple of 4 are four channels of one pixel
            body = pixel.replace("{zero}", "vec4<f32>(0.0)") + f"    return {loaded(f'{x4}[at / 4u]', True)};"
            load_a4k = GemmLoad(body, ((x_in, vec),))
        # B(b, k, n) = W[n, k]: W's rows are (ky, kx, c) like A's columns.
        load_b = GemmLoad(f"    return {loaded(f'{ws}[n * {k_total}u + k]', False)};", ((w_in, element),))
        load_b4k = None
        if k_total % 4 == 0:
            load_b4k = GemmLoad(f"    return {loaded(f'{w4}[(n * {k_total}u + k) / 4u]', True)};", ((w_in, vec),))
        geometry2 = geometry

        def operands(full: list[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
            xv, wv = full[0], full[1]
            assert xv is not None and wv is not None
            first = np.transpose(xv.reshape(batch, in_h, in_w, channels), (0, 3, 1, 2)).astype(np.float32)
            padded = pad_spatial(first, _two_d(geometry2))
            columns = np.empty((batch, oh, ow, kh, kw, channels), dtype=np.float32)
            for ky in range(kh):
                for kx in range(kw):
                    window = padded[(slice(None), slice(None)) + window_slices(_two_d(geometry2), (ky, kx))]
                    columns[:, :, :, ky, kx, :] = np.transpose(window, (0, 2, 3, 1))
            a_matrix = columns.reshape(batch, oh * ow, k_total)
            b_matrix = np.broadcast_to(
                wv.reshape(channels_out, k_total).T.astype(np.float32), (batch, k_total, channels_out)
            )
            return a_matrix, b_matrix

        problem = GemmProblem(
            batch=batch,
            m=oh * ow,
            n=channels_out,
            k=k_total,
            load_a=load_a,
            load_b=load_b,
            load_a4k=load_a4k,
            load_b4k=load_b4k,
            operands=operands,
        )
        return plan_tiled_gemm(
            "NhwcConv",
            problem,
            steps=steps,
            out_shape=out_shape,
            compute=compute,
            inputs=inputs,
            outputs=outputs,
            caps=caps,
        )


def _two_d(geometry: Any) -> Any:
    """A 1-D geometry as the 2-D one of height 1 (the 2-D helpers' view of it); a 2-D one unchanged."""
    if len(geometry.kernel) == 2:
        return geometry
    return type(geometry)(
        (1,) + geometry.kernel,
        (1,) + geometry.strides,
        (1,) + geometry.dilations,
        (0,) + geometry.pads_begin,
        (0,) + geometry.pads_end,
        (1,) + geometry.out,
    )
