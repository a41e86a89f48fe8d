"""ReverseSequence: reverse the first ``sequence_lens[b]`` steps along ``time_axis`` of each batch ``b`` (CPU)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import InvalidArgumentError, ShapeError, UnsupportedOpError

from ._kernel import Operator, TensorInfo
from ._registry import register

__all__ = ["ReverseSequence"]


@register
class ReverseSequence(Operator):
    op_type = "ReverseSequence"
    since_version = 10

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, lengths = inputs[0], inputs[1]
        assert x is not None and lengths is not None
        batch_axis = int(attrs.get("batch_axis", 1))
        time_axis = int(attrs.get("time_axis", 0))
        if x.ndim < 2 or sorted((batch_axis, time_axis)) != [0, 1]:
            raise UnsupportedOpError(
                f"ReverseSequence: batch_axis {batch_axis} and time_axis {time_axis} must be 0 and 1 (in some order) "
                f"of an input of rank >= 2 (rank {x.ndim})"
            )
        if lengths.shape != (x.shape[batch_axis],):
            raise ShapeError(f"ReverseSequence: sequence_lens {lengths.shape} for batch size {x.shape[batch_axis]}")
        steps = x.shape[time_axis]
        if lengths.size and (lengths.min() < 0 or lengths.max() > steps):
            raise InvalidArgumentError(f"ReverseSequence: a sequence length is outside [0, {steps}]")
        # Work in (time, batch, ...) order.
        view = np.moveaxis(x, (time_axis, batch_axis), (0, 1))
        output = view.copy()
        for b, length in enumerate(lengths.astype(np.int64)):
            output[:length, b] = view[:length, b][::-1]
        return [np.array(np.moveaxis(output, (0, 1), (time_axis, batch_axis)), order="C")]
