"""OneHot: ``values[1]`` where an index equals the position along the new axis, ``values[0]`` elsewhere (CPU).

Indices may be negative (counted from ``depth``); indices outside
``[-depth, depth - 1]`` give a row of ``values[0]`` (the spec's rule).  ``depth``
is a shape-deciding input (its value sizes the output), so the node is planned
only where it is known.

On the device each output element is a bit-exact copy of ``values[0]`` or
``values[1]`` (any dtype), decided by its index, read at run time: no index
can be out of range here (those give ``values[0]``), so run-time indices are
safe.  int64 indices are read as both words (an index that only its low word
would put in range is still off); float indices are truncated toward zero.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ..._types import element_count
from .._kernel import Binding, DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo, reference_twin
from .._registry import register
from .._wgsl import wgsl_compute_type
from .._wgsl_kernels import gather_kernel

__all__ = ["OneHot"]


@register
class OneHot(Operator):
    op_type = "OneHot"
    since_version = 9

    def _geometry(self, indices_rank: int, depth_value: np.ndarray, attrs: Mapping[str, Any]) -> tuple[int, int]:
        """(depth, axis in the output) with the checks of the reference."""
        if depth_value.size != 1:
            raise ShapeError(f"OneHot: depth must hold one value, got shape {depth_value.shape}")
        if depth_value.dtype.kind not in "iuf":
            raise UnsupportedOpError(f"OneHot: depth of dtype {depth_value.dtype}")
        # A float depth is truncated toward zero, as a C cast does.
        depth = int(np.asarray(depth_value).reshape(-1)[0])
        if depth < 1:
            raise ShapeError(f"OneHot: depth {depth} must be positive")
        axis = int(attrs.get("axis", -1))
        if not -indices_rank - 1 <= axis <= indices_rank:
            raise UnsupportedOpError(f"OneHot: axis {axis} is out of range for indices of rank {indices_rank}")
        return depth, axis + indices_rank + 1 if axis < 0 else axis

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        indices, depth_value, values = inputs[0], inputs[1], inputs[2]
        assert indices is not None and depth_value is not None and values is not None
        if values.size != 2:
            raise ShapeError(f"OneHot: values must hold [off, on], got shape {values.shape}")
        if indices.dtype.kind not in "iuf":
            raise UnsupportedOpError(f"OneHot: indices of dtype {indices.dtype}")
        rank = indices.ndim
        depth, axis = self._geometry(rank, depth_value, attrs)
        index = np.trunc(indices).astype(np.int64) if indices.dtype.kind == "f" else indices.astype(np.int64)
        index = np.where(index < 0, index + depth, index)
        positions = np.arange(depth, dtype=np.int64).reshape((depth,) + (1,) * (rank - axis))
        hot = np.expand_dims(index, axis) == positions
        flat = values.reshape(-1)
        return [np.array(np.where(hot, flat[1], flat[0]), dtype=values.dtype, order="C")]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        indices, values = inputs[0], inputs[2]
        assert indices is not None and values is not None
        if 1 not in constants:
            raise NotOnDevice("OneHot: a depth computed at run time cannot size the output; it runs on the CPU")
        depth, axis = self._geometry(len(indices.shape), np.asarray(constants[1]), attrs)
        if values.size != 2:
            raise ShapeError(f"OneHot: values must hold [off, on], got shape {values.shape}")
        out = outputs[0]
        if out.size == 0:
            return OpPlan()
        inner = element_count(indices.shape[axis:])
        name = indices.dtype.name
        if name == "int64":
            # Both words (gather_kernel binds the first auxiliary as `auxbuf0`): in range iff the high word is the
            # sign extension of the low one and the low one lies in [-depth, depth).
            read = (
                "  let low = auxbuf0[2u * e];\n"
                "  let high = auxbuf0[2u * e + 1u];\n"
                "  let small = bitcast<i32>(low);\n"
                "  let valid = (high == 0u && small >= 0) || (high == 0xffffffffu && small < 0);\n"
                f"  let index = select(-{depth} - 1, small, valid);\n"
            )
            hot = f"index == i32(p) || index == i32(p) - {depth}"
        elif wgsl_compute_type(indices.dtype) == "i32":
            read = "  let index = aux0(e);\n"
            hot = f"index == i32(p) || index == i32(p) - {depth}"
        elif wgsl_compute_type(indices.dtype) == "u32":
            read = "  let index = aux0(e);\n"
            hot = "index == p"
        elif wgsl_compute_type(indices.dtype) == "f32":
            read = "  let index = trunc(aux0(e));\n"
            hot = f"index == f32(p) || index == f32(p) - {float(depth)}"
        else:
            raise NotOnDevice(f"OneHot: indices of dtype {name} run on the CPU")
        if depth >= 2**24 and wgsl_compute_type(indices.dtype) == "f32":
            raise NotOnDevice("OneHot: float indices with a depth beyond 2^24 run on the CPU")
        source = (
            "fn source(j: u32) -> vec2<u32> {\n"
            f"  let low_part = j % {inner}u;\n"
            f"  let p = (j / {inner}u) % {depth}u;\n"
            f"  let e = (j / {inner * depth}u) * {inner}u + low_part;\n"
            f"{read}"
            f"  return vec2<u32>(0u, select(0u, 1u, {hot}));\n"
            "}\n"
        )
        bindings = [Binding("input", 2), Binding("input", 0), Binding("output", 0)]
        operator, attributes, depth_value = OneHot(self.opset), dict(attrs), np.asarray(constants[1])

        def function(value_array: np.ndarray, index_array: np.ndarray) -> np.ndarray:
            return operator.reference([index_array, depth_value, value_array], attributes, outputs)[0]

        kernel = gather_kernel(
            "OneHot",
            [(bindings[0], values)],
            [(bindings[1], indices)],
            out,
            source,
            caps,
            reference_twin(function, bindings, inputs, outputs),
        )
        return OpPlan(kernels=(kernel,))
