"""Operators whose outputs are known when the model is planned: Shape, Constant, ConstantOfShape.

The loader folds them into constants; when one is planned anyway it runs on
the CPU (``NotOnDevice``), since its output needs no device work.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register

__all__ = ["Shape", "Constant", "ConstantOfShape"]


class _PlanTimeOperator(Operator):
    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        raise NotOnDevice(f"{self.op_type} runs on the CPU: its output is known at plan time (it is constant-folded)")


@register
class Shape(_PlanTimeOperator):
    """Shape; from opset 15 the ``start``/``end`` attributes slice the shape (clamped, negatives from the end)."""

    op_type = "Shape"
    since_version = 1
    opset_changes = (15,)

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        data = inputs[0]
        assert data is not None
        shape = list(data.shape)
        if self.opset >= 15:
            rank = len(shape)
            start = int(attrs.get("start", 0))
            end = int(attrs.get("end", rank))
            start = min(max(start + rank if start < 0 else start, 0), rank)
            end = min(max(end + rank if end < 0 else end, 0), rank)
            shape = shape[start:end]
        return [np.array(shape, dtype=np.int64)]


@register
class Constant(_PlanTimeOperator):
    op_type = "Constant"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        if "value" in attrs:
            value = attrs["value"]
            if not isinstance(value, np.ndarray):
                import onnx.numpy_helper

                value = onnx.numpy_helper.to_array(value)
            return [np.array(value, copy=True)]
        if "value_float" in attrs:
            return [np.array(attrs["value_float"], dtype=np.float32)]
        if "value_floats" in attrs:
            return [np.array(attrs["value_floats"], dtype=np.float32)]
        if "value_int" in attrs:
            return [np.array(attrs["value_int"], dtype=np.int64)]
        if "value_ints" in attrs:
            return [np.array(attrs["value_ints"], dtype=np.int64)]
        given = sorted(attrs) or ["none"]
        raise UnsupportedOpError(f"Constant (opset {self.opset}): attribute {', '.join(given)} is not supported")


@register
class ConstantOfShape(_PlanTimeOperator):
    op_type = "ConstantOfShape"
    since_version = 9

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        shape = inputs[0]
        assert shape is not None
        value = attrs.get("value")
        fill = np.zeros(1, dtype=np.float32) if value is None else np.asarray(value).reshape(-1)
        if fill.size != 1:
            raise UnsupportedOpError(f"ConstantOfShape (opset {self.opset}): 'value' must hold one element")
        dims = [int(d) for d in np.asarray(shape).reshape(-1)]
        return [np.full(dims, fill[0], dtype=fill.dtype)]
