"""ONNX sequence operators (``seq(tensor)`` values), CPU references only.

Sequence values live on the host; how ortgpu holds them (a "box") is :mod:`ortgpu._host_values`, which this module
re-exports for its callers.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import InvalidArgumentError, ModelError, ShapeError, UnsupportedOpError

from ..._host_values import (
    SEQUENCE_REASON,
    box,
    element_dtype_of,
    element_shapes_of,
    is_box,
    is_sequence_dtype,
    items,
    sequence_dtype,
    sequence_signature,
)
from ..._types import SubgraphRunner, onnx_dtype_to_numpy
from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register

__all__ = [
    "element_shapes_of",
    "is_box",
    "box",
    "items",
    "is_sequence_dtype",
    "sequence_dtype",
    "sequence_signature",
    "element_dtype_of",
    "SEQUENCE_REASON",
]


def _cpu(name: str) -> OpPlan:
    raise NotOnDevice(SEQUENCE_REASON)


class _SequenceOp(Operator):
    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        return _cpu(self.op_type)


def _position(value: np.ndarray | None, length: int, default: int, insert: bool, what: str) -> int:
    if value is None:
        return default
    array = np.asarray(value)
    if array.size != 1 or array.dtype.kind not in "iu":
        raise ShapeError(f"{what}: position must be an integer scalar, got shape {array.shape} dtype {array.dtype}")
    pos = int(array.reshape(-1)[0])
    high = length if insert else length - 1
    if not -length <= pos <= high:
        raise InvalidArgumentError(f"{what}: position {pos} is out of range for a sequence of length {length}")
    return pos + length if pos < 0 else pos


@register
class SequenceConstruct(_SequenceOp):
    op_type = "SequenceConstruct"
    since_version = 11

    def reference(
        self, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any], outputs: Sequence[TensorInfo]
    ) -> list[np.ndarray]:
        arrays = [np.array(v) for v in inputs if v is not None]
        if any(a.dtype != arrays[0].dtype for a in arrays):
            raise ModelError("SequenceConstruct: the tensors have different dtypes")
        return [box(arrays)]


@register
class SequenceEmpty(_SequenceOp):
    op_type = "SequenceEmpty"
    since_version = 11

    def reference(
        self, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any], outputs: Sequence[TensorInfo]
    ) -> list[np.ndarray]:
        element = onnx_dtype_to_numpy(int(attrs.get("dtype", 1)), "SequenceEmpty's dtype")
        return [box([], np.dtype(element))]


@register
class SequenceInsert(_SequenceOp):
    op_type = "SequenceInsert"
    since_version = 11

    def reference(
        self, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any], outputs: Sequence[TensorInfo]
    ) -> list[np.ndarray]:
        assert inputs[0] is not None and inputs[1] is not None
        arrays = list(items(inputs[0], "SequenceInsert"))
        element = element_dtype_of(inputs[0].dtype)
        tensor = np.array(inputs[1])
        if element is not None and tensor.dtype != element:
            raise ModelError(f"SequenceInsert: tensor dtype {tensor.dtype} differs from the sequence's {element}")
        pos = _position(inputs[2] if len(inputs) > 2 else None, len(arrays), len(arrays), True, "SequenceInsert")
        arrays.insert(pos, tensor)
        return [box(arrays, tensor.dtype)]


@register
class SequenceErase(_SequenceOp):
    op_type = "SequenceErase"
    since_version = 11

    def reference(
        self, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any], outputs: Sequence[TensorInfo]
    ) -> list[np.ndarray]:
        assert inputs[0] is not None
        arrays = list(items(inputs[0], "SequenceErase"))
        if not arrays:
            raise InvalidArgumentError("SequenceErase: the sequence is empty")
        pos = _position(inputs[1] if len(inputs) > 1 else None, len(arrays), len(arrays) - 1, False, "SequenceErase")
        del arrays[pos]
        return [box(arrays, element_dtype_of(inputs[0].dtype))]


@register
class SequenceAt(_SequenceOp):
    op_type = "SequenceAt"
    since_version = 11

    def reference(
        self, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any], outputs: Sequence[TensorInfo]
    ) -> list[np.ndarray]:
        arrays = items(inputs[0], "SequenceAt")
        pos = _position(inputs[1], len(arrays), 0, False, "SequenceAt")
        return [np.array(arrays[pos])]


@register
class SequenceLength(_SequenceOp):
    op_type = "SequenceLength"
    since_version = 11

    def reference(
        self, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any], outputs: Sequence[TensorInfo]
    ) -> list[np.ndarray]:
        return [np.array(len(items(inputs[0], "SequenceLength")), dtype=np.int64)]


@register
class SplitToSequence(_SequenceOp):
    op_type = "SplitToSequence"
    since_version = 11

    def reference(
        self, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any], outputs: Sequence[TensorInfo]
    ) -> list[np.ndarray]:
        data = inputs[0]
        assert data is not None
        rank = data.ndim
        axis = int(attrs.get("axis", 0))
        if not -rank <= axis < rank:
            raise ShapeError(f"SplitToSequence: axis {axis} is out of range for rank {rank}")
        axis %= rank
        length = data.shape[axis]
        split = inputs[1] if len(inputs) > 1 else None
        if split is None:
            pieces = [np.take(data, [i], axis=axis) for i in range(length)]
            if int(attrs.get("keepdims", 1)) == 0:
                pieces = [np.squeeze(p, axis=axis) for p in pieces]
            return [box(pieces, data.dtype)]
        sizes_arr = np.asarray(split)
        if sizes_arr.ndim == 0:
            size = int(sizes_arr)
            if size <= 0:
                raise ShapeError(f"SplitToSequence: split {size} must be positive")
            sizes = [size] * (length // size) + ([length % size] if length % size else [])
        else:
            sizes = [int(s) for s in sizes_arr.reshape(-1)]
            if any(s < 0 for s in sizes) or sum(sizes) != length:
                raise ShapeError(f"SplitToSequence: split {sizes} does not sum to the axis length {length}")
        bounds = np.cumsum([0] + sizes)
        index = [slice(None)] * rank
        out = []
        for start, stop in zip(bounds[:-1], bounds[1:]):
            index[axis] = slice(int(start), int(stop))
            out.append(np.array(data[tuple(index)]))
        return [box(out, data.dtype)]


@register
class ConcatFromSequence(_SequenceOp):
    op_type = "ConcatFromSequence"
    since_version = 11

    def reference(
        self, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any], outputs: Sequence[TensorInfo]
    ) -> list[np.ndarray]:
        arrays = items(inputs[0], "ConcatFromSequence")
        if "axis" not in attrs:
            raise ModelError("ConcatFromSequence: the axis attribute is required")
        axis = int(attrs["axis"])
        new_axis = int(attrs.get("new_axis", 0))
        if not arrays:
            raise InvalidArgumentError("ConcatFromSequence: the sequence is empty")
        rank = arrays[0].ndim + (1 if new_axis else 0)
        if not -rank <= axis < rank:
            raise ShapeError(f"ConcatFromSequence: axis {axis} is out of range for rank {rank}")
        axis %= rank
        try:
            return [np.stack(arrays, axis=axis) if new_axis else np.concatenate(arrays, axis=axis)]
        except ValueError as error:
            raise ShapeError(f"ConcatFromSequence: {error}") from error


@register
class SequenceMap(_SequenceOp):
    op_type = "SequenceMap"
    since_version = 17

    def reference(
        self, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any], outputs: Sequence[TensorInfo]
    ) -> list[np.ndarray]:
        body = attrs.get("body")
        if not isinstance(body, SubgraphRunner):
            raise UnsupportedOpError("SequenceMap: attribute 'body' is missing or not a subgraph")
        outer_names = body.outer_names
        declared = list(inputs[: len(inputs) - len(outer_names)])
        outer = {name: value for name, value in zip(outer_names, inputs[len(declared) :]) if value is not None}
        assert declared[0] is not None
        length = len(items(declared[0], "SequenceMap"))
        per_input: list[list[np.ndarray] | np.ndarray] = []
        for value in declared:
            assert value is not None
            if is_box(value):
                arrays = items(value, "SequenceMap")
                if len(arrays) != length:
                    raise ShapeError("SequenceMap: the input sequences have different lengths")
                per_input.append(arrays)
            else:
                per_input.append(value)
        results: list[list[np.ndarray]] = [[] for _ in body.graph.output]
        for i in range(length):
            args = [v[i] if isinstance(v, list) else v for v in per_input]
            for collected, value in zip(results, body.run(args, outer)):
                collected.append(np.asarray(value))
        out = []
        for index, collected in enumerate(results):
            element = None
            elem_type = body.graph.output[index].type
            if elem_type.HasField("tensor_type") and elem_type.tensor_type.elem_type:
                element = np.dtype(onnx_dtype_to_numpy(elem_type.tensor_type.elem_type, "SequenceMap output"))
            out.append(box(collected, element))
        return out
