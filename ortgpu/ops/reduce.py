"""ReduceMean, ReduceSum, ReduceMax, ReduceMin: ``axes`` as an attribute (ReduceSum before opset 13, the others
before 18) or as an input (after), ``keepdims``, ``noop_with_empty_axes``.

The device kernel is a row reduction (:func:`plan_row_reduction`, also used by GlobalAveragePool): the kept
axes enumerate rows, the reduced axes the elements of a row; a power-of-two team of invocations shares a row
(one invocation for short rows, up to a whole workgroup for long ones) and combines its partial results in
workgroup memory.  Float32 only; other dtypes run on the CPU.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from ._kernel import Binding, DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from ._registry import register
from ._tiling import (
    BindingTable,
    require_float32,
    row_kernel_header,
    row_kernel_prologue,
    row_layout,
    single_kernel_plan,
    wgsl_f32,
)

__all__ = ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "plan_row_reduction"]

#: kind -> (WGSL initial value, WGSL combine of ``acc`` and ``v``, workgroup combine function)
_KERNELS = {
    "sum": ("0.0", "acc + v", "wg_sum"),
    "mean": ("0.0", "acc + v", "wg_sum"),
    "max": ("-3.402823466e+38f", "max(acc, v)", "wg_max"),
    "min": ("3.402823466e+38f", "min(acc, v)", "wg_min"),
}


def plan_row_reduction(
    op_type: str,
    kind: str,
    x: TensorInfo,
    axes: Sequence[int],
    outputs: Sequence[TensorInfo],
    inputs: Sequence[TensorInfo | None],
    caps: DeviceCaps,
    compute: Callable[[list[np.ndarray | None]], Sequence[np.ndarray]],
) -> OpPlan:
    """One kernel reducing input 0 over ``axes`` into output 0 (whose C order is the kept axes' order)."""
    layout = row_layout(x.shape, axes)
    if layout.rows == 0:
        return OpPlan()
    if layout.length == 0 and kind in ("max", "min"):
        raise NotOnDevice(f"{op_type}: reducing an empty axis stays on the CPU")
    threads, rows_per_group, grid, helpers = row_kernel_header(layout, caps)
    initial, combine, team_combine = _KERNELS[kind]
    table = BindingTable()
    x_name = table.add(Binding("input", 0))
    output = table.add(Binding("output", 0), writable=True)
    finish = "total"
    if kind == "mean":
        finish = f"total / {wgsl_f32(layout.length)}" if layout.length else "total * bitcast<f32>(0x7fc00000u)"
    wgsl = f"""{table.declarations()}
{helpers}
{row_kernel_prologue(grid, rows_per_group)}
    var acc = {initial};
    if (valid) {{
        for (var r = t; r < LENGTH; r = r + T) {{
            let v = {x_name}[base + row_offset(r)];
            acc = {combine};
        }}
    }}
    let total = {team_combine}(acc, t, slot);
    if (valid && t == 0u) {{
        {output}[row] = {finish};
    }}
}}
"""
    return single_kernel_plan(op_type, wgsl, grid, table, compute, inputs, outputs, caps)


class _Reduce(Operator):
    """Shared by the four reductions: ``kind`` picks the combine, ``axes_input_since`` the opset where axes
    moved from an attribute to input 1."""

    kind = "sum"
    axes_input_since = 18

    def _axes(self, rank: int, attrs: Mapping[str, Any], axes_input: np.ndarray | None) -> tuple[int, ...] | None:
        """Normalised axes, or ``None`` for the identity (empty axes with ``noop_with_empty_axes``)."""
        if self.opset >= self.axes_input_since:
            axes = [] if axes_input is None else [int(a) for a in np.asarray(axes_input).reshape(-1)]
            noop = bool(attrs.get("noop_with_empty_axes", 0))
        else:
            if "noop_with_empty_axes" in attrs and attrs["noop_with_empty_axes"]:
                raise UnsupportedOpError(
                    f"{self.op_type}: noop_with_empty_axes exists from opset {self.axes_input_since} (model opset {self.opset})"
                )
            axes = [int(a) for a in attrs.get("axes", [])]
            noop = False
        if not axes:
            return None if noop else tuple(range(rank))
        normalised = tuple(sorted({a + rank if a < 0 else a for a in axes}))
        if any(a < 0 or a >= rank for a in normalised):
            raise UnsupportedOpError(f"{self.op_type}: axes {axes} out of range for rank {rank}")
        return normalised

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        axes = self._axes(x.ndim, attrs, inputs[1] if len(inputs) > 1 else None)
        if axes is None:
            return [x.copy()]
        keepdims = bool(attrs.get("keepdims", 1))
        if self.kind == "sum":
            y = np.sum(x, axis=axes, keepdims=keepdims, dtype=x.dtype)
        elif self.kind == "mean":
            y = np.mean(x, axis=axes, keepdims=keepdims, dtype=np.float64 if x.dtype.kind == "f" else None)
        elif self.kind == "max":
            initial = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
            y = np.max(x, axis=axes, keepdims=keepdims, initial=initial)
        else:
            initial = np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).max
            y = np.min(x, axis=axes, keepdims=keepdims, initial=initial)
        return [np.asarray(y, dtype=x.dtype)]

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
        require_float32(self.op_type, [x] + list(outputs))
        axes_input = None
        if self.opset >= self.axes_input_since and len(inputs) > 1 and inputs[1] is not None:
            if 1 not in constants:
                raise NotOnDevice(f"{self.op_type}: axes computed at run time cannot be planned; it runs on the CPU")
            axes_input = constants[1]
        axes = self._axes(len(x.shape), attrs, axes_input)
        if axes is None:
            return OpPlan(alias={0: 0})
        compute = lambda full: self.reference(  # noqa: E731
            [full[0], axes_input] + list(full[2:]), attrs, outputs
        )
        return plan_row_reduction(self.op_type, self.kind, x, axes, outputs, inputs[:1], caps, compute)


@register
class ReduceSum(_Reduce):
    """ReduceSum-1/11/13 (axes input from 13)."""

    op_type = "ReduceSum"
    kind = "sum"
    axes_input_since = 13


@register
class ReduceMean(_Reduce):
    """ReduceMean-1/11/13/18 (axes input from 18)."""

    op_type = "ReduceMean"
    kind = "mean"


@register
class ReduceMax(_Reduce):
    """ReduceMax-1/11/12/13/18/20 (axes input from 18)."""

    op_type = "ReduceMax"
    kind = "max"


@register
class ReduceMin(_Reduce):
    """ReduceMin-1/11/12/13/18/20 (axes input from 18)."""

    op_type = "ReduceMin"
    kind = "min"
