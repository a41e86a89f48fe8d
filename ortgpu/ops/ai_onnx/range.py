"""Range (opset 11): ``output[i] = start + i * delta`` for ``max(ceil((limit - start) / delta), 0)`` elements.

On the device for float32 and int32 (the output length is part of the output
shape, so only ``start`` and ``delta`` are read, at run time); int64 needs
64-bit arithmetic and runs on the CPU.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register
from .._wgsl_kernels import Operand, elementwise_plan

__all__ = ["Range"]


@register
class Range(Operator):
    op_type = "Range"
    since_version = 11

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        start, limit, delta = inputs[0], inputs[1], inputs[2]
        assert start is not None and limit is not None and delta is not None
        dtype = start.dtype
        if dtype.kind not in "fi":
            raise UnsupportedOpError(f"Range (opset {self.opset}) does not support dtype {dtype}")
        first, last, step = start.item(), limit.item(), delta.item()
        if step == 0:
            raise UnsupportedOpError(f"Range (opset {self.opset}): delta is 0")
        count = max(int(math.ceil((last - first) / step)), 0)
        if dtype.kind == "i":
            return [(first + step * np.arange(count, dtype=np.int64)).astype(dtype)]
        return [(np.asarray(first, dtype) + np.arange(count, dtype=dtype) * np.asarray(step, dtype)).astype(dtype)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        start, delta = inputs[0], inputs[2]
        assert start is not None and delta is not None
        name = start.dtype.name
        if name not in ("float32", "int32"):
            raise NotOnDevice(f"Range on {name} runs on the CPU: its WebGPU kernel supports float32 and int32")
        expression = "x0 + f32(j) * x1" if name == "float32" else "x0 + i32(j) * x1"
        count = outputs[0].size

        def function(first: np.ndarray, step: np.ndarray) -> np.ndarray:
            values = first.reshape(()) + np.arange(count, dtype=first.dtype) * step.reshape(())
            return np.asarray(values, dtype=first.dtype)

        return elementwise_plan(
            "Range", [Operand(0, start), Operand(2, delta)], outputs, expression, caps, function, inputs
        )
