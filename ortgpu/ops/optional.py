"""OptionalHasElement and OptionalGetElement on plain tensors.

ortgpu holds no optional-typed values: graph inputs of optional (or sequence) type are refused when the model
loads, and no operator here makes one.  So the input of these operators is either a tensor or absent (an empty
input name), and:

* ``OptionalHasElement`` (opset 15/18): true for a tensor, false for an absent input.  The answer is known when
  the node is planned, but it is one bool: it runs on the CPU.
* ``OptionalGetElement`` (opset 15/18): a tensor is returned unchanged (its device plan aliases the input
  buffer); an absent input is an error (the spec leaves it undefined).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ModelError

from ._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from ._registry import register

__all__ = ["OptionalHasElement", "OptionalGetElement"]


@register
class OptionalHasElement(Operator):
    op_type = "OptionalHasElement"
    since_version = 15

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        present = bool(inputs) and inputs[0] is not None
        return [np.array(present, dtype=np.bool_)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        raise NotOnDevice("OptionalHasElement: a single bool known when planning; it is written on the CPU")


@register
class OptionalGetElement(Operator):
    op_type = "OptionalGetElement"
    since_version = 15

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        if not inputs or inputs[0] is None:
            raise ModelError("OptionalGetElement: the input is empty (has no element); the spec leaves that undefined")
        return [inputs[0]]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        if not inputs or inputs[0] is None:
            raise NotOnDevice("OptionalGetElement: an empty input is an error, reported on the CPU")
        return OpPlan(alias={0: 0})
