"""LRN-1/13 (local response normalisation across channels): for ``X [N, C, ...]``,
``Y = X / (bias + alpha / size * sum(X[n, i, ...]^2))^beta`` over the channels
``c - floor((size - 1) / 2) <= i <= c + ceil((size - 1) / 2)`` that exist.

The device kernel computes one output element per invocation (a loop over at most ``size`` channels), in float32;
float16 tensors (on a device with ``shader-f16``) are loaded into f32 and the store rounds once.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ..._types import element_count
from .._kernel import Binding, DeviceCaps, Operator, OpPlan, TensorInfo, check_loop_budget
from .._registry import register
from .._tiling import (
    THREADS,
    BindingTable,
    grid_for_groups,
    require_float,
    single_kernel_plan,
    wgsl_f32,
    workgroup_index,
)
from .conv import load_f32

__all__ = ["LRN"]


def _settings(shape: Sequence[int], attrs: Mapping[str, Any]) -> tuple[int, float, float, float]:
    if len(shape) < 2:
        raise ShapeError(f"LRN: input must have rank 2 or more, got shape {tuple(shape)}")
    if "size" not in attrs:
        raise UnsupportedOpError("LRN: the size attribute is required")
    size = int(attrs["size"])
    if size <= 0:
        raise UnsupportedOpError(f"LRN: size must be positive, got {size}")
    return size, float(attrs.get("alpha", 1e-4)), float(attrs.get("beta", 0.75)), float(attrs.get("bias", 1.0))


@register
class LRN(Operator):
    """LRN-1/13."""

    op_type = "LRN"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        size, alpha, beta, bias = _settings(x.shape, attrs)
        wide = x.astype(np.float64)
        squares = wide * wide
        channels = x.shape[1]
        before, after = (size - 1) // 2, -(-(size - 1) // 2)
        total = np.zeros_like(wide)
        for c in range(channels):
            low, high = max(0, c - before), min(channels - 1, c + after)
            total[:, c] = np.sum(squares[:, low : high + 1], axis=1)
        y = wide / (bias + alpha / size * total) ** beta
        return [y.astype(x.dtype)]

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
        element = require_float("LRN", list(inputs) + list(outputs), caps)
        size, alpha, beta, bias = _settings(x.shape, attrs)
        check_loop_budget("LRN", size, caps)
        total = x.size
        if total == 0:
            return OpPlan()
        channels = int(x.shape[1])
        spatial = element_count(x.shape[2:])
        before, after = (size - 1) // 2, -(-(size - 1) // 2)
        table = BindingTable()
        x_name = table.add(Binding("input", 0), element)
        output = table.add(Binding("output", 0), element, writable=True)
        grid = grid_for_groups(-(-total // THREADS), caps)
        neighbour = load_f32(x_name, element, f"start + u32(k) * {spatial}u")
        result = (
            f"{load_f32(x_name, element, 'i')} / pow({wgsl_f32(bias)} + {wgsl_f32(alpha / size)} * s, {wgsl_f32(beta)})"
        )
        stored = result if element == "f32" else f"{element}({result})"  # f16: one rounding, at the store
        wgsl = f"""{table.enables()}{table.declarations()}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let i = {workgroup_index(grid)} * {THREADS}u + li;
    if (i >= {total}u) {{ return; }}
    let c = i32((i / {spatial}u) % {channels}u);
    let start = i - u32(c) * {spatial}u;
    let low = max(0, c - {before});
    let high = min({channels - 1}, c + {after});
    var s = 0.0;
    for (var k = low; k <= high; k = k + 1) {{
        let v = {neighbour};
        s = fma(v, v, s);
    }}
    {output}[i] = {stored};
}}
"""
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        return single_kernel_plan("LRN", wgsl, grid, table, compute, inputs, outputs, caps)
