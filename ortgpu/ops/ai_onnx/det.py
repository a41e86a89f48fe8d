"""Det: the determinant of each square matrix in the last two axes.

The input has shape ``(*, M, M)`` and the output ``(*)``; numpy's LU-based ``linalg.det`` computes it in float64
and the result is cast back to the input's float dtype (``M = 0`` gives 1, the empty product).

The device kernel (float32, M <= 16) runs one invocation per matrix: Gaussian elimination with partial pivoting
in private memory, in float32 (as onnxruntime computes it), the determinant being the product of the pivots with
the sign of the row swaps.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import Binding, DeviceCaps, KernelSpec, NotOnDevice, Operator, OpPlan, TensorInfo, check_loop_budget
from .._registry import register
from .._tiling import whole_op_twin
from .._wgsl import (
    LINEAR_INVOCATION,
    check_binding_sizes,
    grid_for,
    kernel_entry,
    storage_declaration,
    workgroup_size_for,
)

#: The largest matrix the device kernel holds in private memory.
_MAX_DEVICE_ORDER = 16

__all__ = ["Det"]


@register
class Det(Operator):
    """Det-11/22 (22 adds bfloat16)."""

    op_type = "Det"
    since_version = 11

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
        if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
            raise ShapeError(f"{self.op_type}: the input must end in square matrices (*, M, M), got {x.shape}")
        if x.shape[-1] == 0:
            return [np.ones(x.shape[:-2], dtype=x.dtype)]
        if x.size == 0:
            return [np.zeros(x.shape[:-2], dtype=x.dtype)]
        return [np.asarray(np.linalg.det(x.astype(np.float64)), dtype=x.dtype).copy()]

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
        if x.dtype != np.float32:
            raise NotOnDevice(f"{self.op_type} on {x.dtype.name} runs on the CPU: its WebGPU kernel is float32")
        if len(x.shape) < 2 or x.shape[-1] != x.shape[-2]:
            raise ShapeError(f"{self.op_type}: the input must end in square matrices (*, M, M), got {x.shape}")
        order = x.shape[-1]
        if order == 0 or order > _MAX_DEVICE_ORDER:
            raise NotOnDevice(f"{self.op_type}: matrices of order {order} run on the CPU (the kernel holds 1 to 16)")
        output = outputs[0]
        if output.size == 0:
            return OpPlan()
        check_loop_budget(self.op_type, order**3, caps)
        check_binding_sizes(self.op_type, [x, output], caps)
        m = order
        body = (
            f"  let w = {LINEAR_INVOCATION};\n"
            f"  if (w >= {output.size}u) {{ return; }}\n"
            f"  var a: array<f32, {m * m}>;\n"
            f"  for (var i = 0u; i < {m * m}u; i = i + 1u) {{ a[i] = bitcast<f32>(src[w * {m * m}u + i]); }}\n"
            "  var det = 1.0;\n"
            f"  for (var col = 0u; col < {m}u; col = col + 1u) {{\n"
            "    var pivot = col;\n"
            f"    for (var r = col + 1u; r < {m}u; r = r + 1u) {{\n"
            f"      if (abs(a[r * {m}u + col]) > abs(a[pivot * {m}u + col])) {{ pivot = r; }}\n"
            "    }\n"
            "    if (pivot != col) {\n"
            "      det = -det;\n"
            f"      for (var k = 0u; k < {m}u; k = k + 1u) {{\n"
            f"        let t = a[col * {m}u + k];\n"
            f"        a[col * {m}u + k] = a[pivot * {m}u + k];\n"
            f"        a[pivot * {m}u + k] = t;\n"
            "      }\n"
            "    }\n"
            f"    let p = a[col * {m}u + col];\n"
            "    det = det * p;\n"
            "    if (p != 0.0) {\n"
            f"      for (var r = col + 1u; r < {m}u; r = r + 1u) {{\n"
            f"        let f = a[r * {m}u + col] / p;\n"
            f"        for (var k = col + 1u; k < {m}u; k = k + 1u) {{ a[r * {m}u + k] = a[r * {m}u + k] - f * a[col * {m}u + k]; }}\n"
            "      }\n"
            "    }\n"
            "  }\n"
            "  dst[w] = bitcast<u32>(det);\n"
        )
        workgroup = workgroup_size_for(caps.limits)
        wgsl = (
            storage_declaration(0, "src", writable=False)
            + storage_declaration(1, "dst", writable=True)
            + kernel_entry(workgroup, body)
        )
        bindings = (Binding("input", 0), Binding("output", 0))

        def compute(full: Sequence[np.ndarray | None]) -> list[np.ndarray]:
            return self.reference(full, attrs, outputs)

        twin = whole_op_twin(compute, bindings, inputs[:1], outputs)
        grid = grid_for(output.size, workgroup, caps.limits)
        return OpPlan(kernels=(KernelSpec(self.op_type, wgsl, grid, bindings, twin),))
