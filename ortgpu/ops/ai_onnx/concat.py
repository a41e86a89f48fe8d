"""Concat along ``axis`` (negative axes from opset 11): a bit-exact copy for any dtype.

One kernel reads every non-empty input, so the node runs on the device while
inputs + 1 fit the device's storage buffers per shader stage (8 on WebGPU's
defaults, 7 inputs); larger Concats run on the CPU.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from ..._types import element_count
from .._kernel import Binding, DeviceCaps, Operator, OpPlan, TensorInfo, reference_twin
from .._registry import register
from .._wgsl_kernels import gather_kernel

__all__ = ["Concat"]


def _axis(attrs: Mapping[str, Any], rank: int, opset: int) -> int:
    if "axis" not in attrs:
        if opset < 4:
            return 1
        raise UnsupportedOpError(f"Concat (opset {opset}): the 'axis' attribute is required")
    axis = int(attrs["axis"])
    if not -rank <= axis < rank:
        raise UnsupportedOpError(f"Concat (opset {opset}): axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


@register
class Concat(Operator):
    op_type = "Concat"
    since_version = 1
    opset_changes = (4,)

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        arrays = [a for a in inputs if a is not None]
        if not arrays:
            raise UnsupportedOpError(f"Concat (opset {self.opset}) needs at least one input")
        axis = _axis(attrs, arrays[0].ndim, self.opset)
        return [np.concatenate(arrays, axis=axis)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        out = outputs[0]
        if out.size == 0:
            return OpPlan()
        axis = _axis(attrs, len(out.shape), self.opset)
        post = element_count(out.shape[axis + 1 :])
        block = out.shape[axis] * post  # output elements per outer index
        sources: list[tuple[Binding, TensorInfo]] = []
        lines = [
            "fn source(j: u32) -> vec2<u32> {\n",
            f"  let outer = j / {block}u;\n",
            f"  let a = (j % {block}u) / {post}u;\n",
            f"  let p = j % {post}u;\n",
        ]
        start = 0
        clauses: list[tuple[int, str]] = []  # (end along the axis, WGSL of (source, element))
        for index, info in enumerate(inputs):
            if info is None or info.size == 0:
                continue
            size = info.shape[axis]
            slot = len(sources)
            sources.append((Binding("input", index), info))
            clauses.append((start + size, f"vec2<u32>({slot}u, (outer * {size}u + (a - {start}u)) * {post}u + p)"))
            start += size
        for end, value in clauses[:-1]:
            lines.append(f"  if (a < {end}u) {{ return {value}; }}\n")
        lines.append(f"  return {clauses[-1][1]};\n}}\n")  # the last input takes the rest
        present = [index for index, info in enumerate(inputs) if info is not None]

        def function(*arrays: np.ndarray) -> np.ndarray:
            full: list[np.ndarray | None] = [None] * len(inputs)
            kept = iter(arrays)
            for index in [b.index for b, _ in sources]:
                full[index] = next(kept)
            for index in present:
                if full[index] is None:
                    info = inputs[index]
                    assert info is not None
                    full[index] = np.zeros(info.shape, info.dtype)
            return self.reference(full, attrs, outputs)[0]

        bindings = [b for b, _ in sources] + [Binding("output", 0)]
        kernel = gather_kernel(
            "Concat", sources, [], out, "".join(lines), caps, reference_twin(function, bindings, inputs, outputs)
        )
        return OpPlan(kernels=(kernel,))
