"""Slice: ``starts``/``ends``/``axes`` attributes before opset 10; inputs ``starts``, ``ends``,
``axes``, ``steps`` from opset 10.  A bit-exact copy for any dtype.

ONNX's clamping: a negative start or end counts from the end of the axis;
then for a positive step both clamp to ``[0, dim]``, for a negative step the
start clamps to ``[0, dim - 1]`` and the end to ``[-1, dim - 1]``.  The
kernel needs the starts, axes and steps at plan time (constants, or
attributes); the output shape gives the counts, so ``ends`` may be computed
at run time.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._kernel import Binding, DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo, reference_twin
from .._registry import register
from .._wgsl import affine_index_function, contiguous_strides
from .._wgsl_kernels import gather_kernel

__all__ = ["Slice", "slice_ranges"]


def slice_ranges(
    shape: Sequence[int],
    starts: Sequence[int],
    ends: Sequence[int] | None,
    axes: Sequence[int] | None,
    steps: Sequence[int] | None,
    opset: int,
) -> list[tuple[int, int, int]]:
    """Per axis of ``shape``: (first index, element count, step) after ONNX's clamping.

    With ``ends`` None the counts are left as -1 (the caller knows them from the output shape).
    """
    rank = len(shape)
    axes_list = list(range(len(starts))) if axes is None else [int(a) for a in axes]
    steps_list = [1] * len(starts) if steps is None else [int(s) for s in steps]
    if not len(axes_list) == len(steps_list) == len(starts) or (ends is not None and len(ends) != len(starts)):
        raise UnsupportedOpError(f"Slice (opset {opset}): starts, ends, axes and steps differ in length")
    ranges = [(0, int(d), 1) for d in shape]
    seen = set()
    for position, axis in enumerate(axes_list):
        if not -rank <= axis < rank:
            raise UnsupportedOpError(f"Slice (opset {opset}): axis {axis} is out of range for rank {rank}")
        axis = axis + rank if axis < 0 else axis
        if axis in seen:
            raise UnsupportedOpError(f"Slice (opset {opset}): axis {axis} is repeated")
        seen.add(axis)
        dim = int(shape[axis])
        step = steps_list[position]
        if step == 0:
            raise UnsupportedOpError(f"Slice (opset {opset}): a step of 0")
        start = int(starts[position])
        start = start + dim if start < 0 else start
        start = min(max(start, 0), dim) if step > 0 else min(max(start, 0), dim - 1)
        count = -1
        if ends is not None:
            end = int(ends[position])
            end = end + dim if end < 0 else end
            end = min(max(end, 0), dim) if step > 0 else min(max(end, -1), dim - 1)
            count = max(0, -(-(end - start) // step))
        ranges[axis] = (start, count, step)
    return ranges


def _array(value: Any) -> list[int] | None:
    return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]


@register
class Slice(Operator):
    op_type = "Slice"
    since_version = 1
    opset_changes = (10,)

    def _arguments(
        self, inputs: Sequence[Any], attrs: Mapping[str, Any]
    ) -> tuple[list[int] | None, list[int] | None, list[int] | None, list[int] | None]:
        if self.opset < 10:
            return _array(attrs.get("starts")), _array(attrs.get("ends")), _array(attrs.get("axes")), None
        values = [_array(inputs[i]) if len(inputs) > i and inputs[i] is not None else None for i in range(1, 5)]
        return values[0], values[1], values[2], values[3]

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        data = inputs[0]
        assert data is not None
        starts, ends, axes, steps = self._arguments(inputs, attrs)
        if starts is None or ends is None:
            raise UnsupportedOpError(f"Slice (opset {self.opset}): starts and ends are required")
        result = data
        for axis, (start, count, step) in enumerate(slice_ranges(data.shape, starts, ends, axes, steps, self.opset)):
            result = np.take(result, start + step * np.arange(count, dtype=np.int64), axis=axis)
        return [np.array(result, order="C")]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        data = inputs[0]
        assert data is not None
        out = outputs[0]
        if out.size == 0:
            return OpPlan()
        if self.opset >= 10:
            for index, name in ((1, "starts"), (3, "axes"), (4, "steps")):
                if len(inputs) > index and inputs[index] is not None and index not in constants:
                    raise NotOnDevice(
                        f"Slice runs on the CPU: its {name} are computed at run time, the kernel needs them at plan time"
                    )
            given = [constants.get(i) if len(inputs) > i and inputs[i] is not None else None for i in range(5)]
            starts, axes, steps = _array(given[1]), _array(given[3]), _array(given[4])
        else:
            starts, _, axes, steps = self._arguments([], attrs)
        if starts is None:
            raise UnsupportedOpError(f"Slice (opset {self.opset}): starts are required")
        ranges = slice_ranges(data.shape, starts, None, axes, steps, self.opset)
        strides = contiguous_strides(data.shape)
        offset = sum(start * stride for (start, _, _), stride in zip(ranges, strides))
        terms: list[tuple[int | None, int]] = [(None, step * stride) for (_, _, step), stride in zip(ranges, strides)]
        source = affine_index_function("index_data", out.shape, terms, offset) + (
            "fn source(j: u32) -> vec2<u32> { return vec2<u32>(0u, index_data(j)); }\n"
        )
        bindings = [Binding("input", 0), Binding("output", 0)]

        def function(array: np.ndarray) -> np.ndarray:
            result = array
            for axis, (start, _, step) in enumerate(ranges):
                count = out.shape[axis]
                result = np.take(result, start + step * np.arange(count, dtype=np.int64), axis=axis)
            return result

        kernel = gather_kernel(
            "Slice", [(bindings[0], data)], [], out, source, caps, reference_twin(function, bindings, inputs, outputs)
        )
        return OpPlan(kernels=(kernel,))
