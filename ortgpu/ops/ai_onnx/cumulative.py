"""CumSum and CumProd: running sums (products) along the axis given by input 1.

``exclusive`` leaves element ``i`` out of its own result (the first result is the identity, 0 or 1);
``reverse`` runs from the end of the axis.  Results accumulate in the input's dtype (float16 in float32), in order
along the axis (as onnxruntime does: float32 sums round at every step; integers wrap).

The device kernel runs one invocation per line along the axis (every position of the other axes), walking the
line serially: float32, int32/uint32 and int64/uint64 (exact, as ``vec2<u32>`` pairs).  Lines longer than the
driver's loop budget, other dtypes (float16, float64) and an axis computed at run time run on the CPU.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import Binding, DeviceCaps, KernelSpec, NotOnDevice, Operator, OpPlan, TensorInfo, check_loop_budget
from .._registry import register
from .._tiling import whole_op_twin
from .._wgsl import (
    INT64_WGSL,
    LINEAR_INVOCATION,
    check_binding_sizes,
    grid_for,
    kernel_entry,
    load_function,
    storage_declaration,
    workgroup_size_for,
)

__all__ = ["CumSum", "CumProd"]

#: dtype -> (identity of sum, identity of product, combine for sum, combine for product) in WGSL
_DEVICE: dict[str, tuple[str, str, str, str]] = {
    "float32": ("0.0", "1.0", "acc + v", "acc * v"),
    "int32": ("0", "1", "acc + v", "acc * v"),
    "uint32": ("0u", "1u", "acc + v", "acc * v"),
    "int64": ("vec2<u32>(0u, 0u)", "vec2<u32>(1u, 0u)", "add64(acc, v)", "mul64(acc, v)"),
    "uint64": ("vec2<u32>(0u, 0u)", "vec2<u32>(1u, 0u)", "add64(acc, v)", "mul64(acc, v)"),
}


class _Cumulative(Operator):
    product = False

    def _axis(self, rank: int, axis_value: np.ndarray | None) -> int:
        if axis_value is None:
            raise ShapeError(f"{self.op_type}: the axis input is required")
        values = np.asarray(axis_value).reshape(-1)
        if values.size != 1 or values.dtype.kind not in "iu":
            raise ShapeError(f"{self.op_type}: axis must be one int32/int64 value, got {values.size} {values.dtype}")
        axis = int(values[0])
        if not -rank <= axis < rank:
            raise UnsupportedOpError(f"{self.op_type}: axis {axis} is out of range for rank {rank}")
        return axis % rank

    def _flags(self, attrs: Mapping[str, Any]) -> tuple[bool, bool]:
        return bool(attrs.get("exclusive", 0)), bool(attrs.get("reverse", 0))

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        if x.dtype.kind not in "fiu":
            raise UnsupportedOpError(f"{self.op_type}: dtype {x.dtype} is not numeric")
        axis = self._axis(x.ndim, inputs[1] if len(inputs) > 1 else None)
        exclusive, reverse = self._flags(attrs)
        y = np.flip(x, axis) if reverse else x
        if exclusive and y.shape[axis] > 0:
            identity = np.full_like(np.take(y, [0], axis=axis), 1 if self.product else 0)
            y = np.concatenate([identity, np.take(y, range(y.shape[axis] - 1), axis=axis)], axis=axis)
        # float16 accumulates in float32, rounding each result once (as onnxruntime does)
        accumulate = np.dtype(np.float32) if x.dtype == np.float16 else x.dtype
        with np.errstate(over="ignore", invalid="ignore"):
            y = (
                np.cumprod(y, axis=axis, dtype=accumulate)
                if self.product
                else np.cumsum(y, axis=axis, dtype=accumulate)
            )
        y = y.astype(x.dtype, copy=False)
        if reverse:
            y = np.flip(y, axis)
        return [np.ascontiguousarray(y)]

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
        if 1 not in constants:
            raise NotOnDevice(f"{self.op_type}: an axis computed at run time cannot be planned; it runs on the CPU")
        axis = self._axis(len(x.shape), constants[1])
        exclusive, reverse = self._flags(attrs)
        if x.dtype.name not in _DEVICE:
            raise NotOnDevice(f"{self.op_type} on {x.dtype.name} runs on the CPU: no WebGPU kernel for this dtype")
        length = x.shape[axis]
        check_loop_budget(self.op_type, length, caps)
        if x.size == 0:
            return OpPlan()
        check_binding_sizes(self.op_type, [x, outputs[0]], caps)
        inner = 1
        for size in x.shape[axis + 1 :]:
            inner *= size
        lines = x.size // length
        pair = x.dtype.itemsize == 8
        zero, one, add, multiply = _DEVICE[x.dtype.name]
        identity, combine = (one, multiply) if self.product else (zero, add)
        position = f"{length - 1}u - r" if reverse else "r"
        if pair:
            store = "dst[2u * k] = acc.x;\n    dst[2u * k + 1u] = acc.y;"
        else:
            store = "dst[k] = bitcast<u32>(acc);"
        step = f"    {store}\n    acc = {combine};\n" if exclusive else f"    acc = {combine};\n    {store}\n"
        body = (
            f"  let w = {LINEAR_INVOCATION};\n"
            f"  if (w >= {lines}u) {{ return; }}\n"
            f"  let base = (w / {inner}u) * {length * inner}u + w % {inner}u;\n"
            f"  var acc = {identity};\n"
            f"  for (var r = 0u; r < {length}u; r = r + 1u) {{\n"
            f"    let k = base + ({position}) * {inner}u;\n"
            "    let v = load(k);\n"
            f"{step}"
            "  }\n"
        )
        workgroup = workgroup_size_for(caps.limits)
        wgsl = (
            storage_declaration(0, "src", writable=False)
            + storage_declaration(1, "dst", writable=True)
            + load_function("load", "src", x.dtype, int64_pair=pair)
            + (INT64_WGSL if pair else "")
            + kernel_entry(workgroup, body)
        )
        bindings = (Binding("input", 0), Binding("output", 0))
        axis_value = constants[1]

        def compute(full: Sequence[np.ndarray | None]) -> list[np.ndarray]:
            return self.reference([full[0], axis_value], attrs, outputs)

        twin = whole_op_twin(compute, bindings, inputs[:1], outputs)
        grid = grid_for(lines, workgroup, caps.limits)
        return OpPlan(kernels=(KernelSpec(self.op_type, wgsl, grid, bindings, twin),))


@register
class CumSum(_Cumulative):
    """CumSum-11/14 (14 adds float16 and bfloat16)."""

    op_type = "CumSum"
    since_version = 11


@register
class CumProd(_Cumulative):
    """CumProd-26."""

    op_type = "CumProd"
    since_version = 26
    product = True
