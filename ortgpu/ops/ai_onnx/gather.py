"""Gather along ``axis`` with int32 or int64 indices (negative indices count from the end).

On the device for data of any dtype (a bit-exact copy): the embedding lookup
of transformer models.  Indices are read at run time; int64 indices through
their low word, which holds every valid index of a tensor that fits a storage
binding.  Out-of-range indices are an error in ONNX (onnxruntime refuses them): constant ones are a ``ShapeError``
when planning; indices read at run time are clamped by the kernel, so it never reads outside the data, and flagged
in the program's status words (a wrong high word of an int64 index included), so the run raises
``InvalidArgumentError`` instead of returning clamped rows.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import InvalidArgumentError, ShapeError, UnsupportedOpError

from ..._types import element_count
from .._kernel import Binding, DeviceCaps, Operator, OpPlan, TensorInfo
from .._registry import register
from .._wgsl import require_device_dtype
from .._wgsl_kernels import gather_kernel

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
            raise InvalidArgumentError(f"Gather (opset {self.opset}): an index is outside [-{size}, {size - 1}]")
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
        # Indices computed or fed at run time may be out of range: the kernel clamps them (it must read somewhere)
        # and flags the run through the program's status words, so the run raises instead of returning them.
        checked = 1 not in constants
        flag = "    atomicOr(&status[0], 1u);\n" if checked else ""
        # int64 indices are read through their low word: the high word must be its sign extension.
        wide_check = (
            " || auxbuf0[2u * q + 1u] != select(0u, 0xffffffffu, (auxbuf0[2u * q] & 0x80000000u) != 0u)"
            if indices.dtype.itemsize == 8
            else ""
        )
        source = (
            "fn source(j: u32) -> vec2<u32> {\n"
            f"  let p = j % {post}u;\n"
            f"  let rest = j / {post}u;\n"
            f"  let q = rest % {count}u;\n"
            f"  let outer = rest / {count}u;\n"
            "  var index = aux0(q);\n"
            f"  if (index < -{size} || index > {size - 1}{wide_check}) {{\n{flag}  }}\n"
            f"  if (index < 0) {{ index = index + {size}; }}\n"
            f"  let row = u32(clamp(index, 0, {size - 1}));\n"
            f"  return vec2<u32>(0u, (outer * {size}u + row) * {post}u + p);\n"
            "}\n"
        )
        bindings = [Binding("input", 0), Binding("input", 1), Binding("output", 0)]

        def function(array: np.ndarray, index_array: np.ndarray) -> tuple[np.ndarray, bool]:
            wide = index_array.astype(np.int64)
            invalid = bool(wide.size) and bool(wide.min() < -size or wide.max() >= size)
            rows = np.clip(np.where(wide < 0, wide + size, wide), 0, size - 1)
            return np.asarray(np.take(array, rows, axis=axis)), invalid

        def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
            # What the WGSL does: clamped reads, and the status flag for an index out of range.
            array = arrays[0][: data.nbytes].view(data.dtype).reshape(data.shape)
            index_array = arrays[1][: indices.nbytes].view(indices.dtype).reshape(indices.shape)
            result, invalid = function(array, index_array)
            arrays[2][: out.nbytes] = np.ascontiguousarray(result, dtype=out.dtype).reshape(-1).view(np.uint8)
            if invalid and checked:
                arrays[3][:4] = np.frombuffer(np.uint32(1).tobytes(), dtype=np.uint8)

        kernel = gather_kernel(
            "Gather",
            [(bindings[0], data)],
            [(bindings[1], indices)],
            out,
            source,
            caps,
            twin,
            status=checked,
        )
        return OpPlan(kernels=(kernel,))
