"""Unique: the distinct elements (or slices along ``axis``) of a tensor, with their first indices, the inverse
map and the counts (CPU).

``sorted=1`` (the default) orders them ascending (slices lexicographically);
``sorted=0`` keeps the order of first occurrence.  Output sizes depend on the
input's values (a shape-deciding input): the node is planned only where the
input is known.  Inputs holding NaN are refused: numpy keeps one NaN value,
onnxruntime drops them, and ONNX does not say.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._kernel import Operator, TensorInfo
from .._registry import register

__all__ = ["Unique"]


def unique(x: np.ndarray, axis: int | None, sort: bool) -> list[np.ndarray]:
    """``[values, first indices, inverse indices, counts]`` (the indices int64)."""
    if axis is None:
        values, first, inverse, counts = np.unique(
            x.reshape(-1), return_index=True, return_inverse=True, return_counts=True
        )
    else:
        values, first, inverse, counts = np.unique(
            x, return_index=True, return_inverse=True, return_counts=True, axis=axis
        )
    inverse = inverse.reshape(-1)
    if not sort:
        # Reorder by first occurrence and renumber the inverse map accordingly.
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        values = np.take(values, order, axis=0 if axis is None else axis)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    return [
        np.array(values, order="C"),
        first.astype(np.int64),
        inverse.astype(np.int64),
        counts.astype(np.int64),
    ]


@register
class Unique(Operator):
    op_type = "Unique"
    since_version = 11

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        axis = attrs.get("axis")
        if axis is not None:
            axis = int(axis)
            if not -x.ndim <= axis < x.ndim:
                raise UnsupportedOpError(f"Unique: axis {axis} is out of range for rank {x.ndim}")
            axis = axis + x.ndim if axis < 0 else axis
        if x.dtype.kind == "f" and np.isnan(x).any():
            # No agreed answer: numpy counts NaN once, onnxruntime drops NaN from the values.
            raise UnsupportedOpError(
                "Unique of a tensor holding NaN is not supported (NaN has no defined place among unique values)"
            )
        return unique(x, axis, bool(int(attrs.get("sorted", 1))))
