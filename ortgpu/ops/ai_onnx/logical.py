"""Boolean logic with numpy broadcasting: And, Or, Xor (bool inputs, bool output).

Before opset 7 these took a legacy ``broadcast`` attribute (with ``axis``); the
default (no broadcasting: equal shapes) is supported, ``broadcast=1`` is refused.
The device kernels compute in WGSL ``bool`` (one byte per element, four
elements per invocation).  The operators are rows of :data:`LOGICAL_OPERATORS` over one class.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register_row
from .._wgsl_kernels import Operand, elementwise_plan

__all__ = ["LogicalOperator", "LOGICAL_OPERATORS"]


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


#: The logical operators, one row each: (op type, first opset, WGSL expression in ``x0`` and ``x1``, numpy function).
LOGICAL_OPERATORS: tuple[tuple[str, int, str, Callable[..., Any]], ...] = (
    ("And", 1, "x0 && x1", np.logical_and),
    ("Or", 1, "x0 || x1", np.logical_or),
    ("Xor", 1, "x0 != x1", np.logical_xor),
)

for _op_type, _since_version, _expression, _function in LOGICAL_OPERATORS:
    register_row(
        LogicalOperator,
        __name__,
        _op_type,
        _since_version,
        expression=_expression,
        numpy_function=staticmethod(_function),
        opset_changes=(7,),  # numpy broadcasting replaced the broadcast attribute
    )
