"""Boolean logic with numpy broadcasting: And, Or, Xor (bool inputs, bool output).

Before opset 7 these took a legacy ``broadcast`` attribute (with ``axis``); the
default (no broadcasting: equal shapes) is supported, ``broadcast=1`` is refused.
The device kernels compute in WGSL ``bool`` (one byte per element, four
elements per invocation).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register
from .._wgsl_kernels import Operand, elementwise_plan

__all__ = ["LogicalOperator", "And", "Or", "Xor"]


class LogicalOperator(Operator):
    """``output = a <op> b`` on bool tensors, broadcast numpy-style."""

    numpy_function: Callable[..., Any]
    #: the WGSL expression in ``x0`` and ``x1`` (both ``bool``).
    expression = ""

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        if self.opset < 7 and attrs.get("broadcast", 0):
            raise UnsupportedOpError(
                f"{self.op_type} (opset {self.opset}): the legacy 'broadcast' attribute is not supported"
            )
        if a.dtype != np.bool_ or b.dtype != np.bool_:
            raise UnsupportedOpError(
                f"{self.op_type} (opset {self.opset}) takes bool inputs, not {a.dtype.name} and {b.dtype.name}"
            )
        return [np.asarray(type(self).numpy_function(a, b), dtype=np.bool_)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        if a.dtype != np.bool_ or b.dtype != np.bool_:
            raise NotOnDevice(f"{self.op_type}: inputs must be bool, not {a.dtype.name} and {b.dtype.name}")

        def function(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            return self.reference([x, y], attrs, outputs)[0]

        operands = [Operand(0, a), Operand(1, b)]
        return elementwise_plan(self.op_type, operands, outputs, self.expression, caps, function, inputs)


@register
class And(LogicalOperator):
    op_type = "And"
    since_version = 1
    expression = "x0 && x1"
    numpy_function = staticmethod(np.logical_and)


@register
class Or(LogicalOperator):
    op_type = "Or"
    since_version = 1
    expression = "x0 || x1"
    numpy_function = staticmethod(np.logical_or)


@register
class Xor(LogicalOperator):
    op_type = "Xor"
    since_version = 1
    expression = "x0 != x1"
    numpy_function = staticmethod(np.logical_xor)
