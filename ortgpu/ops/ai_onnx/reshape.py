"""Operators that only reinterpret a tensor's shape: Reshape Squeeze Unsqueeze Flatten Identity.

A C-contiguous buffer already is the output of each, so their plans alias
the data input (``OpPlan(alias={0: 0})``): no kernel, no buffer.  Their
references compute the output shapes with ONNX's rules (``0`` and ``-1`` in
Reshape, ``allowzero``; axes as an attribute before opset 13 and as an input
from opset 13 for Squeeze/Unsqueeze).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ..._types import element_count
from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register

__all__ = ["AliasOperator", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "axes_argument"]


def axes_argument(
    operator: Operator, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any], first_input_opset: int
) -> list[int] | None:
    """The ``axes`` of a node: attribute before ``first_input_opset``, input 1 from it (None if absent)."""
    if operator.opset < first_input_opset:
        axes = attrs.get("axes")
        return None if axes is None else [int(a) for a in axes]
    if len(inputs) > 1 and inputs[1] is not None:
        return [int(a) for a in np.asarray(inputs[1]).reshape(-1)]
    return None


def _normalize_axes(op_type: str, axes: Sequence[int], rank: int) -> list[int]:
    normalized = []
    for axis in axes:
        if not -rank <= axis < rank:
            raise UnsupportedOpError(f"{op_type}: axis {axis} is out of range for rank {rank}")
        normalized.append(axis + rank if axis < 0 else axis)
    if len(set(normalized)) != len(normalized):
        raise UnsupportedOpError(f"{op_type}: repeated axes {list(axes)}")
    return normalized


class AliasOperator(Operator):
    """An operator whose output is its first input's buffer with another shape."""

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        if any(info is not None and info.dtype == object for info in inputs):
            raise NotOnDevice("string tensors live on the host")
        source = inputs[0]
        if source is not None and outputs and source.size != outputs[0].size:
            # shape inference copies a dimension into a shape the data does not fill (Reshape's 0 on an empty
            # tensor): onnxruntime refuses it when it runs; an alias of the wrong size would be read past its end
            raise ShapeError(
                f"{self.op_type}: its input {source.shape} has {source.size} elements, its output shape "
                f"{outputs[0].shape} needs {outputs[0].size}; check the shape the model asks for"
            )
        return OpPlan(alias={0: 0})


@register
class Reshape(AliasOperator):
    op_type = "Reshape"
    since_version = 5
    opset_changes = (14,)

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        data, shape_input = inputs[0], inputs[1]
        assert data is not None and shape_input is not None
        requested = [int(d) for d in np.asarray(shape_input).reshape(-1)]
        allow_zero = self.opset >= 14 and int(attrs.get("allowzero", 0)) == 1
        shape = []
        for axis, dim in enumerate(requested):
            if dim == 0 and not allow_zero:
                if axis >= data.ndim:
                    raise UnsupportedOpError(
                        f"Reshape (opset {self.opset}): 0 at axis {axis} copies no input dimension"
                    )
                dim = data.shape[axis]
            shape.append(dim)
        if shape.count(-1) > 1:
            raise UnsupportedOpError(f"Reshape (opset {self.opset}): more than one -1 in shape {requested}")
        if any(d < -1 for d in shape):
            # numpy reads any negative dimension as -1; ONNX (and onnxruntime) allow -1 only
            raise ShapeError(f"Reshape (opset {self.opset}): shape {requested} has a negative dimension other than -1")
        return [data.reshape(shape).copy()]


@register
class Squeeze(AliasOperator):
    op_type = "Squeeze"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        data = inputs[0]
        assert data is not None
        axes = axes_argument(self, inputs, attrs, 13)
        if axes is None:
            return [data.reshape([d for d in data.shape if d != 1]).copy()]
        normalized = _normalize_axes("Squeeze", axes, data.ndim)
        for axis in normalized:
            if data.shape[axis] != 1:
                raise UnsupportedOpError(
                    f"Squeeze (opset {self.opset}): axis {axis} has size {data.shape[axis]}, not 1"
                )
        return [data.reshape([d for i, d in enumerate(data.shape) if i not in normalized]).copy()]


@register
class Unsqueeze(AliasOperator):
    op_type = "Unsqueeze"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        data = inputs[0]
        assert data is not None
        axes = axes_argument(self, inputs, attrs, 13)
        if axes is None:
            raise UnsupportedOpError(f"Unsqueeze (opset {self.opset}): 'axes' is required")
        rank = data.ndim + len(axes)
        normalized = set(_normalize_axes("Unsqueeze", axes, rank))
        dims = iter(data.shape)
        shape = [1 if axis in normalized else next(dims) for axis in range(rank)]
        return [data.reshape(shape).copy()]


@register
class Flatten(AliasOperator):
    op_type = "Flatten"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        data = inputs[0]
        assert data is not None
        axis = int(attrs.get("axis", 1))
        if axis < 0:
            axis += data.ndim
        if not 0 <= axis <= data.ndim:
            raise UnsupportedOpError(
                f"Flatten (opset {self.opset}): axis {attrs.get('axis')} is out of range for rank {data.ndim}"
            )
        outer = element_count(data.shape[:axis])
        return [data.reshape(outer, -1 if outer else element_count(data.shape[axis:])).copy()]


@register
class Identity(AliasOperator):
    op_type = "Identity"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        data = inputs[0]
        if data is None:
            raise UnsupportedOpError(f"Identity (opset {self.opset}): the input is absent")
        return [np.array(data, copy=True)]
