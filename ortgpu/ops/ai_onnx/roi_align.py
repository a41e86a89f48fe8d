"""RoiAlign-10/16/22: average (or max) of bilinear samples over a grid in each output bin of each region.

Conventions (onnxruntime's, which the spec's reference follows):

* a region's corners are scaled by ``spatial_scale`` and shifted by -0.5 with ``half_pixel`` (the default
  from opset 16; opset 10 behaves as ``output_half_pixel``, where a region is also at least 1 x 1);
* ``sampling_ratio`` 0 samples ``ceil(region / bins)`` points per bin and axis;
* a sample beyond (-1, size) reads 0; others are clamped into the image, then interpolated bilinearly;
* ``max`` mode takes, per bin, the largest weighted corner value ``w * v`` over its samples' four corners.

On the device (float32, a positive ``sampling_ratio``: the sample loops must not depend on the regions'
values) one invocation per output element walks its bin's samples; ``sampling_ratio`` 0 runs on the CPU.
"""

from __future__ import annotations

import math
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
from .._tiling import wgsl_f32
from .._wgsl import (
    LINEAR_INVOCATION,
    check_binding_sizes,
    grid_for,
    kernel_entry,
    load_function,
    storage_declaration,
    workgroup_size_for,
)

__all__ = ["RoiAlign"]


def _text(value: Any, default: str) -> str:
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


def _corners(coords: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(valid, low index, high index, low weight, high weight) of sample coordinates along one axis."""
    valid = (coords >= -1.0) & (coords <= size)
    c = np.maximum(coords, 0.0)
    low = np.floor(c).astype(np.int64)
    at_end = low >= size - 1
    low = np.where(at_end, size - 1, low)
    high = np.where(at_end, size - 1, low + 1)
    c = np.where(at_end, low.astype(np.float64), c)
    frac = c - low
    return valid, low, high, 1.0 - frac, frac


def roi_align(
    x: np.ndarray,
    rois: np.ndarray,
    batch: np.ndarray,
    mode: str,
    out_h: int,
    out_w: int,
    ratio: int,
    scale: float,
    half_pixel: bool,
) -> np.ndarray:
    _, c, height, width = x.shape
    result = np.zeros((rois.shape[0], c, out_h, out_w), dtype=np.float64)
    offset = 0.5 if half_pixel else 0.0
    for r in range(rois.shape[0]):
        x0, y0, x1, y1 = (float(v) * scale - offset for v in rois[r].astype(np.float64))
        roi_w, roi_h = x1 - x0, y1 - y0
        if not half_pixel:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_h, bin_w = roi_h / out_h, roi_w / out_w
        grid_h = ratio if ratio > 0 else int(math.ceil(roi_h / out_h))
        grid_w = ratio if ratio > 0 else int(math.ceil(roi_w / out_w))
        count = max(grid_h * grid_w, 1)
        # sample coordinates per bin: (out, grid)
        ys = y0 + np.arange(out_h)[:, None] * bin_h + (np.arange(grid_h)[None, :] + 0.5) * bin_h / max(grid_h, 1)
        xs = x0 + np.arange(out_w)[:, None] * bin_w + (np.arange(grid_w)[None, :] + 0.5) * bin_w / max(grid_w, 1)
        vy, yl, yh, wyl, wyh = _corners(ys, height)
        vx, xl, xh, wxl, wxh = _corners(xs, width)
        image = x[int(batch[r])].astype(np.float64)  # (C, H, W)
        # (C, out_h, grid_h, out_w, grid_w) corner values and weights
        valid = vy[:, :, None, None] & vx[None, None, :, :]
        terms = []
        for yi, wy in ((yl, wyl), (yh, wyh)):
            for xi, wx in ((xl, wxl), (xh, wxh)):
                values = image[:, yi[:, :, None, None], xi[None, None, :, :]]
                weight = np.where(valid, wy[:, :, None, None] * wx[None, None, :, :], 0.0)
                terms.append(values * weight)
        if mode == "avg":
            total = sum(terms[1:], terms[0]).sum(axis=(2, 4))
            result[r] = total / count
        else:
            best = np.maximum.reduce(terms)
            best = np.where(valid, best, 0.0)
            if grid_h * grid_w == 0:
                continue
            result[r] = best.max(axis=(2, 4))
    return result.astype(x.dtype)


@register
class RoiAlign(Operator):
    """RoiAlign-10 (output_half_pixel) and -16/22 (coordinate_transformation_mode, half_pixel by default)."""

    op_type = "RoiAlign"
    since_version = 10
    opset_changes = (16,)

    def _settings(self, attrs: Mapping[str, Any]) -> tuple[str, int, int, int, float, bool]:
        mode = _text(attrs.get("mode"), "avg")
        if mode not in ("avg", "max"):
            raise UnsupportedOpError(f"RoiAlign: mode {mode!r} is not supported")
        default_transform = "half_pixel" if self.opset >= 16 else "output_half_pixel"
        transform = _text(attrs.get("coordinate_transformation_mode"), default_transform)
        if transform not in ("half_pixel", "output_half_pixel"):
            raise UnsupportedOpError(f"RoiAlign: coordinate_transformation_mode {transform!r} is not supported")
        out_h = int(attrs.get("output_height", 1))
        out_w = int(attrs.get("output_width", 1))
        ratio = int(attrs.get("sampling_ratio", 0))
        if out_h <= 0 or out_w <= 0 or ratio < 0:
            raise ShapeError(f"RoiAlign: output {out_h}x{out_w} and sampling_ratio {ratio} must be positive")
        scale = float(attrs.get("spatial_scale", 1.0))
        return mode, out_h, out_w, ratio, scale, transform == "half_pixel"

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, rois, batch = inputs[0], inputs[1], inputs[2]
        assert x is not None and rois is not None and batch is not None
        if x.dtype.kind != "f":
            raise UnsupportedOpError(f"RoiAlign: X of dtype {x.dtype} is not supported (float only)")
        if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4 or batch.shape != (rois.shape[0],):
            raise ShapeError(f"RoiAlign: shapes X {x.shape}, rois {rois.shape}, batch_indices {batch.shape} do not fit")
        if batch.size and (batch.min() < 0 or batch.max() >= x.shape[0]):
            raise ShapeError(f"RoiAlign: a batch index is outside [0, {x.shape[0]})")
        return [roi_align(x, rois, batch, *self._settings(attrs))]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x, rois, batch = inputs[0], inputs[1], inputs[2]
        assert x is not None and rois is not None and batch is not None
        settings = self._settings(attrs)
        mode, out_h, out_w, ratio, scale, half_pixel = settings
        out = outputs[0]
        if ratio == 0:
            raise NotOnDevice("RoiAlign: sampling_ratio 0 (samples per bin from the regions' sizes) runs on the CPU")
        if x.dtype.name != "float32" or rois.dtype.name != "float32" or out.dtype.name != "float32":
            raise NotOnDevice("RoiAlign: the WebGPU kernel computes float32 only")
        if batch.dtype.name not in ("int64", "int32"):
            raise NotOnDevice(f"RoiAlign: batch_indices of dtype {batch.dtype.name} run on the CPU")
        if len(x.shape) != 4 or tuple(out.shape) != (rois.shape[0], x.shape[1], out_h, out_w):
            raise NotOnDevice(f"RoiAlign: shapes X {x.shape}, output {out.shape} run on the CPU")
        if out.size == 0:
            return OpPlan()
        if 0 in x.shape or max(x.size, out.size) >= 2**31:
            raise NotOnDevice("RoiAlign: empty or huge tensors run on the CPU")
        check_loop_budget("RoiAlign", ratio * ratio + ratio, caps)
        check_binding_sizes("RoiAlign", [x, rois, batch, out], caps)
        n, c, height, width = x.shape
        offset = 0.5 if half_pixel else 0.0
        minimum = "" if half_pixel else "  rw = max(rw, 1.0f);\n  rh = max(rh, 1.0f);\n"
        if mode == "avg":
            start, combine, finish = (
                "0.0f",
                "acc = acc + (w1 * v1 + w2 * v2 + w3 * v3 + w4 * v4);",
                (f"acc / {wgsl_f32(ratio * ratio)}"),
            )
            invalid = ""
        else:
            start = "bitcast<f32>(0xff800000u)"
            combine = "acc = max(acc, max(max(w1 * v1, w2 * v2), max(w3 * v3, w4 * v4)));"
            finish = "acc"
            invalid = "acc = max(acc, 0.0f); "
        wgsl = f"""{storage_declaration(0, "xs", writable=False)}{storage_declaration(1, "rs", writable=False)}\
{storage_declaration(2, "bs", writable=False)}{storage_declaration(3, "dst", writable=True)}\
{load_function("loadb", "bs", np.dtype(batch.dtype))}
fn value(j: u32) -> f32 {{
  let pw = f32(j % {out_w}u);
  let ph = f32((j / {out_w}u) % {out_h}u);
  let ch = (j / {out_w * out_h}u) % {c}u;
  let r = j / {out_w * out_h * c}u;
  let b = u32(clamp(loadb(r), 0, {n - 1}));
  let base = (b * {c}u + ch) * {height * width}u;
  let x0 = bitcast<f32>(rs[4u * r]) * {wgsl_f32(scale)} - {wgsl_f32(offset)};
  let y0 = bitcast<f32>(rs[4u * r + 1u]) * {wgsl_f32(scale)} - {wgsl_f32(offset)};
  var rw = bitcast<f32>(rs[4u * r + 2u]) * {wgsl_f32(scale)} - {wgsl_f32(offset)} - x0;
  var rh = bitcast<f32>(rs[4u * r + 3u]) * {wgsl_f32(scale)} - {wgsl_f32(offset)} - y0;
{minimum}  let bh = rh / {wgsl_f32(out_h)};
  let bw = rw / {wgsl_f32(out_w)};
  var acc = {start};
  for (var iy = 0; iy < {ratio}; iy = iy + 1) {{
    var y = y0 + ph * bh + (f32(iy) + 0.5f) * bh / {wgsl_f32(ratio)};
    for (var ix = 0; ix < {ratio}; ix = ix + 1) {{
      var x = x0 + pw * bw + (f32(ix) + 0.5f) * bw / {wgsl_f32(ratio)};
      if (y < -1.0f || y > {wgsl_f32(height)} || x < -1.0f || x > {wgsl_f32(width)}) {{ {invalid}continue; }}
      var yy = max(y, 0.0f);
      var xx = max(x, 0.0f);
      var yl = i32(floor(yy));
      var xl = i32(floor(xx));
      var yh = yl + 1;
      var xh = xl + 1;
      if (yl >= {height - 1}) {{ yl = {height - 1}; yh = {height - 1}; yy = f32(yl); }}
      if (xl >= {width - 1}) {{ xl = {width - 1}; xh = {width - 1}; xx = f32(xl); }}
      let ly = yy - f32(yl);
      let lx = xx - f32(xl);
      let w1 = (1.0f - ly) * (1.0f - lx);
      let w2 = (1.0f - ly) * lx;
      let w3 = ly * (1.0f - lx);
      let w4 = ly * lx;
      let v1 = bitcast<f32>(xs[base + u32(yl) * {width}u + u32(xl)]);
      let v2 = bitcast<f32>(xs[base + u32(yl) * {width}u + u32(xh)]);
      let v3 = bitcast<f32>(xs[base + u32(yh) * {width}u + u32(xl)]);
      let v4 = bitcast<f32>(xs[base + u32(yh) * {width}u + u32(xh)]);
      {combine}
    }}
  }}
  return {finish};
}}
"""
        body = f"  let w = {LINEAR_INVOCATION};\n  if (w >= {out.size}u) {{ return; }}\n  dst[w] = bitcast<u32>(value(w));\n"
        workgroup = workgroup_size_for(caps.limits)
        wgsl += kernel_entry(workgroup, body)
        bindings = (Binding("input", 0), Binding("input", 1), Binding("input", 2), Binding("output", 0))

        def function(array: np.ndarray, boxes: np.ndarray, indices: np.ndarray) -> np.ndarray:
            return roi_align(array, boxes, np.clip(indices, 0, n - 1), *settings)

        twin = reference_twin(function, bindings, inputs, outputs)
        launch = grid_for(out.size, workgroup, caps.limits)
        return OpPlan(kernels=(KernelSpec("RoiAlign", wgsl, launch, bindings, twin),))
