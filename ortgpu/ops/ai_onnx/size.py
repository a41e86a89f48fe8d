"""Size: the element count of a tensor, as an int64 scalar.

The count is known when the node is planned (shapes are static there), so the
device kernel only writes that constant: the input's data is never read (nor
downloaded to the CPU).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register
from .._wgsl_kernels import elementwise_plan

__all__ = ["Size"]


@register
class Size(Operator):
    op_type = "Size"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        data = inputs[0]
        assert data is not None
        return [np.array(data.size, dtype=np.int64)]

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
        count = data.size
        if count >= 2**63:
            raise NotOnDevice(f"Size: {count} elements do not fit in int64")
        value = np.array(count, dtype=np.int64)

        def function() -> np.ndarray:
            return value

        low, high = count & 0xFFFFFFFF, count >> 32
        return elementwise_plan(
            "Size", [], outputs, f"vec2<u32>({low}u, {high}u)", caps, function, inputs, pair_output=True
        )
