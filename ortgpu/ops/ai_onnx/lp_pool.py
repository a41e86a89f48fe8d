"""LpPool-1/2/11/18 and GlobalLpPool-1/2: the p-norm over each window (``(sum |x|^p)^(1/p)``).

Windows follow :func:`.conv.spatial_geometry` (kernel_shape, strides, pads, auto_pad; dilations and ceil_mode
from opset 18); padding contributes zeros.  ``p`` is a float attribute in opset 1 and an integer from opset 2
(default 2).  LpPool runs on the device with MaxPool/AveragePool's window kernel; GlobalLpPool with p = 1 or 2 as
a row reduction (L1 / L2 norm), other p on the CPU.  Both take float32 or float16 (loaded into f32, summed in f32,
rounded once at the store).
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register
from .._tiling import require_float, single_kernel_plan
from .conv import SpatialGeometry, ints, pad_spatial, spatial_geometry, window_slices
from .pool import _pool_kernel
from .reduce import plan_row_reduction

__all__ = ["LpPool", "GlobalLpPool"]


def _p(attrs: Mapping[str, Any], op_type: str) -> float:
    p = float(attrs.get("p", 2))
    if not np.isfinite(p) or p <= 0:
        raise UnsupportedOpError(f"{op_type}: p must be a positive number, got {p}")
    return p


def _norm(total: np.ndarray, p: float) -> np.ndarray:
    if p == 1:
        return total
    result: np.ndarray = np.sqrt(total) if p == 2 else np.power(total, 1.0 / p)
    return result


def _powered(x: np.ndarray, p: float) -> np.ndarray:
    a = np.abs(x.astype(np.float64))
    return a if p == 1 else a * a if p == 2 else np.power(a, p)


def _check_input(x_shape: Sequence[int], op_type: str) -> None:
    if len(x_shape) < 3:
        raise ShapeError(f"{op_type}: X must have rank >= 3, got {tuple(x_shape)}")
    if x_shape[0] != 0 and any(d == 0 for d in x_shape[1:]):
        raise ShapeError(f"{op_type}: input shape {tuple(x_shape)} is empty but its batch is not (only N may be 0)")


@register
class LpPool(Operator):
    """LpPool-1/2/11/18 (p an integer from 2, dilations and ceil_mode from 18)."""

    op_type = "LpPool"
    since_version = 1
    opset_changes = (18,)

    def output_shapes(
        self, inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
    ) -> list[tuple[int, ...]] | None:
        """The window count of :func:`.conv.spatial_geometry`, as for MaxPool (onnx's inference differs at ceil-mode
        edges)."""
        x = inputs[0]
        if x is None or len(x.shape) < 3:
            return None
        return [tuple(x.shape[:2]) + self._geometry(x.shape, attrs).out]

    def _geometry(self, x_shape: Sequence[int], attrs: Mapping[str, Any]) -> SpatialGeometry:
        _check_input(x_shape, "LpPool")
        if "kernel_shape" not in attrs:
            raise ShapeError("LpPool: kernel_shape is required")
        if self.opset < 18 and (attrs.get("dilations") is not None or int(attrs.get("ceil_mode", 0))):
            raise UnsupportedOpError(f"LpPool: dilations and ceil_mode exist from opset 18 (model opset {self.opset})")
        kernel = ints(attrs["kernel_shape"], [])
        ceil_mode = bool(int(attrs.get("ceil_mode", 0)))
        return spatial_geometry("LpPool", tuple(x_shape[2:]), kernel, attrs, ceil_mode=ceil_mode)

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x = inputs[0]
        assert x is not None
        require_float("LpPool", [x, outputs[0]], caps)
        geometry = self._geometry(x.shape, attrs)
        p = _p(attrs, "LpPool")
        if tuple(outputs[0].shape) != tuple(x.shape[:2]) + geometry.out:
            raise NotOnDevice(f"LpPool: the planned output shape {outputs[0].shape} differs from its windows")
        if outputs[0].size == 0:
            return OpPlan()
        wgsl, grid, table = _pool_kernel("LpPool", x, geometry, False, caps, power=p)
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        return single_kernel_plan("LpPool", wgsl, grid, table, compute, inputs, outputs, caps)

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        if x.dtype.kind != "f":
            raise UnsupportedOpError(f"LpPool: X of dtype {x.dtype} is not supported (float tensors only)")
        p = _p(attrs, "LpPool")
        geometry = self._geometry(x.shape, attrs)
        padded = pad_spatial(_powered(x, p), geometry, 0.0)
        total = np.zeros(x.shape[:2] + geometry.out, dtype=np.float64)
        for offset in itertools.product(*(range(k) for k in geometry.kernel)):
            total += padded[(slice(None), slice(None)) + window_slices(geometry, offset)]
        return [_norm(total, p).astype(x.dtype)]


@register
class GlobalLpPool(Operator):
    """GlobalLpPool-1/2: the p-norm over every spatial axis, kept as size 1."""

    op_type = "GlobalLpPool"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        if x.dtype.kind != "f":
            raise UnsupportedOpError(f"GlobalLpPool: X of dtype {x.dtype} is not supported (float tensors only)")
        _check_input(x.shape, "GlobalLpPool")
        p = _p(attrs, "GlobalLpPool")
        total = _powered(x, p).sum(axis=tuple(range(2, x.ndim)), keepdims=True)
        return [_norm(total, p).astype(x.dtype)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x = inputs[0]
        assert x is not None
        _check_input(x.shape, "GlobalLpPool")
        p = _p(attrs, "GlobalLpPool")
        if p not in (1.0, 2.0):
            raise NotOnDevice(f"GlobalLpPool: p = {p} runs on the CPU (the device reduces p = 1 and 2)")
        require_float("GlobalLpPool", [x] + list(outputs), caps)  # the row reduction loads f16 into f32
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        kind = "l1" if p == 1 else "l2"
        return plan_row_reduction(
            "GlobalLpPool", kind, x, tuple(range(2, len(x.shape))), outputs, inputs, caps, compute
        )
