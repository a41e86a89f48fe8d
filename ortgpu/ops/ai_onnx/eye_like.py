"""EyeLike: ones on diagonal ``k`` of a 2-D tensor shaped like the input, zeros elsewhere.

On the device for every numeric dtype and bool (the input's values are never
read: the kernel binds only the output); 64-bit outputs are written as word
pairs (float64 one is ``0x3ff00000_00000000``).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ..._types import numpy_dtype_of
from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register
from .._wgsl import wgsl_compute_type
from .._wgsl_kernels import elementwise_plan

__all__ = ["EyeLike"]


@register
class EyeLike(Operator):
    op_type = "EyeLike"
    since_version = 9

    def _dtype(self, x: np.dtype[Any], attrs: Mapping[str, Any]) -> np.dtype[Any]:
        if "dtype" not in attrs:
            return x
        try:
            dtype = numpy_dtype_of(int(attrs["dtype"]))
        except (ValueError, TypeError):
            dtype = None
        if dtype is None:  # an unknown or unrepresentable element type
            raise UnsupportedOpError(f"EyeLike: dtype {attrs['dtype']} is not supported")
        if dtype.kind not in "biuf":
            raise UnsupportedOpError(f"EyeLike: dtype {dtype} is not supported")
        return dtype

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        if x.ndim != 2:
            raise ShapeError(f"EyeLike: the input must be 2-D, got shape {x.shape}")
        dtype = self._dtype(x.dtype, attrs)
        k = int(attrs.get("k", 0))
        rows, cols = x.shape
        return [np.eye(rows, cols, k=k, dtype=dtype)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x = inputs[0]
        assert x is not None
        if len(x.shape) != 2:
            raise ShapeError(f"EyeLike: the input must be 2-D, got shape {x.shape}")
        out = outputs[0]
        rows, cols = x.shape
        k = int(attrs.get("k", 0))
        # Beyond the matrix the diagonal is empty; clamping keeps the WGSL constant inside i32.
        k = max(-rows - 1, min(cols + 1, k))
        on = f"(i32(j % {max(cols, 1)}u) - i32(j / {max(cols, 1)}u) == {k})"
        pair = out.dtype.itemsize == 8 and out.dtype.name != "int64"
        if pair:
            one = {"float64": "vec2<u32>(0u, 0x3ff00000u)", "uint64": "vec2<u32>(1u, 0u)"}.get(out.dtype.name)
            if one is None:
                raise NotOnDevice(f"EyeLike: {out.dtype.name} outputs run on the CPU")
            expression = f"select(vec2<u32>(0u, 0u), {one}, {on})"
        else:
            compute = wgsl_compute_type(out.dtype)
            expression = {
                "f32": f"select(0.0, 1.0, {on})",
                "i32": f"select(0, 1, {on})",
                "u32": f"select(0u, 1u, {on})",
                "bool": on,
            }[compute]
        operator, attributes = EyeLike(), dict(attrs)
        shape = x.shape

        def function() -> np.ndarray:
            return operator.reference([np.zeros(shape, x.dtype)], attributes, outputs)[0]

        return elementwise_plan("EyeLike", [], outputs, expression, caps, function, inputs, pair_output=pair)
