"""Tile: repeat the input ``repeats[d]`` times along each axis (opset 6+: repeats as an input).

A bit-exact copy for any dtype; output coordinate ``c`` reads input coordinate
``c % dim``, so the plan needs only the shapes.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._kernel import Binding, DeviceCaps, Operator, OpPlan, TensorInfo, reference_twin
from .._registry import register
from .._wgsl import affine_index_function, contiguous_strides
from .._wgsl_kernels import gather_kernel

__all__ = ["Tile"]


@register
class Tile(Operator):
    op_type = "Tile"
    since_version = 6

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        data, repeats = inputs[0], inputs[1]
        assert data is not None and repeats is not None
        counts = [int(r) for r in np.asarray(repeats).reshape(-1)]
        if len(counts) != data.ndim or any(r < 0 for r in counts):
            raise UnsupportedOpError(f"Tile (opset {self.opset}): repeats {counts} do not fit rank {data.ndim}")
        return [np.array(np.tile(data, counts), order="C")]

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
        strides = contiguous_strides(data.shape)
        terms: list[tuple[int | None, int]] = [(int(dim), stride) for dim, stride in zip(data.shape, strides)]
        source = affine_index_function("index_data", out.shape, terms) + (
            "fn source(j: u32) -> vec2<u32> { return vec2<u32>(0u, index_data(j)); }\n"
        )
        bindings = [Binding("input", 0), Binding("output", 0)]
        repeats = [o // max(i, 1) for o, i in zip(out.shape, data.shape)]

        def function(array: np.ndarray) -> np.ndarray:
            return np.tile(array, repeats)

        kernel = gather_kernel(
            "Tile", [(bindings[0], data)], [], out, source, caps, reference_twin(function, bindings, inputs, outputs)
        )
        return OpPlan(kernels=(kernel,))
