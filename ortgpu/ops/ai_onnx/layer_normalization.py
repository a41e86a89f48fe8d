"""LayerNormalization-17: normalise over the axes from ``axis`` (default -1) on, with ``epsilon``; Scale and
the optional B broadcast to the normalised shape; optional outputs Mean and InvStdDev (shape of X with the
normalised axes set to 1).

The device kernel is a row kernel (:func:`._tiling.row_layout`): row mean, then the mean of squared
deviations (two passes, no cancellation), then the outputs, all in float32 whatever the ``stash_type``.  float16
X, Scale, B and Y (on a device with ``shader-f16``) are loaded into f32 and Y is rounded once on store; Mean and
InvStdDev are stored in their own type (float32 for ``stash_type`` 1, the default; X's for 0).

``"_input_perm"`` (set by the planner, :mod:`ortgpu._input_transposes`): input 0 holds the tensor before a
Transpose of that permutation and X is ``numpy.transpose(input_0, perm)``; the kernel reads each element where the
Transpose would have taken it from (ConvNeXt's channels-first activations normalised over their channels: no copy).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import Binding, DeviceCaps, Operator, OpPlan, TensorInfo
from .._registry import register
from .._row_norm import narrowed, widened
from .._tiling import (
    BindingTable,
    broadcast_strides,
    c_strides,
    index_function,
    require_float,
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


def input_perm(attrs: Mapping[str, Any], rank: int) -> tuple[int, ...] | None:
    """The ``_input_perm`` attribute (None where absent), checked against input 0's rank."""
    raw = attrs.get("_input_perm")
    if raw is None:
        return None
    perm = tuple(int(p) for p in raw)
    if sorted(perm) != list(range(rank)):
        raise UnsupportedOpError(f"LayerNormalization: _input_perm {raw!r} is not a permutation of {rank} axes")
    return perm


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
        perm = input_perm(attrs, x.ndim)
        if perm is not None:
            x = np.transpose(x, perm)
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
        element = require_float("LayerNormalization", [x, scale, bias, outputs[0]], caps)
        # Mean and InvStdDev: the stash type (float32 by default, even for float16 X) or X's
        stash = [require_float("LayerNormalization", [info], caps) for info in outputs[1:3]]
        perm = input_perm(attrs, len(x.shape))
        shape = x.shape if perm is None else tuple(x.shape[p] for p in perm)
        axis = _axis(shape, attrs)
        layout = row_layout(shape, range(axis, len(shape)))
        if layout.rows == 0 or layout.length == 0:
            return OpPlan()
        norm_shape = shape[axis:]
        threads, rows_per_group, grid, helpers = row_kernel_header(layout, caps, "LayerNormalization", loops=3)
        table = BindingTable()
        x_name = table.add(Binding("input", 0), element)
        scale_name = table.add(Binding("input", 1), element)
        bias_name = table.add(Binding("input", 2), element) if bias is not None else ""
        output = table.add(Binding("output", 0), element, writable=True)
        x_at = widened(element, f"{x_name}[base + r]")
        if perm is not None:  # X's element i (in the transposed order) is where the Transpose took it from
            source = c_strides(x.shape)
            helpers += index_function("x_index", shape, [source[p] for p in perm])
            x_at = widened(element, f"{x_name}[x_index(base + r)]")
        helpers += index_function("scale_index", norm_shape, broadcast_strides(scale.shape, norm_shape))
        shift = ""
        if bias is not None:
            helpers += index_function("bias_index", norm_shape, broadcast_strides(bias.shape, norm_shape))
            shift = f" + {widened(element, f'{bias_name}[bias_index(r)]')}"
        stats = ""
        if len(outputs) > 1:
            name = table.add(Binding("output", 1), stash[0], writable=True)
            stats += f"        {name}[row] = {narrowed(stash[0], 'mean')};\n"
        if len(outputs) > 2:
            name = table.add(Binding("output", 2), stash[1], writable=True)
            stats += f"        {name}[row] = {narrowed(stash[1], 'inv_std')};\n"
        epsilon = wgsl_f32(float(attrs.get("epsilon", 1e-5)))
        normalized = f"({x_at} - mean) * inv_std * {widened(element, f'{scale_name}[scale_index(r)]')}{shift}"
        wgsl = f"""{table.enables()}{table.declarations()}
{helpers}
{row_kernel_prologue(grid, rows_per_group)}
    var s = 0.0;
    if (valid) {{
        for (var r = t; r < LENGTH; r = r + T) {{ s = s + {x_at}; }}
    }}
    let mean = wg_sum(s, t, slot) / f32(LENGTH);
    var q = 0.0;
    if (valid) {{
        for (var r = t; r < LENGTH; r = r + T) {{
            let d = {x_at} - mean;
            q = fma(d, d, q);
        }}
    }}
    let inv_std = inverseSqrt(wg_sum(q, t, slot) / f32(LENGTH) + {epsilon});
    if (valid) {{
        for (var r = t; r < LENGTH; r = r + T) {{
            {output}[base + r] = {narrowed(element, normalized)};
        }}
    }}
    if (valid && t == 0u) {{
{stats}    }}
}}
"""
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        return single_kernel_plan("LayerNormalization", wgsl, grid, table, compute, inputs, outputs, caps)
