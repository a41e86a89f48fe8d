"""Split along ``axis`` into several outputs: one bit-exact copy kernel per output.

The sizes come from the ``split`` attribute (before opset 13), the ``split``
input (from opset 13), ``num_outputs`` (opset 18: equal parts, the last
smaller) or an even split over the outputs; plans read them from the output
shapes, so a ``split`` computed at run time needs nothing more.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ..._types import element_count
from .._kernel import Binding, DeviceCaps, KernelSpec, Operator, OpPlan, TensorInfo, reference_twin
from .._registry import register
from .._wgsl_kernels import gather_kernel

__all__ = ["Split"]


@register
class Split(Operator):
    op_type = "Split"
    since_version = 1
    opset_changes = (13, 18)

    def _sizes(self, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any], dim: int, count: int) -> list[int]:
        if self.opset < 13:
            split = attrs.get("split")
        else:
            split = inputs[1] if len(inputs) > 1 and inputs[1] is not None else None
        if split is not None:
            sizes = [int(s) for s in np.asarray(split).reshape(-1)]
            if sum(sizes) != dim:
                raise UnsupportedOpError(f"Split (opset {self.opset}): sizes {sizes} do not add up to {dim}")
            return sizes
        if self.opset >= 18 and "num_outputs" in attrs:
            parts = int(attrs["num_outputs"])
            if parts != count:
                raise ShapeError(f"Split (opset {self.opset}): num_outputs is {parts} but the node has {count} outputs")
            chunk = -(-dim // parts)
            return [min(chunk, max(dim - i * chunk, 0)) for i in range(parts)]
        if count <= 0 or dim % count:
            raise UnsupportedOpError(f"Split (opset {self.opset}): {dim} does not split evenly into {count} outputs")
        return [dim // count] * count

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        data = inputs[0]
        assert data is not None
        axis = int(attrs.get("axis", 0))
        axis = axis + data.ndim if axis < 0 else axis
        sizes = self._sizes(inputs, attrs, data.shape[axis], len(outputs))
        offsets = np.cumsum(sizes)[:-1]
        return [np.array(part, order="C") for part in np.split(data, offsets, axis=axis)]

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
        rank = len(data.shape)
        axis = int(attrs.get("axis", 0))
        axis = axis + rank if axis < 0 else axis
        if self.opset >= 18 and "num_outputs" in attrs and int(attrs["num_outputs"]) != len(outputs):
            raise ShapeError(
                f"Split (opset {self.opset}): num_outputs is {int(attrs['num_outputs'])} "
                f"but the node has {len(outputs)} outputs"
            )
        if (
            all(len(out.shape) == rank for out in outputs)
            and sum(out.shape[axis] for out in outputs) != data.shape[axis]
        ):
            raise ShapeError(
                f"Split: the outputs' sizes {[out.shape[axis] for out in outputs]} along axis {axis} "
                f"do not add up to the input's {data.shape[axis]}"
            )
        post = element_count(data.shape[axis + 1 :])
        in_block = data.shape[axis] * post
        kernels: list[KernelSpec] = []
        offset = 0
        for index, out in enumerate(outputs):
            size = out.shape[axis]
            if out.size > 0:
                block = size * post
                source = (
                    "fn source(j: u32) -> vec2<u32> {\n"
                    f"  return vec2<u32>(0u, (j / {block}u) * {in_block}u + {offset * post}u + j % {block}u);\n"
                    "}\n"
                )
                bindings = [Binding("input", 0), Binding("output", index)]
                kernels.append(
                    gather_kernel(
                        "Split",
                        [(bindings[0], data)],
                        [],
                        out,
                        source,
                        caps,
                        reference_twin(_part_function(axis, offset, size, index), bindings, inputs, outputs),
                        output_index=index,
                    )
                )
            offset += size
        return OpPlan(kernels=tuple(kernels))


def _part_function(axis: int, offset: int, size: int, index: int) -> Any:
    def function(array: np.ndarray) -> list[np.ndarray | None]:
        part = np.take(array, np.arange(offset, offset + size), axis=axis)
        return [None] * index + [part]

    return function
