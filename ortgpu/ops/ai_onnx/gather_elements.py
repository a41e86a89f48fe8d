"""GatherElements: ``out[i] = data[i with its axis coordinate replaced by indices[i]]``.

The output has the indices' shape; every other axis of the indices may be
shorter than the data's.  Negative indices count from the end of the axis.

On the device (a bit-exact copy, any dtype of 1, 2, 4 or 8 bytes).  Constant
indices are range-checked when planned.  Indices read at run time are checked
by the kernel: an out-of-range one (or an int64 whose high word is not the sign
extension of its low word) is clamped, so the read stays inside the data, and
flags the run in the program's status words, so the run raises
``InvalidArgumentError`` (as the reference and onnxruntime refuse it) instead of
returning the clamped value.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import InvalidArgumentError, ShapeError, UnsupportedOpError

from .._kernel import Binding, DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo, flagging_twin, reference_twin
from .._registry import register
from .._run_time_indices import index_lines, require_index_dtype
from .._wgsl import contiguous_strides, wgsl_int
from .._wgsl_kernels import gather_kernel

__all__ = ["GatherElements"]


def _axis(attrs: Mapping[str, Any], rank: int) -> int:
    axis = int(attrs.get("axis", 0))
    if not -rank <= axis < rank:
        raise UnsupportedOpError(f"GatherElements: axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _check_shapes(data_shape: Sequence[int], index_shape: Sequence[int], axis: int) -> None:
    if len(data_shape) != len(index_shape):
        raise ShapeError(f"GatherElements: indices of rank {len(index_shape)} for data of rank {len(data_shape)}")
    for d, (size, count) in enumerate(zip(data_shape, index_shape)):
        if d != axis and count > size:
            raise ShapeError(
                f"GatherElements: indices dim {d} is {count}, larger than the data's {size} (only the axis may be)"
            )


def _normalised(indices: np.ndarray, size: int, what: str) -> np.ndarray:
    """``indices`` as int64 in ``[0, size)``, or a typed error naming the offending index."""
    if indices.dtype not in (np.int32, np.int64):
        raise UnsupportedOpError(f"GatherElements: indices of dtype {indices.dtype} (int32 or int64 expected)")
    wide = indices.astype(np.int64)
    bad = (wide < -size) | (wide >= size)
    if bad.any():
        raise InvalidArgumentError(
            f"GatherElements: {what} index {int(wide[bad].flat[0])} is outside [-{size}, {size - 1}]"
        )
    return np.where(wide < 0, wide + size, wide)


def gather_elements(data: np.ndarray, indices: np.ndarray, axis: int) -> np.ndarray:
    """The ONNX semantics in numpy (checked shapes and indices)."""
    _check_shapes(data.shape, indices.shape, axis)
    index = _normalised(indices, data.shape[axis], "an")
    # take_along_axis broadcasts the other axes: cut the data to the indices' extent there first.
    window = tuple(slice(None) if d == axis else slice(0, n) for d, n in enumerate(indices.shape))
    return np.array(np.take_along_axis(data[window], index, axis=axis), order="C")


@register
class GatherElements(Operator):
    op_type = "GatherElements"
    since_version = 11

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        data, indices = inputs[0], inputs[1]
        assert data is not None and indices is not None
        return [gather_elements(data, indices, _axis(attrs, data.ndim))]

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
        axis = _axis(attrs, len(data.shape))
        _check_shapes(data.shape, indices.shape, axis)
        out = outputs[0]
        size = data.shape[axis]
        checked = 1 not in constants
        if checked:
            require_index_dtype("GatherElements", indices.dtype)
            if size == 0 and out.size:
                raise NotOnDevice("GatherElements: every index into an empty axis is invalid; the CPU refuses them")
        else:
            _normalised(np.asarray(constants[1]), size, "a constant")
        if out.size == 0:
            return OpPlan()
        strides = contiguous_strides(data.shape)
        lines = ["fn source(j: u32) -> vec2<u32> {\n", "  var rest = j;\n", "  var offset = 0;\n"]
        for d in range(len(indices.shape) - 1, -1, -1):
            lines.append(f"  let c{d} = i32(rest % {indices.shape[d]}u);\n  rest = rest / {indices.shape[d]}u;\n")
            if d != axis:
                lines.append(f"  offset = offset + c{d} * {wgsl_int(strides[d])};\n")
        # Constant indices were checked above (the clamp only keeps the read inside the buffer); run-time ones flag.
        lines.append(index_lines("index", "j", indices.dtype, -size, size - 1, checked=checked, wrap=size))
        lines.append(f"  return vec2<u32>(0u, u32(offset + index * {wgsl_int(strides[axis])}));\n}}\n")
        bindings = [Binding("input", 0), Binding("input", 1), Binding("output", 0)]

        def function(array: np.ndarray, index_array: np.ndarray) -> np.ndarray:
            return gather_elements(array, index_array, axis)

        twin = reference_twin(function, bindings, inputs, outputs)
        kernel = gather_kernel(
            "GatherElements",
            [(bindings[0], data)],
            [(bindings[1], indices)],
            out,
            "".join(lines),
            caps,
            # the reference's InvalidArgumentError becomes the status flag, as in the WGSL
            flagging_twin(twin, bindings + [Binding("status")]) if checked else twin,
            status=checked,
        )
        return OpPlan(kernels=(kernel,))
