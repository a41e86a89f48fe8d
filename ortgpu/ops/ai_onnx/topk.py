"""TopK: the ``k`` largest (or smallest) elements along ``axis`` and their int64 indices.

``k`` is an attribute before opset 10 and a one-element int64 input from 10; ``largest`` and ``sorted`` exist from
opset 11.  Equal values keep the lower index first (the spec's tie rule), for largest and smallest alike.  The
results are always sorted (``sorted=0`` leaves the order unspecified, so sorted order is valid).  NaN sorts as the
largest value (numpy's order).

The device kernel (float32, int32/uint32, int64/uint64 exact as ``vec2<u32>`` pairs) runs one invocation per
input element: its rank in the row's order (the elements that come before it: larger, or equal with a lower index)
is counted by a scan of the row, and an element whose rank is below ``k`` writes itself and its index to that
position.  Ranks are a permutation, so no two invocations write the same place.  ``k`` comes from the output shape
(the plan is made for a known ``k``); rows longer than the driver's loop budget run on the CPU.
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

#: dtype -> WGSL ``greater(a, b)`` on loaded values (NaN counts as the largest float, equal to itself)
_GREATER = {
    "float32": (
        "fn is_nan(a: f32) -> bool { return (bitcast<u32>(a) & 0x7fffffffu) > 0x7f800000u; }\n"
        "fn greater(a: f32, b: f32) -> bool { return (is_nan(a) && !is_nan(b)) || a > b; }\n"
        "fn same(a: f32, b: f32) -> bool { return (is_nan(a) && is_nan(b)) || a == b; }\n"
    ),
    "int32": "fn greater(a: i32, b: i32) -> bool { return a > b; }\nfn same(a: i32, b: i32) -> bool { return a == b; }\n",
    "uint32": "fn greater(a: u32, b: u32) -> bool { return a > b; }\nfn same(a: u32, b: u32) -> bool { return a == b; }\n",
    "int64": (
        "fn greater(a: vec2<u32>, b: vec2<u32>) -> bool { return less64s(b, a); }\n"
        "fn same(a: vec2<u32>, b: vec2<u32>) -> bool { return all(a == b); }\n"
    ),
    "uint64": (
        "fn greater(a: vec2<u32>, b: vec2<u32>) -> bool { return less64u(b, a); }\n"
        "fn same(a: vec2<u32>, b: vec2<u32>) -> bool { return all(a == b); }\n"
    ),
}

__all__ = ["TopK", "top_k"]


def top_k(x: np.ndarray, k: int, axis: int, *, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """(values, int64 indices) of the ``k`` extremes of ``x`` along ``axis``, ties by ascending index."""
    moved = np.moveaxis(x, axis, -1)
    length = moved.shape[-1]
    if largest:
        # A stable ascending sort of the reversed row, read backwards: descending values, and among equal values
        # the higher reversed position (the lower original index) first.
        order = np.argsort(moved[..., ::-1], axis=-1, kind="stable")[..., ::-1]
        order = length - 1 - order
    else:
        order = np.argsort(moved, axis=-1, kind="stable")
    indices = order[..., :k].astype(np.int64)
    values = np.take_along_axis(moved, indices, axis=-1)
    return np.ascontiguousarray(np.moveaxis(values, -1, axis)), np.ascontiguousarray(np.moveaxis(indices, -1, axis))


@register
class TopK(Operator):
    """TopK-1 (k attribute), 10 (k input), 11/24 (largest, sorted)."""

    op_type = "TopK"
    since_version = 1
    opset_changes = (10, 11)

    def _k(self, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]) -> int:
        if self.opset < 10:
            if "k" not in attrs:
                raise ShapeError(f"{self.op_type}: the k attribute is required before opset 10")
            return int(attrs["k"])
        k_input = inputs[1] if len(inputs) > 1 else None
        if k_input is None:
            raise ShapeError(f"{self.op_type}: the k input is required from opset 10")
        values = np.asarray(k_input).reshape(-1)
        if values.size != 1 or values.dtype.kind not in "iu":
            raise ShapeError(f"{self.op_type}: k must be one int64 value, got {values.size} of {values.dtype}")
        return int(values[0])

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
        rank = x.ndim
        axis = int(attrs.get("axis", -1))
        if not -rank <= axis < rank:
            raise UnsupportedOpError(f"{self.op_type}: axis {axis} is out of range for rank {rank}")
        axis %= rank
        k = self._k(inputs, attrs)
        if not 0 <= k <= x.shape[axis]:
            raise ShapeError(f"{self.op_type}: k = {k} is outside [0, {x.shape[axis]}] (axis {axis} of {x.shape})")
        if self.opset < 11 and ("largest" in attrs or "sorted" in attrs):
            raise UnsupportedOpError(f"{self.op_type}: largest/sorted exist from opset 11 (model opset {self.opset})")
        values, indices = top_k(x, k, axis, largest=bool(attrs.get("largest", 1)))
        return [values, indices]

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
        rank = len(x.shape)
        axis = int(attrs.get("axis", -1))
        if not -rank <= axis < rank:
            raise UnsupportedOpError(f"{self.op_type}: axis {axis} is out of range for rank {rank}")
        axis %= rank
        if x.dtype.name not in _GREATER:
            raise NotOnDevice(f"{self.op_type} on {x.dtype.name} runs on the CPU: no WebGPU kernel for this dtype")
        values_info, indices_info = outputs[0], outputs[1]
        k = values_info.shape[axis]
        length = x.shape[axis]
        if values_info.size == 0:
            return OpPlan()
        check_loop_budget(self.op_type, length, caps)
        check_binding_sizes(self.op_type, [x, values_info, indices_info], caps)
        largest = bool(attrs.get("largest", 1))
        inner = 1
        for size in x.shape[axis + 1 :]:
            inner *= size
        pair = x.dtype.itemsize == 8
        # "o comes before v": larger (smaller), or equal with a lower index
        first = "greater(o, v)" if largest else "greater(v, o)"
        store_value = (
            "  values[2u * slot] = src[2u * j];\n  values[2u * slot + 1u] = src[2u * j + 1u];\n"
            if pair
            else "  values[slot] = src[j];\n"
        )
        body = (
            f"  let j = {LINEAR_INVOCATION};\n"
            f"  if (j >= {x.size}u) {{ return; }}\n"
            f"  let position = (j / {inner}u) % {length}u;\n"
            f"  let base = j - position * {inner}u;\n"
            "  let v = load(j);\n"
            "  var before = 0u;\n"
            f"  for (var r = 0u; r < {length}u; r = r + 1u) {{\n"
            f"    let o = load(base + r * {inner}u);\n"
            f"    if ({first} || (same(o, v) && r < position)) {{ before = before + 1u; }}\n"
            "  }\n"
            f"  if (before >= {k}u) {{ return; }}\n"
            f"  let slot = (j / {inner * length}u) * {k * inner}u + before * {inner}u + j % {inner}u;\n"
            + store_value
            + "  indices[2u * slot] = position;\n  indices[2u * slot + 1u] = 0u;\n"
        )
        workgroup = workgroup_size_for(caps.limits)
        wgsl = (
            storage_declaration(0, "src", writable=False)
            + storage_declaration(1, "values", writable=True)
            + storage_declaration(2, "indices", writable=True)
            + load_function("load", "src", x.dtype, int64_pair=pair)
            + (INT64_WGSL if pair else "")
            + _GREATER[x.dtype.name]
            + kernel_entry(workgroup, body)
        )
        bindings = (Binding("input", 0), Binding("output", 0), Binding("output", 1))
        k_value = np.array([k], dtype=np.int64)

        def compute(full: Sequence[np.ndarray | None]) -> list[np.ndarray]:
            return self.reference([full[0], k_value], {**attrs, "k": k} if self.opset < 10 else attrs, outputs)

        twin = whole_op_twin(compute, bindings, inputs[:1], outputs)
        grid = grid_for(x.size, workgroup, caps.limits)
        return OpPlan(kernels=(KernelSpec(self.op_type, wgsl, grid, bindings, twin),))
