"""DeformConv-19/22 (2-D, CPU): a convolution whose taps are moved by learned offsets and scaled by an optional
mask (deformable convolution v1/v2, torchvision's ``deform_conv2d``).

Tap ``(i, j)`` of output ``(oh, ow)`` reads input position ``(oh * stride - pad + i * dilation + dy,
ow * stride - pad + j * dilation + dx)`` interpolated bilinearly; positions at or beyond one pixel outside
the image read 0, and so do the out-of-image corners of a partly outside sample.  Offsets are
``(N, offset_group * 2 * kH * kW, oH, oW)`` with (dy, dx) pairs per tap; the mask ``(N, offset_group * kH * kW,
oH, oW)``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ._kernel import Operator, TensorInfo
from ._registry import register

__all__ = ["DeformConv"]


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
        if x.ndim != 4 or w.ndim != 4:
            raise UnsupportedOpError(f"DeformConv: only 2-D convolutions are supported (X {x.shape}, W {w.shape})")
        n, c, height, width = x.shape
        out_c, c_per_group, kh, kw = w.shape
        kernel = [int(v) for v in attrs.get("kernel_shape", [kh, kw])]
        if kernel != [kh, kw]:
            raise ShapeError(f"DeformConv: kernel_shape {kernel} differs from W's {[kh, kw]}")
        strides = [int(v) for v in attrs.get("strides", [1, 1])]
        dilations = [int(v) for v in attrs.get("dilations", [1, 1])]
        pads = [int(v) for v in attrs.get("pads", [0, 0, 0, 0])]
        group = int(attrs.get("group", 1))
        offset_group = int(attrs.get("offset_group", 1))
        if group <= 0 or c != c_per_group * group or out_c % group:
            raise ShapeError(f"DeformConv: channels X {c}, W {w.shape} do not fit group {group}")
        if offset_group <= 0 or c % offset_group:
            raise ShapeError(f"DeformConv: {c} channels are not divisible by offset_group {offset_group}")
        out_h = (height + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
        out_w = (width + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
        taps = kh * kw
        if offset.shape != (n, offset_group * 2 * taps, out_h, out_w):
            raise ShapeError(
                f"DeformConv: offset shape {offset.shape} should be {(n, offset_group * 2 * taps, out_h, out_w)}"
            )
        if mask is not None and mask.shape != (n, offset_group * taps, out_h, out_w):
            raise ShapeError(f"DeformConv: mask shape {mask.shape} should be {(n, offset_group * taps, out_h, out_w)}")
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
