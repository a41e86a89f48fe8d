"""RoiAlign-10/16/22: average (or max) of bilinear samples over a grid in each output bin of each region.

Conventions (onnxruntime's, which the spec's reference follows):

* a region's corners are scaled by ``spatial_scale`` and shifted by -0.5 with ``half_pixel`` (the default
  from opset 16; opset 10 behaves as ``output_half_pixel``, where a region is also at least 1 x 1);
* ``sampling_ratio`` 0 samples ``ceil(region / bins)`` points per bin and axis;
* a sample beyond (-1, size) reads 0; others are clamped into the image, then interpolated bilinearly;
* ``max`` mode takes, per bin, the largest weighted corner value ``w * v`` over its samples' four corners.

Computed on the CPU (a few regions, data-dependent loops).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ._kernel import Operator, TensorInfo
from ._registry import register

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
        return [roi_align(x, rois, batch, mode, out_h, out_w, ratio, scale, transform == "half_pixel")]
