"""Transpose (attribute ``perm``, default: reverse the axes): a bit-exact copy for any dtype."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._kernel import Binding, DeviceCaps, Operator, OpPlan, TensorInfo, reference_twin
from .._registry import register
from .._wgsl import affine_index_function, contiguous_strides
from .._wgsl_kernels import gather_kernel

__all__ = ["Transpose", "permutation"]


def permutation(attrs: Mapping[str, Any], rank: int) -> list[int]:
    """A Transpose node's ``perm`` over ``rank`` axes (default: reversed; negative axes counted from the end);
    ``UnsupportedOpError`` if it is not a permutation."""
    perm = attrs.get("perm")
    if perm is None:
        return list(range(rank - 1, -1, -1))
    result = [int(p) + rank if int(p) < 0 else int(p) for p in perm]
    if sorted(result) != list(range(rank)):
        raise UnsupportedOpError(f"Transpose: perm {list(perm)} is not a permutation of {rank} axes")
    return result


@register
class Transpose(Operator):
    op_type = "Transpose"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        data = inputs[0]
        assert data is not None
        return [np.array(np.transpose(data, permutation(attrs, data.ndim)), order="C")]

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
        perm = permutation(attrs, len(data.shape))
        if [p for p in perm if data.shape[p] != 1] == sorted(p for p in perm if data.shape[p] != 1):
            return OpPlan(alias={0: 0})  # only size-1 axes move: the bytes are already in output order
        strides = contiguous_strides(data.shape)
        source = affine_index_function("index_data", out.shape, [(None, strides[p]) for p in perm]) + (
            "fn source(j: u32) -> vec2<u32> { return vec2<u32>(0u, index_data(j)); }\n"
        )
        bindings = [Binding("input", 0), Binding("output", 0)]

        def function(array: np.ndarray) -> np.ndarray:
            return np.transpose(array, perm)

        kernel = gather_kernel(
            "Transpose",
            [(bindings[0], data)],
            [],
            out,
            source,
            caps,
            reference_twin(function, bindings, inputs, outputs),
        )
        return OpPlan(kernels=(kernel,))
