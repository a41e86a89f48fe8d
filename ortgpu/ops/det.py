"""Det: the determinant of each square matrix in the last two axes (CPU reference).

The input has shape ``(*, M, M)`` and the output ``(*)``; numpy's LU-based ``linalg.det`` computes it in float64
and the result is cast back to the input's float dtype (``M = 0`` gives 1, the empty product).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from ._registry import register

__all__ = ["Det"]


@register
class Det(Operator):
    """Det-11/22 (22 adds bfloat16)."""

    op_type = "Det"
    since_version = 11

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        if x.dtype.kind != "f":
            raise UnsupportedOpError(f"{self.op_type}: dtype {x.dtype} is not a float type")
        if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
            raise ShapeError(f"{self.op_type}: the input must end in square matrices (*, M, M), got {x.shape}")
        if x.shape[-1] == 0:
            return [np.ones(x.shape[:-2], dtype=x.dtype)]
        if x.size == 0:
            return [np.zeros(x.shape[:-2], dtype=x.dtype)]
        return [np.asarray(np.linalg.det(x.astype(np.float64)), dtype=x.dtype).copy()]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        raise NotOnDevice(f"{self.op_type} runs on the CPU (no WebGPU kernel)")
