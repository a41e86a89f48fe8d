"""MaxPool, AveragePool (N-d, on the device too), GlobalAveragePool and GlobalMaxPool.

Windows follow :func:`.conv.spatial_geometry` (kernel_shape, strides, pads, auto_pad, dilations, ceil_mode;
a ceil-mode window never starts in the end padding).  AveragePool divides by the taps inside the input
(``count_include_pad=0``) or inside the padded input (``count_include_pad=1``; taps that only exist because
of ceil_mode never count), as onnxruntime does.  MaxPool's optional Indices output (flat index into X, row-
or column-major per ``storage_order``) is computed by the same device kernel.

The kernels take float32 or float16 (on a device with ``shader-f16``): float16 is loaded into f32, windows are
summed and compared in f32 and the store rounds once.
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ..._types import element_count
from .._kernel import Binding, DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo, check_loop_budget
from .._registry import register
from .._tiling import (
    THREADS,
    BindingTable,
    float_element,
    grid_for_groups,
    require_float,
    single_kernel_plan,
    wgsl_f32,
    workgroup_index,
)
from .conv import SpatialGeometry, ints, pad_spatial, spatial_geometry, window_slices
from .reduce import plan_row_reduction

__all__ = ["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"]


def _geometry(op_type: str, x_shape: tuple[int, ...], attrs: Mapping[str, Any], opset: int) -> SpatialGeometry:
    if "kernel_shape" not in attrs:
        raise UnsupportedOpError(f"{op_type}: kernel_shape is required")
    if len(x_shape) < 3:
        raise UnsupportedOpError(f"{op_type}: X must have rank >= 3, got {x_shape}")
    _check_spatial(x_shape, op_type)
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
                for o, s, k, d, b in zip(
                    geometry.out, geometry.strides, offset, geometry.dilations, geometry.pads_begin
                )
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
    image_size = element_count(spatial)
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
    op_type: str,
    x: TensorInfo,
    geometry: SpatialGeometry,
    include_pad: bool,
    caps: DeviceCaps,
    *,
    indices: bool = False,
    storage_order: int = 0,
    power: float | None = None,
) -> tuple[str, tuple[int, int, int], BindingTable]:
    """One invocation per output element, looping over the window (any number of spatial axes).

    MaxPool keeps the first maximum (strictly greater replaces, as the reference does) and, with
    ``indices``, writes its flat index (int64, as a low word and a zero high word: indices are below 2^31)
    into output 1.  With ``power`` p (LpPool) it sums ``|v|^p`` over the taps inside the input and writes
    the sum's p-th root.  ``x`` and the output share its storage type (f32 or f16); the work is in f32.
    """
    spatial = x.shape[2:]
    rank = len(spatial)
    total = x.shape[0] * x.shape[1] * element_count(geometry.out)
    if indices and x.size >= 2**31:
        raise NotOnDevice("MaxPool: Indices beyond int32 range are computed on the CPU")
    window = 1
    for size in geometry.kernel:  # nested loops over the window, one per spatial axis
        window = window * (size + 1)
    check_loop_budget(op_type, window, caps)
    grid = grid_for_groups(-(-total // THREADS), caps)
    table = BindingTable()
    element = float_element(x)
    x_name = table.add(Binding("input", 0), element)
    output = table.add(Binding("output", 0), element, writable=True)
    store = "{}" if element == "f32" else element + "({})"  # f16: one rounding, at the store
    index_output = table.add(Binding("output", 1), "u32", writable=True) if indices else ""
    is_max = op_type == "MaxPool"
    image = element_count(spatial)
    lines = [
        f"    let index = {workgroup_index(grid)} * {THREADS}u + li;",
        f"    if (index >= {total}u) {{ return; }}",
        "    var rest = index;",
    ]
    for axis in reversed(range(rank)):
        lines.append(f"    let o{axis} = i32(rest % {geometry.out[axis]}u);")
        lines.append(f"    rest = rest / {geometry.out[axis]}u;")
    lines.append(f"    let plane = rest * {image}u;")
    lines.append("    var acc = bitcast<f32>(0xff800000u);" if is_max else "    var acc = 0.0;")
    lines.append("    var best = 0u;")
    lines.append("    var count = 0u;")
    indent = "    "
    for axis in range(rank):
        lines.append(f"{indent}for (var k{axis} = 0; k{axis} < {geometry.kernel[axis]}; k{axis} = k{axis} + 1) {{")
        indent += "    "
        lines.append(
            f"{indent}let i{axis} = o{axis} * {geometry.strides[axis]} + k{axis} * {geometry.dilations[axis]}"
            f" - {geometry.pads_begin[axis]};"
        )
    inside_padded = " && ".join(
        f"i{a} >= {-geometry.pads_begin[a]} && i{a} < {spatial[a] + geometry.pads_end[a]}" for a in range(rank)
    )
    outside = " || ".join(f"i{a} < 0 || i{a} >= {spatial[a]}" for a in range(rank))
    if not is_max and include_pad:
        lines.append(f"{indent}if ({inside_padded}) {{ count = count + 1u; }}")
    lines.append(f"{indent}if ({outside}) {{ continue; }}")
    flat = " + ".join(f"u32(i{a}) * {element_count(spatial[a + 1 :])}u" for a in range(rank))
    loaded = f"{x_name}[plane + {flat}]"
    lines.append(f"{indent}let v = {loaded if element == 'f32' else f'f32({loaded})'};")
    if is_max:
        if indices:
            order = range(rank) if storage_order == 0 else reversed(range(rank))
            stored = "0u"
            for a in order:
                stored = f"({stored}) * {spatial[a]}u + u32(i{a})"
            lines.append(f"{indent}if (v > acc) {{ acc = v; best = plane + {stored}; }}")
        else:
            lines.append(f"{indent}if (v > acc) {{ acc = v; }}")
    elif power is not None:
        term = (
            "abs(v)"
            if power == 1
            else "v * v"
            if power == 2
            else f"select(0.0, pow(abs(v), {wgsl_f32(power)}), v != 0.0)"
        )
        lines.append(f"{indent}acc = acc + {term};")
    else:
        lines.append(f"{indent}acc = acc + v;")
        if not include_pad:
            lines.append(f"{indent}count = count + 1u;")
    for _ in range(rank):
        indent = indent[:-4]
        lines.append(f"{indent}}}")
    if power is not None:
        root = (
            "acc"
            if power == 1
            else "sqrt(acc)"
            if power == 2
            else f"select(0.0, pow(acc, {wgsl_f32(1.0 / power)}), acc > 0.0)"
        )
        lines.append(f"    {output}[index] = {store.format(root)};")
    else:
        lines.append(f"    {output}[index] = {store.format('acc' if is_max else 'acc / f32(count)')};")
    if indices:
        lines.append(f"    {index_output}[2u * index] = best;")
        lines.append(f"    {index_output}[2u * index + 1u] = 0u;")
    body = "\n".join(lines)
    wgsl = f"""{table.enables()}{table.declarations()}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
{body}
}}
"""
    return wgsl, grid, table


@register
class MaxPool(Operator):
    """MaxPool-1/8/10/11/12 (Indices and storage_order from 8, ceil_mode and dilations from 10)."""

    op_type = "MaxPool"
    since_version = 1

    def output_shapes(
        self, inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
    ) -> list[tuple[int, ...]] | None:
        """The window count of :func:`.conv.spatial_geometry` (as onnxruntime counts ceil-mode windows; onnx's
        inference counts one more where the last would start in the end padding)."""
        x = inputs[0]
        if x is None or len(x.shape) < 3:
            return None
        shape = tuple(x.shape[:2]) + _geometry(self.op_type, x.shape, attrs, self.opset).out
        return [shape, shape]  # Y, and MaxPool's optional Indices

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
        require_float("MaxPool", [x, outputs[0]], caps)
        geometry = _geometry("MaxPool", x.shape, attrs, self.opset)
        if outputs[0].size == 0:
            return OpPlan()
        wgsl, grid, table = _pool_kernel(
            "MaxPool",
            x,
            geometry,
            False,
            caps,
            indices=len(outputs) > 1,
            storage_order=int(attrs.get("storage_order", 0)),
        )
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        return single_kernel_plan("MaxPool", wgsl, grid, table, compute, inputs, outputs, caps)


@register
class AveragePool(Operator):
    """AveragePool-1/7/10/11/19 (count_include_pad from 7, ceil_mode from 10, dilations from 19)."""

    op_type = "AveragePool"
    since_version = 1
    opset_changes = (19,)

    def output_shapes(
        self, inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
    ) -> list[tuple[int, ...]] | None:
        """The window count of :func:`.conv.spatial_geometry` (as onnxruntime counts ceil-mode windows; onnx's
        inference counts one more where the last would start in the end padding)."""
        x = inputs[0]
        if x is None or len(x.shape) < 3:
            return None
        shape = tuple(x.shape[:2]) + _geometry(self.op_type, x.shape, attrs, self.opset).out
        return [shape, shape]  # Y, and MaxPool's optional Indices

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
        require_float("AveragePool", [x] + list(outputs), caps)
        geometry = _geometry("AveragePool", x.shape, attrs, self.opset)
        if outputs[0].size == 0:
            return OpPlan()
        wgsl, grid, table = _pool_kernel("AveragePool", x, geometry, bool(attrs.get("count_include_pad", 0)), caps)
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        return single_kernel_plan("AveragePool", wgsl, grid, table, compute, inputs, outputs, caps)


def _check_spatial(shape: Sequence[int], op_type: str = "GlobalAveragePool") -> None:
    """onnxruntime's pools refuse an empty input unless its batch is the 0 (``Only N can be zero``)."""
    if len(shape) >= 1 and int(shape[0]) != 0 and any(int(d) == 0 for d in shape[1:]):
        raise ShapeError(f"{op_type}: input shape {tuple(shape)} is empty but its batch is not (only N may be 0)")


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
        _check_spatial(x.shape)
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
        _check_spatial(x.shape)
        require_float("GlobalAveragePool", [x] + list(outputs), caps)  # the row reduction loads f16 into f32
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        return plan_row_reduction(
            "GlobalAveragePool", "mean", x, tuple(range(2, len(x.shape))), outputs, inputs, caps, compute
        )


@register
class GlobalMaxPool(Operator):
    """GlobalMaxPool-1: the maximum over every spatial axis, kept as size 1.

    As MaxPool (and onnxruntime), NaN never wins a comparison: it is skipped, and an image of only NaN (or
    -inf) gives -inf.  The device kernel is MaxPool's, with one window covering the whole image.
    """

    op_type = "GlobalMaxPool"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        if len(x.shape) < 3:
            raise ShapeError(f"GlobalMaxPool: X must have rank >= 3, got {x.shape}")
        _check_spatial(x.shape, "GlobalMaxPool")
        axes = tuple(range(2, x.ndim))
        if x.size == 0:
            return [np.zeros(x.shape[:2] + (1,) * (x.ndim - 2), dtype=x.dtype)]
        if x.dtype.kind != "f":
            raise UnsupportedOpError(f"GlobalMaxPool: X of dtype {x.dtype} is not supported (float tensors only)")
        best = np.fmax.reduce(x, axis=axes, keepdims=True)
        return [np.where(np.isnan(best), -np.inf, best).astype(x.dtype)]

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
        if len(x.shape) < 3:
            raise ShapeError(f"GlobalMaxPool: X must have rank >= 3, got {x.shape}")
        _check_spatial(x.shape, "GlobalMaxPool")
        require_float("GlobalMaxPool", [x, outputs[0]], caps)
        if outputs[0].size == 0:
            return OpPlan()
        spatial = tuple(x.shape[2:])
        geometry = spatial_geometry("GlobalMaxPool", spatial, spatial, {}, ceil_mode=False)
        wgsl, grid, table = _pool_kernel("MaxPool", x, geometry, False, caps)
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        return single_kernel_plan("GlobalMaxPool", wgsl, grid, table, compute, inputs, outputs, caps)
