"""DeformConv-19/22 (2-D, CPU): a convolution whose taps are moved by learned offsets and scaled by an optional
mask (deformable convolution v1/v2, torchvision's ``deform_conv2d``).

Tap ``(i, j)`` of output ``(oh, ow)`` reads input position ``(oh * stride - pad + i * dilation + dy,
ow * stride - pad + j * dilation + dx)`` interpolated bilinearly; positions at or beyond one pixel outside
the image read 0, and so do the out-of-image corners of a partly outside sample.  Offsets are
``(N, offset_group * 2 * kH * kW, oH, oW)`` with (dy, dx) pairs per tap; the mask ``(N, offset_group * kH * kW,
oH, oW)``.  On the device (float32) one invocation per output element walks its group's channels and taps,
sampling bilinearly as the reference does; other dtypes and ranks run on the CPU.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

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
from .._wgsl import LINEAR_INVOCATION, check_binding_sizes, grid_for, kernel_entry, workgroup_size_for

__all__ = ["DeformConv"]


def _geometry(
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    offset_shape: Sequence[int],
    mask_shape: Sequence[int] | None,
    attrs: Mapping[str, Any],
) -> tuple[list[int], list[int], list[int], int, int, int, int]:
    """(strides, dilations, pads, group, offset_group, out_h, out_w), validated."""
    if len(x_shape) != 4 or len(w_shape) != 4:
        raise UnsupportedOpError(f"DeformConv: only 2-D convolutions are supported (X {x_shape}, W {w_shape})")
    n, c, height, width = (int(d) for d in x_shape)
    out_c, c_per_group, kh, kw = (int(d) for d in w_shape)
    kernel = [int(v) for v in attrs.get("kernel_shape", [kh, kw])]
    if kernel != [kh, kw]:
        raise ShapeError(f"DeformConv: kernel_shape {kernel} differs from W's {[kh, kw]}")
    strides = [int(v) for v in attrs.get("strides", [1, 1])]
    dilations = [int(v) for v in attrs.get("dilations", [1, 1])]
    pads = [int(v) for v in attrs.get("pads", [0, 0, 0, 0])]
    group = int(attrs.get("group", 1))
    offset_group = int(attrs.get("offset_group", 1))
    if group <= 0 or c != c_per_group * group or out_c % group:
        raise ShapeError(f"DeformConv: channels X {c}, W {tuple(w_shape)} do not fit group {group}")
    if offset_group <= 0 or c % offset_group:
        raise ShapeError(f"DeformConv: {c} channels are not divisible by offset_group {offset_group}")
    out_h = (height + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    out_w = (width + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    taps = kh * kw
    if tuple(offset_shape) != (n, offset_group * 2 * taps, out_h, out_w):
        raise ShapeError(
            f"DeformConv: offset shape {tuple(offset_shape)} should be {(n, offset_group * 2 * taps, out_h, out_w)}"
        )
    if mask_shape is not None and tuple(mask_shape) != (n, offset_group * taps, out_h, out_w):
        raise ShapeError(
            f"DeformConv: mask shape {tuple(mask_shape)} should be {(n, offset_group * taps, out_h, out_w)}"
        )
    return strides, dilations, pads, group, offset_group, out_h, out_w


def _bilinear(image: np.ndarray, y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Sample ``image`` (C, H, W) at positions ``y``, ``x`` (same shape S) -> (C, *S); zero outside."""
    _, height, width = image.shape
    inside = (y > -1) & (y < height) & (x > -1) & (x < width)
    y0 = np.floor(y).astype(np.int64)
    x0 = np.floor(x).astype(np.int64)
    ly, lx = y - y0, x - x0
    total = np.zeros((image.shape[0],) + y.shape, dtype=np.float64)
    for dy, wy in ((0, 1.0 - ly), (1, ly)):
        for dx, wx in ((0, 1.0 - lx), (1, lx)):
            yy, xx = y0 + dy, x0 + dx
            valid = inside & (yy >= 0) & (yy < height) & (xx >= 0) & (xx < width)
            values = image[:, np.clip(yy, 0, height - 1), np.clip(xx, 0, width - 1)]
            total += values * np.where(valid, wy * wx, 0.0)
    return total


@register
class DeformConv(Operator):
    op_type = "DeformConv"
    since_version = 19

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, w, offset = inputs[0], inputs[1], inputs[2]
        assert x is not None and w is not None and offset is not None
        bias = inputs[3] if len(inputs) > 3 else None
        mask = inputs[4] if len(inputs) > 4 else None
        if x.dtype.kind != "f":
            raise UnsupportedOpError(f"DeformConv: X of dtype {x.dtype} is not supported (float only)")
        n, c, height, width = x.shape
        out_c, c_per_group, kh, kw = w.shape
        strides, dilations, pads, group, offset_group, out_h, out_w = _geometry(
            x.shape, w.shape, offset.shape, None if mask is None else mask.shape, attrs
        )
        taps = kh * kw
        base_y = (np.arange(out_h) * strides[0] - pads[0])[:, None]
        base_x = (np.arange(out_w) * strides[1] - pads[1])[None, :]
        columns = np.zeros((n, c, taps, out_h, out_w), dtype=np.float64)
        per_offset_group = c // offset_group
        for b in range(n):
            for g in range(offset_group):
                channels = slice(g * per_offset_group, (g + 1) * per_offset_group)
                image = x[b, channels].astype(np.float64)
                for k in range(taps):
                    i, j = divmod(k, kw)
                    dy = offset[b, g * 2 * taps + 2 * k].astype(np.float64)
                    dx = offset[b, g * 2 * taps + 2 * k + 1].astype(np.float64)
                    sample = _bilinear(image, base_y + i * dilations[0] + dy, base_x + j * dilations[1] + dx)
                    if mask is not None:
                        sample = sample * mask[b, g * taps + k].astype(np.float64)
                    columns[b, channels, k] = sample
        out = np.zeros((n, out_c, out_h, out_w), dtype=np.float64)
        per_group_out = out_c // group
        for g in range(group):
            cols = columns[:, g * c_per_group : (g + 1) * c_per_group].reshape(n, c_per_group * taps, out_h, out_w)
            weights = w[g * per_group_out : (g + 1) * per_group_out].reshape(per_group_out, -1).astype(np.float64)
            out[:, g * per_group_out : (g + 1) * per_group_out] = np.einsum("ok,nkhw->nohw", weights, cols)
        if bias is not None:
            out += bias.astype(np.float64).reshape(1, -1, 1, 1)
        return [out.astype(x.dtype)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x, w, offset = inputs[0], inputs[1], inputs[2]
        assert x is not None and w is not None and offset is not None
        bias = inputs[3] if len(inputs) > 3 else None
        mask = inputs[4] if len(inputs) > 4 else None
        present = [info for info in (x, w, offset, bias, mask, outputs[0]) if info is not None]
        if any(info.dtype.name != "float32" for info in present):
            raise NotOnDevice("DeformConv: the WebGPU kernel computes float32 only")
        strides, dilations, pads, group, offset_group, out_h, out_w = _geometry(
            x.shape, w.shape, offset.shape, None if mask is None else mask.shape, attrs
        )
        out = outputs[0]
        n, c, height, width = x.shape
        out_c, c_per_group, kh, kw = w.shape
        if tuple(out.shape) != (n, out_c, out_h, out_w):
            raise NotOnDevice(f"DeformConv: the planned output shape {out.shape} differs from its geometry")
        if out.size == 0:
            return OpPlan()
        if 0 in x.shape or max(info.size for info in present) >= 2**31:
            raise NotOnDevice("DeformConv: empty or huge tensors run on the CPU")
        taps = kh * kw
        # per tap: its iteration plus the 2 + 4 of the bilinear sample's corner loops
        check_loop_budget("DeformConv", c_per_group * taps * 7 + c_per_group, caps)
        check_binding_sizes("DeformConv", present, caps)
        bindings = [Binding("input", 0), Binding("input", 1), Binding("input", 2)]
        names = ["xs", "ws", "os"]
        if bias is not None:
            bindings.append(Binding("input", 3))
            names.append("bs")
        if mask is not None:
            bindings.append(Binding("input", 4))
            names.append("ms")
        bindings.append(Binding("output", 0))
        declarations = "".join(
            f"@group(0) @binding({i}) var<storage, read> {name}: array<f32>;\n" for i, name in enumerate(names)
        )
        declarations += f"@group(0) @binding({len(names)}) var<storage, read_write> dst: array<f32>;\n"
        plane = out_h * out_w
        per_offset_group = c // offset_group
        per_group_out = out_c // group
        masked = (
            f"      v = v * ms[((n * {offset_group * taps}u + og * {taps}u + k) * {plane}u) + pos];\n"
            if mask is not None
            else ""
        )
        wgsl = f"""{declarations}
fn sample(base: u32, y: f32, x: f32) -> f32 {{
  if (!(y > -1.0 && y < {float(height)} && x > -1.0 && x < {float(width)})) {{ return 0.0; }}
  let fy = floor(y);
  let fx = floor(x);
  let ly = y - fy;
  let lx = x - fx;
  let y0 = i32(fy);
  let x0 = i32(fx);
  var total = 0.0;
  for (var dy = 0; dy < 2; dy = dy + 1) {{
    for (var dx = 0; dx < 2; dx = dx + 1) {{
      let yy = y0 + dy;
      let xx = x0 + dx;
      if (yy >= 0 && yy < {height} && xx >= 0 && xx < {width}) {{
        let wy = select(1.0 - ly, ly, dy == 1);
        let wx = select(1.0 - lx, lx, dx == 1);
        total = total + xs[base + u32(yy) * {width}u + u32(xx)] * (wy * wx);
      }}
    }}
  }}
  return total;
}}
fn value(j: u32) -> f32 {{
  let ow = j % {out_w}u;
  let oh = (j / {out_w}u) % {out_h}u;
  let oc = (j / {plane}u) % {out_c}u;
  let n = j / {plane * out_c}u;
  let pos = oh * {out_w}u + ow;
  let g = oc / {per_group_out}u;
  var acc = {"bs[oc]" if bias is not None else "0.0"};
  for (var ci = 0u; ci < {c_per_group}u; ci = ci + 1u) {{
    let ch = g * {c_per_group}u + ci;
    let og = ch / {per_offset_group}u;
    let base = (n * {c}u + ch) * {height * width}u;
    for (var k = 0u; k < {taps}u; k = k + 1u) {{
      let ki = i32(k / {kw}u);
      let kj = i32(k % {kw}u);
      let offset_channel = n * {offset_group * 2 * taps}u + og * {2 * taps}u + 2u * k;
      let dy = os[offset_channel * {plane}u + pos];
      let dx = os[(offset_channel + 1u) * {plane}u + pos];
      let y = f32(i32(oh) * {strides[0]} - {pads[0]} + ki * {dilations[0]}) + dy;
      let x = f32(i32(ow) * {strides[1]} - {pads[1]} + kj * {dilations[1]}) + dx;
      var v = sample(base, y, x);
{masked}      acc = acc + ws[(oc * {c_per_group}u + ci) * {taps}u + k] * v;
    }}
  }}
  return acc;
}}
"""
        body = f"  let w = {LINEAR_INVOCATION};\n  if (w >= {out.size}u) {{ return; }}\n  dst[w] = value(w);\n"
        workgroup = workgroup_size_for(caps.limits)
        wgsl += kernel_entry(workgroup, body)

        def function(*arrays: np.ndarray) -> np.ndarray:
            full: list[np.ndarray | None] = [arrays[0], arrays[1], arrays[2], None, None]
            rest = list(arrays[3:])
            if bias is not None:
                full[3] = rest.pop(0)
            if mask is not None:
                full[4] = rest.pop(0)
            return self.reference(full, attrs, outputs)[0]

        twin = reference_twin(function, bindings, inputs, outputs)
        launch = grid_for(out.size, workgroup, caps.limits)
        return OpPlan(kernels=(KernelSpec("DeformConv", wgsl, launch, tuple(bindings), twin),))
