"""MaxPool, AveragePool (N-d reference; 1-D and 2-D on the device) and GlobalAveragePool.

Windows follow :func:`.conv.spatial_geometry` (kernel_shape, strides, pads, auto_pad, dilations, ceil_mode;
a ceil-mode window never starts in the end padding).  AveragePool divides by the taps inside the input
(``count_include_pad=0``) or inside the padded input (``count_include_pad=1``; taps that only exist because
of ceil_mode never count), as onnxruntime does.  MaxPool's optional Indices output (flat index into X, row-
or column-major per ``storage_order``) is computed by the reference only: plans that need it raise
:class:`NotOnDevice`.
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from ._kernel import Binding, DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from ._registry import register
from ._tiling import THREADS, BindingTable, grid_for_groups, require_float32, single_kernel_plan, workgroup_index
from .conv import SpatialGeometry, ints, pad_spatial, spatial_geometry, window_slices
from .reduce import plan_row_reduction

__all__ = ["MaxPool", "AveragePool", "GlobalAveragePool"]


def _geometry(op_type: str, x_shape: tuple[int, ...], attrs: Mapping[str, Any], opset: int) -> SpatialGeometry:
    if "kernel_shape" not in attrs:
        raise UnsupportedOpError(f"{op_type}: kernel_shape is required")
    if len(x_shape) < 3:
        raise UnsupportedOpError(f"{op_type}: X must have rank >= 3, got {x_shape}")
    if attrs.get("dilations") is not None and op_type == "AveragePool" and opset < 19:
        raise UnsupportedOpError(f"AveragePool: dilations exist from opset 19 (model opset {opset})")
    kernel = ints(attrs["kernel_shape"], [])
    return spatial_geometry(op_type, tuple(x_shape[2:]), kernel, attrs, ceil_mode=bool(attrs.get("ceil_mode", 0)))


def _tap_counts(geometry: SpatialGeometry, spatial: Sequence[int], include_pad: bool) -> np.ndarray:
    """Per output position, the number of window taps inside the input (or the padded input)."""
    counts = np.ones((), dtype=np.float64)
    for axis, size in enumerate(spatial):
        low = -geometry.pads_begin[axis] if include_pad else 0
        high = size + geometry.pads_end[axis] if include_pad else size
        starts = np.arange(geometry.out[axis]) * geometry.strides[axis] - geometry.pads_begin[axis]
        taps = starts[:, None] + np.arange(geometry.kernel[axis])[None, :] * geometry.dilations[axis]
        per_axis = ((taps >= low) & (taps < high)).sum(axis=1).astype(np.float64)
        counts = np.multiply.outer(counts, per_axis)
    return counts


def _max_pool_reference(
    x: np.ndarray, geometry: SpatialGeometry, want_indices: bool, storage_order: int
) -> list[np.ndarray]:
    lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    padded = pad_spatial(x, geometry, lowest)
    best = np.full(x.shape[:2] + geometry.out, lowest, dtype=x.dtype)
    spatial = x.shape[2:]
    index = np.zeros(best.shape, dtype=np.int64)
    for offset in itertools.product(*(range(k) for k in geometry.kernel)):
        window = padded[(slice(None), slice(None)) + window_slices(geometry, offset)]
        better = window > best
        if want_indices:
            positions = [
                np.arange(o) * s + k * d - b
                for o, s, k, d, b in zip(geometry.out, geometry.strides, offset, geometry.dilations, geometry.pads_begin)
            ]
            grids = np.meshgrid(*positions, indexing="ij")
            flat = np.zeros(geometry.out, dtype=np.int64)
            if storage_order == 0:
                for axis, grid in enumerate(grids):
                    flat = flat * spatial[axis] + grid
            else:
                for axis in reversed(range(len(grids))):
                    flat = flat * spatial[axis] + grids[axis]
            index = np.where(better, flat, index)
        best = np.where(better, window, best)
    if not want_indices:
        return [best]
    image_size = int(np.prod(spatial))
    channel_base = np.arange(x.shape[0] * x.shape[1], dtype=np.int64).reshape(x.shape[:2] + (1,) * len(spatial))
    return [best, index + channel_base * image_size]


def _average_pool_reference(x: np.ndarray, geometry: SpatialGeometry, include_pad: bool) -> np.ndarray:
    padded = pad_spatial(x.astype(np.float64), geometry, 0.0)
    total = np.zeros(x.shape[:2] + geometry.out, dtype=np.float64)
    for offset in itertools.product(*(range(k) for k in geometry.kernel)):
        total += padded[(slice(None), slice(None)) + window_slices(geometry, offset)]
    result: np.ndarray = (total / _tap_counts(geometry, x.shape[2:], include_pad)).astype(x.dtype)
    return result


def _pool_kernel(
    op_type: str, x: TensorInfo, geometry: SpatialGeometry, include_pad: bool, caps: DeviceCaps
) -> tuple[str, tuple[int, int, int], BindingTable]:
    """One invocation per output element, looping over the window (1-D as height 1)."""
    if len(x.shape) == 3:
        geometry = SpatialGeometry(
            (1,) + geometry.kernel, (1,) + geometry.strides, (1,) + geometry.dilations,
            (0,) + geometry.pads_begin, (0,) + geometry.pads_end, (1,) + geometry.out,
        )
        in_h, in_w = 1, x.shape[2]
    else:
        in_h, in_w = x.shape[2], x.shape[3]
    total = x.shape[0] * x.shape[1] * geometry.out[0] * geometry.out[1]
    grid = grid_for_groups(-(-total // THREADS), caps)
    table = BindingTable()
    x_name = table.add(Binding("input", 0))
    output = table.add(Binding("output", 0), writable=True)
    if op_type == "MaxPool":
        initial, accumulate, count, finish = "-3.402823466e+38f", "acc = max(acc, v);", "", "acc"
    else:
        initial, accumulate, finish = "0.0", "acc = acc + v;", "acc / f32(count)"
        count = (
            "if (iy >= -PH && iy < H + PH_END && ix >= -PW && ix < W + PW_END) { count = count + 1u; }"
            if include_pad
            else ""
        )
    valid_count = "" if include_pad or op_type == "MaxPool" else "count = count + 1u;"
    wgsl = f"""{table.declarations()}
const H: i32 = {in_h};
const W: i32 = {in_w};
const KH: i32 = {geometry.kernel[0]};
const KW: i32 = {geometry.kernel[1]};
const SH: i32 = {geometry.strides[0]};
const SW: i32 = {geometry.strides[1]};
const DH: i32 = {geometry.dilations[0]};
const DW: i32 = {geometry.dilations[1]};
const PH: i32 = {geometry.pads_begin[0]};
const PW: i32 = {geometry.pads_begin[1]};
const PH_END: i32 = {geometry.pads_end[0]};
const PW_END: i32 = {geometry.pads_end[1]};
const OH: u32 = {geometry.out[0]}u;
const OW: u32 = {geometry.out[1]}u;
const TOTAL: u32 = {total}u;
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let index = {workgroup_index(grid)} * {THREADS}u + li;
    if (index >= TOTAL) {{ return; }}
    let ox = i32(index % OW);
    let oy = i32((index / OW) % OH);
    let plane = (index / (OW * OH)) * u32(H * W);
    var acc = {initial};
    var count = 0u;
    for (var ky = 0; ky < KH; ky = ky + 1) {{
        let iy = oy * SH + ky * DH - PH;
        for (var kx = 0; kx < KW; kx = kx + 1) {{
            let ix = ox * SW + kx * DW - PW;
            {count}
            if (iy < 0 || iy >= H || ix < 0 || ix >= W) {{ continue; }}
            let v = {x_name}[plane + u32(iy * W + ix)];
            {accumulate}
            {valid_count}
        }}
    }}
    {output}[index] = {finish};
}}
"""
    return wgsl, grid, table


@register
class MaxPool(Operator):
    """MaxPool-1/8/10/11/12 (Indices and storage_order from 8, ceil_mode and dilations from 10)."""

    op_type = "MaxPool"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        geometry = _geometry("MaxPool", x.shape, attrs, self.opset)
        return _max_pool_reference(x, geometry, len(outputs) > 1, int(attrs.get("storage_order", 0)))

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
        if len(outputs) > 1:
            raise NotOnDevice("MaxPool: the Indices output is computed on the CPU")
        require_float32("MaxPool", [x] + list(outputs))
        if len(x.shape) not in (3, 4):
            raise NotOnDevice(f"MaxPool: the WebGPU kernel covers 1-D and 2-D pooling, not {len(x.shape) - 2}-D")
        geometry = _geometry("MaxPool", x.shape, attrs, self.opset)
        if outputs[0].size == 0:
            return OpPlan()
        wgsl, grid, table = _pool_kernel("MaxPool", x, geometry, False, caps)
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        return single_kernel_plan("MaxPool", wgsl, grid, table, compute, inputs, outputs, caps)


@register
class AveragePool(Operator):
    """AveragePool-1/7/10/11/19 (count_include_pad from 7, ceil_mode from 10, dilations from 19)."""

    op_type = "AveragePool"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        geometry = _geometry("AveragePool", x.shape, attrs, self.opset)
        return [_average_pool_reference(x, geometry, bool(attrs.get("count_include_pad", 0)))]

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
        require_float32("AveragePool", [x] + list(outputs))
        if len(x.shape) not in (3, 4):
            raise NotOnDevice(f"AveragePool: the WebGPU kernel covers 1-D and 2-D pooling, not {len(x.shape) - 2}-D")
        geometry = _geometry("AveragePool", x.shape, attrs, self.opset)
        if outputs[0].size == 0:
            return OpPlan()
        wgsl, grid, table = _pool_kernel("AveragePool", x, geometry, bool(attrs.get("count_include_pad", 0)), caps)
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        return single_kernel_plan("AveragePool", wgsl, grid, table, compute, inputs, outputs, caps)


@register
class GlobalAveragePool(Operator):
    """GlobalAveragePool-1: the mean over every spatial axis, kept as size 1."""

    op_type = "GlobalAveragePool"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        axes = tuple(range(2, x.ndim))
        return [np.mean(x, axis=axes, keepdims=True, dtype=np.float64).astype(x.dtype)]

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
        require_float32("GlobalAveragePool", [x] + list(outputs))
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        return plan_row_reduction(
            "GlobalAveragePool", "mean", x, tuple(range(2, len(x.shape))), outputs, inputs, caps, compute
        )
