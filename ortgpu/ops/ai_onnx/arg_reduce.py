"""ArgMax and ArgMin: the int64 index of the largest (smallest) element along ``axis``.

``keepdims`` (default 1) keeps the reduced axis with size 1; ``select_last_index`` (opset 12) picks the last of
equal extremes instead of the first.  NaN follows onnxruntime: the row is scanned in order and an element replaces
the best so far only when it compares greater (less), so a NaN never replaces a number, and a NaN at the start of
a row is replaced by nothing (numpy's argmax, where NaN always wins, would differ).

The device kernel runs one invocation per output element scanning its row (float32/float16, 8/16/32-bit integers,
and int64/uint64 exactly as ``vec2<u32>`` pairs); rows longer than the driver's loop budget run on the CPU.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import Binding, DeviceCaps, KernelSpec, NotOnDevice, Operator, OpPlan, TensorInfo, check_loop_budget
from .._registry import register
from .._tiling import row_layout, whole_op_twin
from .._wgsl import (
    INT64_WGSL,
    LINEAR_INVOCATION,
    check_binding_sizes,
    grid_for,
    kernel_entry,
    load_function,
    storage_declaration,
    store_statements,
    workgroup_size_for,
)

__all__ = ["ArgMax", "ArgMin", "arg_extreme"]

#: dtypes the device kernel reads (64-bit integers as pairs)
_DEVICE_DTYPES = ("float32", "float16", "int32", "uint32", "int16", "uint16", "int8", "uint8", "int64", "uint64")


def arg_extreme(x: np.ndarray, axis: int, *, largest: bool, last: bool) -> np.ndarray:
    """Indices (int64, ``axis`` removed) of the extreme along ``axis``, scanning in order as onnxruntime does."""
    if x.dtype.kind != "f" or not np.isnan(x).any():
        if last:
            flipped = np.flip(x, axis=axis)
            found = np.argmax(flipped, axis=axis) if largest else np.argmin(flipped, axis=axis)
            return np.asarray(x.shape[axis] - 1 - found, dtype=np.int64)
        return np.asarray(np.argmax(x, axis=axis) if largest else np.argmin(x, axis=axis), dtype=np.int64)
    # NaN present: numpy's argmax lets NaN win; onnxruntime's ordered scan never picks a NaN after a number.
    moved = np.moveaxis(x, axis, -1)
    best = moved[..., 0].copy()
    index = np.zeros(best.shape, dtype=np.int64)
    for position in range(1, moved.shape[-1]):
        value = moved[..., position]
        if largest:
            better = value >= best if last else value > best
        else:
            better = value <= best if last else value < best
        best = np.where(better, value, best)
        index = np.where(better, position, index)
    return index


class _ArgReduce(Operator):
    largest = True

    def _axis(self, rank: int, attrs: Mapping[str, Any]) -> int:
        axis = int(attrs.get("axis", 0))
        if not -rank <= axis < rank:
            raise UnsupportedOpError(f"{self.op_type}: axis {axis} is out of range for rank {rank}")
        return axis % rank

    def _last(self, attrs: Mapping[str, Any]) -> bool:
        last = bool(attrs.get("select_last_index", 0))
        if last and self.opset < 12:
            raise UnsupportedOpError(
                f"{self.op_type}: select_last_index exists from opset 12 (model opset {self.opset})"
            )
        return last

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        axis = self._axis(x.ndim, attrs)
        if x.shape[axis] == 0:
            raise ShapeError(f"{self.op_type}: axis {axis} of shape {x.shape} is empty (no index to return)")
        if x.dtype.kind not in "fiu":
            raise UnsupportedOpError(f"{self.op_type}: dtype {x.dtype} is not numeric")
        index = arg_extreme(x, axis, largest=self.largest, last=self._last(attrs))
        if attrs.get("keepdims", 1):
            index = np.expand_dims(index, axis)
        return [index]

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
        axis = self._axis(len(x.shape), attrs)
        last = self._last(attrs)
        if x.dtype.name not in _DEVICE_DTYPES:
            raise NotOnDevice(f"{self.op_type} on {x.dtype.name} runs on the CPU: no WebGPU kernel for this dtype")
        layout = row_layout(x.shape, (axis,))
        if layout.length == 0:
            raise NotOnDevice(f"{self.op_type}: an empty axis is refused on the CPU")
        check_loop_budget(self.op_type, layout.length, caps)
        output = outputs[0]
        if output.size == 0:
            return OpPlan()
        check_binding_sizes(self.op_type, [x, output], caps)
        pair = x.dtype.itemsize == 8
        value_type = (
            "vec2<u32>" if pair else ("f32" if x.dtype.kind == "f" else "i32" if x.dtype.kind == "i" else "u32")
        )
        # ``better(v, best)``: v replaces the best so far (strictly, or also on ties for select_last_index).
        if pair:
            less = "less64s" if x.dtype.kind == "i" else "less64u"
            strict = f"{less}(best, v)" if self.largest else f"{less}(v, best)"
            better = f"({strict} || all(v == best))" if last else strict
        else:
            operator = (">" if self.largest else "<") + ("=" if last else "")
            better = f"(v {operator} best)"
            if x.dtype.kind == "f":
                # NaN by its bits: a comparison with NaN is false in IEEE, which GPU drivers need not keep (NVIDIA's
                # Vulkan driver let a NaN replace the best)
                nan = "((bitcast<u32>({}) & 0x7fffffffu) > 0x7f800000u)"
                better = f"(!{nan.format('v')} && !{nan.format('best')} && {better})"
        wgsl = (
            storage_declaration(0, "src", writable=False)
            + storage_declaration(1, "dst", writable=True)
            + load_function("load", "src", x.dtype, int64_pair=pair)
            + (INT64_WGSL if pair else "")
            + layout.row_base
            + layout.row_offset
            + "fn value(j: u32) -> vec2<u32> {\n"
            "  let base = row_base(j);\n"
            f"  var best: {value_type} = load(base);\n"
            "  var index = 0u;\n"
            f"  for (var r = 1u; r < {layout.length}u; r = r + 1u) {{\n"
            "    let v = load(base + row_offset(r));\n"
            f"    if {better} {{ best = v; index = r; }}\n"
            "  }\n"
            "  return vec2<u32>(index, 0u);\n"
            "}\n"
        )
        workgroup = workgroup_size_for(caps.limits)
        body = f"  let w = {LINEAR_INVOCATION};\n  if (w >= {output.size}u) {{ return; }}\n" + store_statements(
            output.dtype, output.size, "value", True
        )
        wgsl += kernel_entry(workgroup, body)
        bindings = (Binding("input", 0), Binding("output", 0))

        def compute(full: Sequence[np.ndarray | None]) -> list[np.ndarray]:
            return self.reference(full, attrs, outputs)

        twin = whole_op_twin(compute, bindings, inputs[:1], outputs)
        grid = grid_for(output.size, workgroup, caps.limits)
        return OpPlan(kernels=(KernelSpec(self.op_type, wgsl, grid, bindings, twin),))


@register
class ArgMax(_ArgReduce):
    """ArgMax-1/11/12/13 (select_last_index from 12)."""

    op_type = "ArgMax"
    since_version = 1
    opset_changes = (12,)
    largest = True


@register
class ArgMin(_ArgReduce):
    """ArgMin-1/11/12/13 (select_last_index from 12)."""

    op_type = "ArgMin"
    since_version = 1
    opset_changes = (12,)
    largest = False
