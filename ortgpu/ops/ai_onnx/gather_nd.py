"""GatherND: gather slices of ``data`` addressed by the index tuples in the last axis of ``indices``.

``batch_dims`` (opset 12) leading axes are shared by data and indices: each
batch gathers from its own slice.  Negative indices count from the end; an
index out of range is a typed error, as in onnxruntime.

On the device (a bit-exact copy, any dtype).  Constant indices are
range-checked when planned; indices read at run time are checked by the kernel:
an out-of-range entry (or an int64 whose high word is not the sign extension of
its low word) is clamped, so the read stays inside the data, and flags the run
in the program's status words, so it raises ``InvalidArgumentError`` instead of
returning the clamped slice.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import InvalidArgumentError, ShapeError, UnsupportedOpError

from ..._types import element_count
from .._kernel import Binding, DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo, flagging_twin, reference_twin
from .._registry import register
from .._run_time_indices import index_lines, require_index_dtype
from .._wgsl import contiguous_strides, wgsl_int
from .._wgsl_kernels import gather_kernel

__all__ = ["GatherND"]


def _checked_tuples(data_shape: tuple[int, ...], indices: np.ndarray, batch_dims: int) -> np.ndarray:
    """The index tuples as int64 ``[batches, tuples, depth]`` with negative entries normalised (checked)."""
    if indices.dtype != np.int64 and indices.dtype != np.int32:
        raise UnsupportedOpError(f"GatherND: indices of dtype {indices.dtype} (int64 expected)")
    b = batch_dims
    rank = len(data_shape)
    if indices.ndim < 1 or not 0 <= b < min(rank, indices.ndim):
        raise ShapeError(f"GatherND: batch_dims {b} for data rank {rank} and indices rank {indices.ndim}")
    if data_shape[:b] != indices.shape[:b]:
        raise ShapeError(f"GatherND: batch dims differ: data {data_shape[:b]}, indices {indices.shape[:b]}")
    depth = indices.shape[-1]
    if b + depth > rank:
        raise ShapeError(f"GatherND: index tuples of length {depth} with batch_dims {b} exceed data rank {rank}")
    batches = element_count(data_shape[:b])
    tuples = indices.reshape(batches, -1, depth).astype(np.int64)
    bounds = np.array(data_shape[b : b + depth], dtype=np.int64)
    bad = (tuples < -bounds) | (tuples >= bounds)
    if bad.any():
        raise InvalidArgumentError(f"GatherND: an index is out of range (the first: {int(tuples[bad].flat[0])})")
    return np.where(tuples < 0, tuples + bounds, tuples)


def gather_nd(data: np.ndarray, indices: np.ndarray, batch_dims: int) -> np.ndarray:
    tuples = _checked_tuples(data.shape, indices, batch_dims)
    b, depth = batch_dims, indices.shape[-1]
    batches = tuples.shape[0]
    out_shape = indices.shape[:-1] + data.shape[b + depth :]
    flat_data = data.reshape((batches,) + data.shape[b:])
    batch_index = np.arange(batches).reshape(batches, 1)
    picked = flat_data[(batch_index,) + tuple(tuples[..., d] for d in range(depth))]
    return np.array(picked.reshape(out_shape), order="C")


@register
class GatherND(Operator):
    op_type = "GatherND"
    since_version = 11

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        data, indices = inputs[0], inputs[1]
        assert data is not None and indices is not None
        return [gather_nd(data, indices, int(attrs.get("batch_dims", 0)))]

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
        batch_dims = int(attrs.get("batch_dims", 0))
        checked = 1 not in constants
        if checked:
            require_index_dtype("GatherND", indices.dtype)
            # the reference checks the shapes (a typed error when planned); zeros are valid unless a bound is 0
            try:
                _checked_tuples(data.shape, np.zeros(indices.shape, indices.dtype), batch_dims)
            except InvalidArgumentError:
                raise NotOnDevice(
                    "GatherND: index tuples into an empty axis are all invalid; the CPU refuses them"
                ) from None
        else:
            # the reference checks shapes and every index (a typed error when planned)
            _checked_tuples(data.shape, np.asarray(constants[1]), batch_dims)
        out = outputs[0]
        depth = indices.shape[-1]
        if out.size == 0:
            if checked and indices.size:
                # empty slices: no invocation would read (and check) the index tuples
                raise NotOnDevice("GatherND: index tuples of empty slices are checked on the CPU")
            return OpPlan()
        tuples_per_batch = element_count(indices.shape[batch_dims:-1])
        slice_size = element_count(data.shape[batch_dims + depth :])
        batch_size = element_count(data.shape[batch_dims:])
        strides = contiguous_strides(data.shape[batch_dims:])
        lines = [
            "fn source(j: u32) -> vec2<u32> {\n",
            f"  let g = j / {max(slice_size, 1)}u;\n",
            f"  var offset = i32((g / {max(tuples_per_batch, 1)}u) * {batch_size}u + j % {max(slice_size, 1)}u);\n",
        ]
        for d in range(depth):
            size = data.shape[batch_dims + d]
            lines.append(
                index_lines(f"i{d}", f"g * {depth}u + {d}u", indices.dtype, -size, size - 1, checked=checked, wrap=size)
            )
            lines.append(f"  offset = offset + i{d} * {wgsl_int(strides[d])};\n")
        lines.append("  return vec2<u32>(0u, u32(offset));\n}\n")
        bindings = [Binding("input", 0), Binding("input", 1), Binding("output", 0)]

        def function(array: np.ndarray, index_array: np.ndarray) -> np.ndarray:
            return gather_nd(array, index_array, batch_dims)

        twin = reference_twin(function, bindings, inputs, outputs)
        kernel = gather_kernel(
            "GatherND",
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
