"""Gather along ``axis`` with int32 or int64 indices (negative indices count from the end).

On the device for data of any dtype (a bit-exact copy): the embedding lookup
of transformer models.  Indices are read at run time; int64 indices through
their low word, which holds every valid index of a tensor that fits a storage
binding.  Out-of-range indices are an error in ONNX; the kernel clamps them
so it never reads outside the data.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import InvalidArgumentError, ShapeError, UnsupportedOpError

from .._limits import element_count
from ._kernel import Binding, DeviceCaps, Operator, OpPlan, TensorInfo, reference_twin
from ._registry import register
from ._wgsl import require_device_dtype
from ._wgsl_kernels import gather_kernel

__all__ = ["Gather"]


def _axis(attrs: Mapping[str, Any], rank: int) -> int:
    axis = int(attrs.get("axis", 0))
    if not -rank <= axis < rank:
        raise UnsupportedOpError(f"Gather: axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


@register
class Gather(Operator):
    op_type = "Gather"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        data, indices = inputs[0], inputs[1]
        assert data is not None and indices is not None
        if indices.dtype not in (np.int32, np.int64):
            raise UnsupportedOpError(
                f"Gather (opset {self.opset}): indices of dtype {indices.dtype} (int32 or int64 expected)"
            )
        axis = _axis(attrs, data.ndim)
        size = data.shape[axis]
        if indices.size and (indices.min() < -size or indices.max() >= size):
            raise UnsupportedOpError(f"Gather (opset {self.opset}): an index is outside [-{size}, {size - 1}]")
        return [np.array(np.take(data, indices.astype(np.int64), axis=axis), order="C")]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        data, indices = inputs[0], inputs[1]
        assert data is not None and indices is not None
        require_device_dtype("Gather", indices.dtype, ("int32", "int64"))
        out = outputs[0]
        if out.size == 0:
            return OpPlan()
        axis = _axis(attrs, len(data.shape))
        size = data.shape[axis]
        if 1 in constants:
            const = np.asarray(constants[1])
            if const.size and (const.min() < -size or const.max() >= size):
                bad = int(const.min() if const.min() < -size else const.max())
                raise ShapeError(f"Gather: constant index {bad} is outside [-{size}, {size - 1}] (axis {axis})")
        post = element_count(data.shape[axis + 1 :])
        count = max(indices.size, 1)
        source = (
            "fn source(j: u32) -> vec2<u32> {\n"
            f"  let p = j % {post}u;\n"
            f"  let rest = j / {post}u;\n"
            f"  let q = rest % {count}u;\n"
            f"  let outer = rest / {count}u;\n"
            "  var index = aux0(q);\n"
            f"  if (index < 0) {{ index = index + {size}; }}\n"
            f"  let row = u32(clamp(index, 0, {size - 1}));\n"
            f"  return vec2<u32>(0u, (outer * {size}u + row) * {post}u + p);\n"
            "}\n"
        )
        bindings = [Binding("input", 0), Binding("input", 1), Binding("output", 0)]

        def function(array: np.ndarray, index_array: np.ndarray) -> np.ndarray:
            if index_array.size and (index_array.min() < -size or index_array.max() >= size):
                # The twin refuses (onnxruntime does too); the WGSL kernel clamps, as the module docstring says.
                raise InvalidArgumentError(f"Gather: an index is outside [-{size}, {size - 1}] (axis {axis})")
            return np.asarray(np.take(array, index_array.astype(np.int64), axis=axis))

        kernel = gather_kernel(
            "Gather",
            [(bindings[0], data)],
            [(bindings[1], indices)],
            out,
            source,
            caps,
            reference_twin(function, bindings, inputs, outputs),
        )
        return OpPlan(kernels=(kernel,))
