"""GridSample-16/20/22: sample X (N, C, D1..Dr) at the normalised grid points (N, O1..Or, r) -> (N, C, O1..Or).

The grid's last axis holds coordinates in [-1, 1] with the innermost spatial axis first (x, y, z).  Opset 16
takes 4-D X with modes bilinear/nearest/bicubic; opset 20 renames them linear/nearest/cubic and allows any
rank.  Conventions (those of onnxruntime, which follows PyTorch):

* unnormalise: ``(g + 1) / 2 * (size - 1)`` with align_corners, else ``((g + 1) * size - 1) / 2`` (float32);
* a coordinate outside ``[0, size - 1]`` (align_corners) or ``[-0.5, size - 0.5]`` is first clamped into
  ``[0, size - 1]`` (border, except cubic) or reflected into that range (reflection);
* nearest rounds half to even; linear reads 2 taps and cubic 4 (Keys, a = -0.75) per axis; a tap outside
  the input reads 0 (zeros), the edge (border) or its reflection (reflection).

The CPU runs it (numpy); the work per output is small and data dependent.
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ._kernel import Operator, TensorInfo
from ._registry import register

__all__ = ["GridSample"]

F32 = np.float32


def _text(value: Any, default: str) -> str:
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


def _reflect(x: np.ndarray, low: float, high: float) -> np.ndarray:
    """Fold coordinates into [low, high] by reflecting at its ends (repeatedly)."""
    span = high - low
    if span <= 0:
        return np.zeros_like(x) + max(low, 0.0)
    below = x < low
    above = x > high
    distance = np.where(below, low - x, np.where(above, x - high, 0.0))
    folds = np.floor(distance / span)
    rest = distance - folds * span
    even = np.mod(folds, 2) == 0
    from_below = np.where(even, low + rest, high - rest)
    from_above = np.where(even, high - rest, low + rest)
    return np.where(below, from_below, np.where(above, from_above, x))


def _cubic(t: np.ndarray) -> list[np.ndarray]:
    a = -0.75
    weights = []
    for distance in (t + 1.0, t, 1.0 - t, 2.0 - t):
        d = np.abs(distance)
        near = ((a + 2) * d - (a + 3)) * d * d + 1
        far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
        weights.append(np.where(d <= 1, near, np.where(d < 2, far, 0.0)))
    return weights


def grid_sample(x: np.ndarray, grid: np.ndarray, mode: str, padding: str, align: bool) -> np.ndarray:
    rank = x.ndim - 2
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    out_spatial = grid.shape[1:-1]
    if grid.ndim != x.ndim or grid.shape[0] != n or grid.shape[-1] != rank:
        raise ShapeError(f"GridSample: grid of shape {grid.shape} does not fit X of shape {x.shape}")
    if n == 0 or c == 0 or 0 in out_spatial:
        return np.zeros((n, c) + tuple(out_spatial), dtype=x.dtype)
    if 0 in spatial:
        raise ShapeError(f"GridSample: X of shape {x.shape} has an empty spatial axis")
    g = grid.astype(F32)
    per_axis: list[list[tuple[np.ndarray, np.ndarray]]] = []  # per spatial axis: (index, weight) taps
    for axis, size in enumerate(spatial):
        v = g[..., rank - 1 - axis]
        if align:
            coord = (v + F32(1)) / F32(2) * F32(size - 1)
            low, high = 0.0, float(size - 1)
        else:
            coord = ((v + F32(1)) * F32(size) - F32(1)) / F32(2)
            low, high = -0.5, size - 0.5
        coord = coord.astype(np.float64)
        if mode == "nearest":
            coord = np.rint(coord)
        if padding == "border" and mode != "cubic":  # cubic clamps its taps only
            coord = np.clip(coord, 0.0, size - 1.0)
        elif padding == "reflection":
            coord = _reflect(coord, low, high)
        if mode == "nearest":
            taps = [(np.rint(coord).astype(np.int64), np.ones_like(coord))]
        elif mode == "linear":
            base = np.floor(coord)
            t = coord - base
            taps = [(base.astype(np.int64), 1.0 - t), (base.astype(np.int64) + 1, t)]
        else:
            base = np.floor(coord)
            weights = _cubic(coord - base)
            taps = [(base.astype(np.int64) + k - 1, weights[k]) for k in range(4)]
        resolved = []
        for index, weight in taps:
            if padding == "zeros":
                inside = (index >= 0) & (index < size)
                weight = np.where(inside, weight, 0.0)
                index = np.clip(index, 0, size - 1)
            elif padding == "border":
                index = np.clip(index, 0, size - 1)
            else:
                index = np.clip(_reflect(index.astype(np.float64), low, high).astype(np.int64), 0, size - 1)
            resolved.append((index, weight))
        per_axis.append(resolved)
    batch = np.arange(n).reshape((n,) + (1,) * rank)
    data = np.moveaxis(x, 1, -1).astype(np.float64)  # (N, D1..Dr, C)
    total = np.zeros((n,) + tuple(out_spatial) + (c,), dtype=np.float64)
    for combination in itertools.product(*per_axis):
        weight = np.ones((n,) + tuple(out_spatial), dtype=np.float64)
        where: tuple[Any, ...] = (batch,)
        for tap_index, tap_weight in combination:
            weight = weight * tap_weight
            where += (tap_index,)
        total += data[where] * weight[..., None]
    return np.ascontiguousarray(np.moveaxis(total, -1, 1).astype(x.dtype))


@register
class GridSample(Operator):
    """GridSample-16 (4-D; bilinear/nearest/bicubic) and -20/22 (N-d; linear/nearest/cubic)."""

    op_type = "GridSample"
    since_version = 16

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, grid = inputs[0], inputs[1]
        assert x is not None and grid is not None
        if x.dtype.kind != "f" or grid.dtype.kind != "f":
            raise UnsupportedOpError(f"GridSample: X {x.dtype} / grid {grid.dtype} are not supported (float only)")
        names = {"bilinear": "linear", "bicubic": "cubic"} if self.opset < 20 else {}
        raw_mode = _text(attrs.get("mode"), "bilinear" if self.opset < 20 else "linear")
        mode = names.get(raw_mode, raw_mode)
        if mode not in ("linear", "nearest", "cubic") or (self.opset < 20 and raw_mode in ("linear", "cubic")):
            raise UnsupportedOpError(f"GridSample: mode {raw_mode!r} is not supported at opset {self.opset}")
        padding = _text(attrs.get("padding_mode"), "zeros")
        if padding not in ("zeros", "border", "reflection"):
            raise UnsupportedOpError(f"GridSample: padding_mode {padding!r} is not supported")
        if x.ndim < 3 or (self.opset < 20 and x.ndim != 4):
            raise ShapeError(f"GridSample: X of rank {x.ndim} is not supported at opset {self.opset}")
        if mode == "cubic" and x.ndim != 4:
            raise UnsupportedOpError("GridSample: cubic mode is defined for 4-D X only")
        align = bool(int(attrs.get("align_corners", 0)))
        return [grid_sample(x, grid, mode, padding, align)]
