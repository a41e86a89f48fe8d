"""Hardmax: 1 at the first maximum of each row, 0 elsewhere.

Before opset 13 the input is coerced to 2-D at ``axis`` (default 1): a row is everything from ``axis`` on.  From
opset 13 a row runs along the single ``axis`` (default -1).  NaN follows onnxruntime: the row maximum is found by an
ordered scan (a NaN never replaces a number; a leading NaN is never replaced), and a row whose maximum is NaN is
all zeros.

The device kernel (float32) runs one invocation per row: a scan for the maximum, then a pass writing the row.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._kernel import Binding, DeviceCaps, KernelSpec, NotOnDevice, Operator, OpPlan, TensorInfo, check_loop_budget
from .._registry import register
from .._tiling import row_layout, whole_op_twin
from .._wgsl import (
    LINEAR_INVOCATION,
    check_binding_sizes,
    grid_for,
    kernel_entry,
    storage_declaration,
    workgroup_size_for,
)
from .arg_reduce import arg_extreme

__all__ = ["Hardmax_1", "Hardmax"]


@register
class Hardmax(Operator):
    """Hardmax-13: along ``axis`` (default -1)."""

    op_type = "Hardmax"
    since_version = 13
    #: Opset 13 takes the maximum along ``axis`` alone; before, over the 2-D coercion at ``axis`` (default 1).
    along_one_axis = True

    def _axes(self, rank: int, attrs: Mapping[str, Any]) -> tuple[int, ...]:
        axis = int(attrs.get("axis", -1 if self.along_one_axis else 1))
        if rank == 0:
            raise UnsupportedOpError(f"{self.op_type}: a scalar input has no axis")
        if not -rank <= axis < rank:
            raise UnsupportedOpError(f"{self.op_type}: axis {axis} out of range for rank {rank} (opset {self.opset})")
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
        if x.dtype.kind != "f":
            raise UnsupportedOpError(f"{self.op_type}: dtype {x.dtype} is not a float type")
        axes = self._axes(x.ndim, attrs)
        kept = [a for a in range(x.ndim) if a not in axes]
        # rows: kept axes first (C order), then the row's axes flattened
        count = int(np.prod([x.shape[a] for a in kept], dtype=np.int64))
        length = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
        rows = np.transpose(x, kept + list(axes)).reshape(count, length)
        y = np.zeros(rows.shape, dtype=x.dtype)
        if rows.shape[1] > 0 and rows.shape[0] > 0:
            index = arg_extreme(rows, 1, largest=True, last=False)
            picked = rows[np.arange(rows.shape[0]), index]
            y[np.arange(rows.shape[0]), index] = np.where(np.isnan(picked), 0, 1)
        transposed_shape = tuple(x.shape[a] for a in kept + list(axes))
        y = y.reshape(transposed_shape)
        return [np.ascontiguousarray(np.transpose(y, np.argsort(kept + list(axes))))]

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
        axes = self._axes(len(x.shape), attrs)
        if x.dtype != np.float32:
            raise NotOnDevice(f"{self.op_type} on {x.dtype.name} runs on the CPU: its WebGPU kernel is float32")
        layout = row_layout(x.shape, axes)
        if x.size == 0:
            return OpPlan()
        check_loop_budget(self.op_type, 2 * layout.length, caps)
        check_binding_sizes(self.op_type, [x, outputs[0]], caps)
        body = (
            f"  let w = {LINEAR_INVOCATION};\n"
            f"  if (w >= {layout.rows}u) {{ return; }}\n"
            "  let base = row_base(w);\n"
            "  var best = bitcast<f32>(src[base]);\n"
            "  var index = 0u;\n"
            f"  for (var r = 1u; r < {layout.length}u; r = r + 1u) {{\n"
            "    let v = bitcast<f32>(src[base + row_offset(r)]);\n"
            # NaN tested by its bits: GPU drivers need not keep IEEE NaN comparisons (NVIDIA's replaced a NaN)
            "    let either_nan = (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u\n"
            "      || (bitcast<u32>(best) & 0x7fffffffu) > 0x7f800000u;\n"
            "    if (!either_nan && v > best) { best = v; index = r; }\n"
            "  }\n"
            "  // a NaN maximum (a leading NaN never replaced) marks nothing, as in onnxruntime\n"
            "  let nan = (bitcast<u32>(best) & 0x7fffffffu) > 0x7f800000u;\n"
            f"  for (var r = 0u; r < {layout.length}u; r = r + 1u) {{\n"
            "    dst[base + row_offset(r)] = bitcast<u32>(select(0.0, 1.0, r == index && !nan));\n"
            "  }\n"
        )
        workgroup = workgroup_size_for(caps.limits)
        wgsl = (
            storage_declaration(0, "src", writable=False)
            + storage_declaration(1, "dst", writable=True)
            + layout.row_base
            + layout.row_offset
            + kernel_entry(workgroup, body)
        )
        bindings = (Binding("input", 0), Binding("output", 0))

        def compute(full: Sequence[np.ndarray | None]) -> list[np.ndarray]:
            return self.reference(full, attrs, outputs)

        twin = whole_op_twin(compute, bindings, inputs[:1], outputs)
        grid = grid_for(layout.rows, workgroup, caps.limits)
        return OpPlan(kernels=(KernelSpec(self.op_type, wgsl, grid, bindings, twin),))


@register
class Hardmax_1(Hardmax):
    """Hardmax-1/11: over the 2-D coercion at ``axis`` (each row's maximum over ``axis`` and every later axis)."""

    since_version = 1
    along_one_axis = False
