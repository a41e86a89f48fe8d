"""Softmax and LogSoftmax.

Before opset 13 the input is coerced to 2-D at ``axis`` (default 1): the normalisation runs over all axes
from ``axis`` on.  From opset 13 it runs over the single ``axis`` (default -1).  Either way the device kernel
is a row kernel (:func:`._tiling.row_layout`) over those axes: row maximum, sum of exponentials, then the
outputs, each pass combining through workgroup memory when several invocations share a row.  float16 tensors
(on a device with ``shader-f16``) are loaded into f32, the maximum and sums stay f32, each output is rounded once.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._kernel import Binding, DeviceCaps, Operator, OpPlan, TensorInfo
from .._registry import register
from .._row_norm import narrowed, widened
from .._tiling import (
    BindingTable,
    require_float,
    row_kernel_header,
    row_kernel_prologue,
    row_layout,
    single_kernel_plan,
)
from .unary import LOG_WGSL

__all__ = ["Softmax_1", "Softmax", "LogSoftmax_1", "LogSoftmax"]


class _SoftmaxBase(Operator):
    log = False
    #: From opset 13 the operator normalizes along ``axis`` alone (default -1); before, the input is coerced to 2-D
    #: at ``axis`` (default 1) and each row normalized over ``axis`` and every later axis.
    along_one_axis = True

    def _axes(self, rank: int, attrs: Mapping[str, Any]) -> tuple[int, ...]:
        axis = int(attrs.get("axis", -1 if self.along_one_axis else 1))
        if axis < -rank or axis >= max(rank, 1):
            raise UnsupportedOpError(f"{self.op_type}: axis {axis} out of range for rank {rank} (opset {self.opset})")
        if rank == 0:
            return ()
        axis %= rank
        return (axis,) if self.along_one_axis else tuple(range(axis, rank))

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        axes = self._axes(x.ndim, attrs)
        wide = x.astype(np.float64)
        # a row that is all -inf (a fully masked attention row) is NaN, as on the device: no warning for it; a
        # log-probability past float16's range is -inf there, as on the device
        with np.errstate(invalid="ignore", over="ignore"):
            shifted = wide - np.max(wide, axis=axes, keepdims=True)
            if self.log:
                y = shifted - np.log(np.sum(np.exp(shifted), axis=axes, keepdims=True))
            else:
                e = np.exp(shifted)
                y = e / np.sum(e, axis=axes, keepdims=True)
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
        element = require_float(self.op_type, [x] + list(outputs), caps)  # float16: loaded into f32, stored once
        layout = row_layout(x.shape, self._axes(len(x.shape), attrs))
        if layout.rows == 0 or layout.length == 0:
            return OpPlan()
        threads, rows_per_group, grid, helpers = row_kernel_header(layout, caps, self.op_type, loops=3)
        table = BindingTable()
        x_name = table.add(Binding("input", 0), element)
        output = table.add(Binding("output", 0), element, writable=True)
        value = narrowed(element, "v - row_max - log_f32(row_sum)" if self.log else "exp(v - row_max) / row_sum")
        x_at = widened(element, f"{x_name}[base + row_offset(r)]")
        wgsl = f"""{table.enables()}{table.declarations()}
{helpers}{LOG_WGSL if self.log else ""}
{row_kernel_prologue(grid, rows_per_group)}
    var m = -3.402823466e+38f;
    if (valid) {{
        for (var r = t; r < LENGTH; r = r + T) {{ m = max(m, {x_at}); }}
    }}
    let row_max = wg_max(m, t, slot);
    var s = 0.0;
    if (valid) {{
        for (var r = t; r < LENGTH; r = r + T) {{ s = s + exp({x_at} - row_max); }}
    }}
    let row_sum = wg_sum(s, t, slot);
    if (valid) {{
        for (var r = t; r < LENGTH; r = r + T) {{
            let i = base + row_offset(r);
            let v = {widened(element, f"{x_name}[i]")};
            {output}[i] = {value};
        }}
    }}
}}
"""
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        return single_kernel_plan(self.op_type, wgsl, grid, table, compute, inputs, outputs, caps)


@register
class Softmax_1(_SoftmaxBase):
    """Softmax-1/11: over the 2-D coercion at ``axis``."""

    op_type = "Softmax"
    since_version = 1
    along_one_axis = False


@register
class Softmax(_SoftmaxBase):
    """Softmax-13: along ``axis``."""

    op_type = "Softmax"
    since_version = 13


@register
class LogSoftmax_1(_SoftmaxBase):
    """LogSoftmax-1/11: over the 2-D coercion at ``axis``."""

    op_type = "LogSoftmax"
    since_version = 1
    log = True
    along_one_axis = False


@register
class LogSoftmax(_SoftmaxBase):
    """LogSoftmax-13: along ``axis``."""

    op_type = "LogSoftmax"
    since_version = 13
    log = True
