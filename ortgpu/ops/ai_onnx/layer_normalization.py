"""LayerNormalization-17: normalise over the axes from ``axis`` (default -1) on, with ``epsilon``; Scale and
the optional B broadcast to the normalised shape; optional outputs Mean and InvStdDev (shape of X with the
normalised axes set to 1).

The device kernel is a row kernel (:func:`._tiling.row_layout`): row mean, then the mean of squared
deviations (two passes, no cancellation), then the outputs.  It computes in float32 (``stash_type`` 1).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import Binding, DeviceCaps, Operator, OpPlan, TensorInfo
from .._registry import register
from .._tiling import (
    BindingTable,
    broadcast_strides,
    index_function,
    require_float32,
    row_kernel_header,
    row_kernel_prologue,
    row_layout,
    single_kernel_plan,
    wgsl_f32,
)

__all__ = ["LayerNormalization"]


def _axis(shape: Sequence[int], attrs: Mapping[str, Any]) -> int:
    rank = len(shape)
    axis = int(attrs.get("axis", -1))
    if axis < -rank or axis >= rank:
        raise UnsupportedOpError(f"LayerNormalization: axis {axis} out of range for rank {rank}")
    if any(int(d) == 0 for d in shape[axis % rank :]):
        # onnxruntime refuses normalising over nothing (the mean of an empty set)
        raise ShapeError(f"LayerNormalization: input shape {tuple(shape)} normalises over a 0-size axis")
    return axis % rank


@register
class LayerNormalization(Operator):
    """LayerNormalization-17."""

    op_type = "LayerNormalization"
    since_version = 17

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, scale = inputs[0], inputs[1]
        assert x is not None and scale is not None
        bias = inputs[2] if len(inputs) > 2 else None
        axis = _axis(x.shape, attrs)
        epsilon = float(attrs.get("epsilon", 1e-5))
        axes = tuple(range(axis, x.ndim))
        wide = x.astype(np.float64)
        mean = np.mean(wide, axis=axes, keepdims=True)
        variance = np.mean((wide - mean) ** 2, axis=axes, keepdims=True)
        inv_std = 1.0 / np.sqrt(variance + epsilon)
        y = (wide - mean) * inv_std * scale.astype(np.float64)
        if bias is not None:
            y = y + bias.astype(np.float64)
        stash = np.float32 if int(attrs.get("stash_type", 1)) == 1 else x.dtype
        results = [y.astype(x.dtype), mean.astype(stash), inv_std.astype(stash)]
        return results[: max(1, len(outputs))]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x, scale = inputs[0], inputs[1]
        assert x is not None and scale is not None
        bias = inputs[2] if len(inputs) > 2 else None
        require_float32("LayerNormalization", list(inputs) + list(outputs))
        axis = _axis(x.shape, attrs)
        layout = row_layout(x.shape, range(axis, len(x.shape)))
        if layout.rows == 0 or layout.length == 0:
            return OpPlan()
        norm_shape = x.shape[axis:]
        threads, rows_per_group, grid, helpers = row_kernel_header(layout, caps, "LayerNormalization", loops=3)
        table = BindingTable()
        x_name = table.add(Binding("input", 0))
        scale_name = table.add(Binding("input", 1))
        bias_name = table.add(Binding("input", 2)) if bias is not None else ""
        output = table.add(Binding("output", 0), writable=True)
        helpers += index_function("scale_index", norm_shape, broadcast_strides(scale.shape, norm_shape))
        shift = ""
        if bias is not None:
            helpers += index_function("bias_index", norm_shape, broadcast_strides(bias.shape, norm_shape))
            shift = f" + {bias_name}[bias_index(r)]"
        stats = ""
        if len(outputs) > 1:
            stats += f"        {table.add(Binding('output', 1), writable=True)}[row] = mean;\n"
        if len(outputs) > 2:
            stats += f"        {table.add(Binding('output', 2), writable=True)}[row] = inv_std;\n"
        epsilon = wgsl_f32(float(attrs.get("epsilon", 1e-5)))
        wgsl = f"""{table.declarations()}
{helpers}
{row_kernel_prologue(grid, rows_per_group)}
    var s = 0.0;
    if (valid) {{
        for (var r = t; r < LENGTH; r = r + T) {{ s = s + {x_name}[base + r]; }}
    }}
    let mean = wg_sum(s, t, slot) / f32(LENGTH);
    var q = 0.0;
    if (valid) {{
        for (var r = t; r < LENGTH; r = r + T) {{
            let d = {x_name}[base + r] - mean;
            q = fma(d, d, q);
        }}
    }}
    let inv_std = inverseSqrt(wg_sum(q, t, slot) / f32(LENGTH) + {epsilon});
    if (valid) {{
        for (var r = t; r < LENGTH; r = r + T) {{
            {output}[base + r] = ({x_name}[base + r] - mean) * inv_std * {scale_name}[scale_index(r)]{shift};
        }}
    }}
    if (valid && t == 0u) {{
{stats}    }}
}}
"""
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        return single_kernel_plan("LayerNormalization", wgsl, grid, table, compute, inputs, outputs, caps)
