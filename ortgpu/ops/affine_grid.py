"""AffineGrid-20: the sampling grid (N, H, W, 2) or (N, D, H, W, 3) of affine matrices theta (N, 2, 3) or
(N, 3, 4) over the normalised output coordinates (GridSample's input).

Normalised coordinates of ``size`` positions are ``-1 + (2 i + 1) / size`` (pixel centres), or evenly spaced
from -1 to 1 with align_corners (0 for one position).  Computed on the CPU (it is tiny and needs the size values).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ._kernel import Operator, TensorInfo
from ._registry import register

__all__ = ["AffineGrid"]


def _positions(size: int, align: bool) -> np.ndarray:
    if align:
        return np.linspace(-1.0, 1.0, size) if size > 1 else np.zeros(size)
    return (2.0 * np.arange(size) + 1.0) / size - 1.0


@register
class AffineGrid(Operator):
    op_type = "AffineGrid"
    since_version = 20

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        theta, size = inputs[0], inputs[1]
        assert theta is not None and size is not None
        if theta.dtype.kind != "f":
            raise UnsupportedOpError(f"AffineGrid: theta of dtype {theta.dtype} is not supported (float only)")
        dims = [int(v) for v in np.asarray(size).reshape(-1)]
        if len(dims) not in (4, 5) or any(d < 0 for d in dims):
            raise ShapeError(f"AffineGrid: size must be (N, C, H, W) or (N, C, D, H, W), got {dims}")
        rank = len(dims) - 2
        n = dims[0]
        if theta.shape != (n, rank, rank + 1):
            raise ShapeError(f"AffineGrid: theta of shape {theta.shape} does not fit size {dims}")
        align = bool(int(attrs.get("align_corners", 0)))
        spatial = dims[2:]
        # coordinates per spatial axis, the innermost (x) first in the grid's last axis
        axes = [_positions(s, align) for s in spatial]
        mesh = np.meshgrid(*axes, indexing="ij")  # each (D.., H, W)
        base = np.stack([m for m in reversed(mesh)] + [np.ones(tuple(spatial))], axis=-1)  # (..., rank + 1)
        grid = np.einsum("...k,njk->n...j", base, theta.astype(np.float64))
        return [np.ascontiguousarray(grid.astype(theta.dtype))]
