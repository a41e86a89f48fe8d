"""BatchNormalization in inference mode: ``Y = (X - mean) / sqrt(var + epsilon) * scale + B`` per channel
(axis 1).  Before opset 9 ``spatial=0`` gives per-activation parameters of shape ``X.shape[1:]``; any
parameter shape that broadcasts that way is accepted.

Training mode (``training_mode=1`` from opset 14) normalises with the batch statistics (mean and population
variance over every axis but the channel) and outputs the updated running statistics
``input * momentum + current * (1 - momentum)``; it runs on the CPU (this reference).  The older training
outputs (before opset 14: running and saved statistics) are not supported.

The device kernel is elementwise: one invocation per element, parameters read through broadcast index
functions (the channel for the usual ``[C]`` parameters).  In inference mode X and Y may be float16 (on a device
with ``shader-f16``), each parameter float16 or float32 (BatchNormalization-15's T1, T2): every value is loaded
into f32, computed there, and Y rounded once on store.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from ..._types import element_count
from .._kernel import Binding, DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo, check_loop_budget
from .._registry import register
from .._row_norm import RowNorm, narrowed, row_norm_plan, widened
from .._tiling import (
    THREADS,
    BindingTable,
    broadcast_strides,
    grid_for_groups,
    index_function,
    require_float,
    require_float32,
    single_kernel_plan,
    wgsl_f32,
    workgroup_index,
)

__all__ = ["BatchNormalization"]

_PARAMETERS = ("scale", "B", "mean", "var")


def _view_shape(param_shape: tuple[int, ...], x_shape: tuple[int, ...]) -> tuple[int, ...]:
    """How a parameter lines up with X: ``[C]`` -> ``[C, 1, ...]``, else its own shape after the batch axis."""
    rank = len(x_shape)
    if len(param_shape) == 1 and rank >= 2:
        return (param_shape[0],) + (1,) * (rank - 2)
    return tuple(param_shape)


class _Checks(Operator):
    def _training(self, attrs: Mapping[str, Any]) -> bool:
        return self.opset >= 14 and bool(int(attrs.get("training_mode", 0)))

    def _check(self, attrs: Mapping[str, Any], outputs: int) -> None:
        if self._training(attrs):
            if outputs > 3:
                raise UnsupportedOpError(f"BatchNormalization: training mode has at most 3 outputs, got {outputs}")
            return
        if int(attrs.get("training_mode", 0)):
            raise UnsupportedOpError(f"BatchNormalization: training_mode=1 is not supported (opset {self.opset})")
        if outputs > 1:
            raise UnsupportedOpError(
                f"BatchNormalization: the running-statistics outputs (training) are not supported (opset {self.opset})"
            )


@register
class BatchNormalization(_Checks):
    """BatchNormalization-6/7/9/14/15 (inference)."""

    op_type = "BatchNormalization"
    since_version = 6
    opset_changes = (14,)

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        self._check(attrs, len(outputs))
        x = inputs[0]
        assert x is not None
        params = []
        for name, p in zip(_PARAMETERS, inputs[1:5]):
            if p is None:
                raise UnsupportedOpError(f"BatchNormalization: input {name} is required")
            params.append(p.astype(np.float64).reshape(_view_shape(p.shape, x.shape)))
        scale, bias, mean, var = params
        epsilon = float(attrs.get("epsilon", 1e-5))
        if self._training(attrs):
            return self._train(x, params, inputs, attrs, outputs)
        y = (x.astype(np.float64) - mean) / np.sqrt(var + epsilon) * scale + bias
        return [y.astype(x.dtype)]

    def _train(
        self,
        x: np.ndarray,
        params: list[np.ndarray],
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        """Training mode: normalise with the batch statistics; outputs 1, 2 are the updated running statistics."""
        scale, bias, _, _ = params
        epsilon = float(attrs.get("epsilon", 1e-5))
        momentum = float(attrs.get("momentum", 0.9))
        axes = tuple(a for a in range(x.ndim) if a != 1)
        wide = x.astype(np.float64)
        current_mean = np.mean(wide, axis=axes, keepdims=True)
        current_var = np.mean((wide - current_mean) ** 2, axis=axes, keepdims=True)
        y = (wide - current_mean) / np.sqrt(current_var + epsilon) * scale + bias
        results = [y.astype(x.dtype)]
        for position, current in ((3, current_mean), (4, current_var)):
            running = inputs[position]
            assert running is not None
            updated = running.astype(np.float64) * momentum + current.reshape(-1) * (1.0 - momentum)
            results.append(updated.reshape(running.shape).astype(running.dtype))
        return results[: max(1, len(outputs))]

    def _plan_training(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
    ) -> OpPlan:
        """Training mode: Y by the normalisation row kernel over every axis but the channel; the running statistics
        by one invocation per channel (two walks over its elements)."""
        x = inputs[0]
        assert x is not None
        require_float32("BatchNormalization", list(inputs) + list(outputs))
        if len(x.shape) < 2 or any(p is None or tuple(p.shape) != (x.shape[1],) for p in inputs[1:5]):
            raise NotOnDevice("BatchNormalization: training mode on the device takes [C] parameters only")
        channels = int(x.shape[1])
        spatial = element_count(x.shape[2:])
        per_channel = int(x.shape[0]) * spatial
        if per_channel == 0:
            raise NotOnDevice("BatchNormalization: training over an empty batch runs on the CPU")
        check_loop_budget("BatchNormalization", 2 * per_channel, caps)
        epsilon = float(attrs.get("epsilon", 1e-5))
        channel = f"return (at / {spatial}u) % {channels}u;"
        spec = RowNorm("variance", epsilon, scale_input=1, scale_index=channel, bias_input=2, bias_index=channel)
        axes = [0] + list(range(2, len(x.shape)))

        def compute(full: list[np.ndarray | None]) -> list[np.ndarray]:
            # Y does not read the running statistics, which its kernel does not bind
            filled = [
                np.zeros(info.shape, info.dtype) if array is None and info is not None else array
                for array, info in zip(full, inputs)
            ]
            return self.reference(filled, attrs, outputs)

        kernels = list(row_norm_plan("BatchNormalization", spec, axes, inputs, outputs[:1], caps, compute).kernels)
        if len(outputs) > 1:
            momentum = float(attrs.get("momentum", 0.9))
            table = BindingTable()
            x_name = table.add(Binding("input", 0))
            mean_in, var_in = table.add(Binding("input", 3)), table.add(Binding("input", 4))
            mean_out = table.add(Binding("output", 1), writable=True)
            stores = f"{mean_out}[c] = {mean_in}[c] * m + mean * (1.0 - m);\n"
            if len(outputs) > 2:
                var_out = table.add(Binding("output", 2), writable=True)
                stores += f"    {var_out}[c] = {var_in}[c] * m + variance * (1.0 - m);\n"
            else:
                stores += f"    _ = {var_in}[c];\n"
            grid = grid_for_groups(-(-channels // THREADS), caps)
            element = f"{x_name}[(k / {spatial}u) * {channels * spatial}u + c * {spatial}u + k % {spatial}u]"
            wgsl = f"""{table.declarations()}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let c = {workgroup_index(grid)} * {THREADS}u + li;
    if (c >= {channels}u) {{ return; }}
    var s = 0.0;
    for (var k = 0u; k < {per_channel}u; k = k + 1u) {{ s = s + {element}; }}
    let mean = s / f32({per_channel});
    var q = 0.0;
    for (var k = 0u; k < {per_channel}u; k = k + 1u) {{
        let d = {element} - mean;
        q = fma(d, d, q);
    }}
    let variance = q / f32({per_channel});
    let m = {wgsl_f32(momentum)};
    {stores}}}
"""
            kernels += list(
                single_kernel_plan("BatchNormalization", wgsl, grid, table, compute, inputs, outputs, caps).kernels
            )
        return OpPlan(kernels=tuple(kernels))

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        self._check(attrs, len(outputs))
        if self._training(attrs):
            return self._plan_training(inputs, outputs, attrs, caps)
        x = inputs[0]
        assert x is not None
        element = require_float("BatchNormalization", [x, outputs[0]], caps)
        # each parameter its own float type (f16 only with shader-f16, which X's check covers)
        elements = [require_float("BatchNormalization", [p], caps) for p in inputs[1:5]]
        total = x.size
        if total == 0:
            return OpPlan()
        table = BindingTable()
        x_name = table.add(Binding("input", 0), element)
        names, helpers = [], ""
        for position, p in enumerate(inputs[1:5], start=1):
            if p is None:
                raise UnsupportedOpError(f"BatchNormalization: input {_PARAMETERS[position - 1]} is required")
            kind = elements[position - 1]
            names.append(widened(kind, f"{table.add(Binding('input', position), kind)}[param_index_{position}(i)]"))
            helpers += index_function(
                f"param_index_{position}", x.shape, broadcast_strides(_view_shape(p.shape, x.shape), x.shape)
            )
        output = table.add(Binding("output", 0), element, writable=True)
        scale, bias, mean, var = names
        grid = grid_for_groups(-(-total // THREADS), caps)
        epsilon = wgsl_f32(float(attrs.get("epsilon", 1e-5)))
        y = narrowed(element, f"({widened(element, f'{x_name}[i]')} - {mean}) * factor + {bias}")
        wgsl = f"""{table.enables()}{table.declarations()}
const TOTAL: u32 = {total}u;
{helpers}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let i = {workgroup_index(grid)} * {THREADS}u + li;
    if (i >= TOTAL) {{ return; }}
    let factor = {scale} * inverseSqrt({var} + {epsilon});
    {output}[i] = {y};
}}
"""
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        return single_kernel_plan("BatchNormalization", wgsl, grid, table, compute, inputs, outputs, caps)
