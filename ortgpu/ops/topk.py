"""TopK: the ``k`` largest (or smallest) elements along ``axis`` and their int64 indices (CPU reference).

``k`` is an attribute before opset 10 and a one-element int64 input from 10; ``largest`` and ``sorted`` exist from
opset 11.  Equal values keep the lower index first (the spec's tie rule), for largest and smallest alike.  The
results are always sorted (``sorted=0`` leaves the order unspecified, so sorted order is valid).  NaN sorts as the
largest value (numpy's order).

It runs on the CPU: a sort per row has no simple kernel within lavapipe's loop budget.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from ._registry import register

__all__ = ["TopK", "top_k"]


def top_k(x: np.ndarray, k: int, axis: int, *, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """(values, int64 indices) of the ``k`` extremes of ``x`` along ``axis``, ties by ascending index."""
    moved = np.moveaxis(x, axis, -1)
    length = moved.shape[-1]
    if largest:
        # A stable ascending sort of the reversed row, read backwards: descending values, and among equal values
        # the higher reversed position (the lower original index) first.
        order = np.argsort(moved[..., ::-1], axis=-1, kind="stable")[..., ::-1]
        order = length - 1 - order
    else:
        order = np.argsort(moved, axis=-1, kind="stable")
    indices = order[..., :k].astype(np.int64)
    values = np.take_along_axis(moved, indices, axis=-1)
    return np.ascontiguousarray(np.moveaxis(values, -1, axis)), np.ascontiguousarray(np.moveaxis(indices, -1, axis))


@register
class TopK(Operator):
    """TopK-1 (k attribute), 10 (k input), 11/24 (largest, sorted)."""

    op_type = "TopK"
    since_version = 1

    def _k(self, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]) -> int:
        if self.opset < 10:
            if "k" not in attrs:
                raise ShapeError(f"{self.op_type}: the k attribute is required before opset 10")
            return int(attrs["k"])
        k_input = inputs[1] if len(inputs) > 1 else None
        if k_input is None:
            raise ShapeError(f"{self.op_type}: the k input is required from opset 10")
        values = np.asarray(k_input).reshape(-1)
        if values.size != 1 or values.dtype.kind not in "iu":
            raise ShapeError(f"{self.op_type}: k must be one int64 value, got {values.size} of {values.dtype}")
        return int(values[0])

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        if x.dtype.kind not in "fiu":
            raise UnsupportedOpError(f"{self.op_type}: dtype {x.dtype} is not numeric")
        rank = x.ndim
        axis = int(attrs.get("axis", -1))
        if not -rank <= axis < rank:
            raise UnsupportedOpError(f"{self.op_type}: axis {axis} is out of range for rank {rank}")
        axis %= rank
        k = self._k(inputs, attrs)
        if not 0 <= k <= x.shape[axis]:
            raise ShapeError(f"{self.op_type}: k = {k} is outside [0, {x.shape[axis]}] (axis {axis} of {x.shape})")
        if self.opset < 11 and ("largest" in attrs or "sorted" in attrs):
            raise UnsupportedOpError(f"{self.op_type}: largest/sorted exist from opset 11 (model opset {self.opset})")
        values, indices = top_k(x, k, axis, largest=bool(attrs.get("largest", 1)))
        return [values, indices]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        raise NotOnDevice(f"{self.op_type} runs on the CPU (no WebGPU sorting kernel)")
