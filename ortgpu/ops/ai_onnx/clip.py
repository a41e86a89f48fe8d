"""Clip: bounds as attributes ``min``/``max`` before opset 11, as optional scalar inputs from opset 11.

``output = min(max(x, low), high)``; so when ``low > high`` every element
becomes ``high``, as the ONNX specification says.  Constant bounds are baked
into the WGSL; bounds computed at run time are bound as scalar inputs.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from ..._types import is_float_dtype
from .._kernel import DeviceCaps, Operator, OpPlan, TensorInfo
from .._registry import register
from .._wgsl import require_device_dtype, wgsl_float, wgsl_int, wgsl_uint
from .._wgsl_kernels import Operand, elementwise_plan

__all__ = ["Clip"]


@register
class Clip(Operator):
    op_type = "Clip"
    since_version = 1
    opset_changes = (11,)

    def _bounds(self, inputs: Sequence[Any], attrs: Mapping[str, Any]) -> tuple[Any, Any]:
        """(low, high) as given: attribute floats before opset 11, else the optional inputs (or None)."""
        if self.opset < 11:
            low = attrs.get("min")
            high = attrs.get("max")
            return low, high
        low = inputs[1] if len(inputs) > 1 else None
        high = inputs[2] if len(inputs) > 2 else None
        return low, high

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x = inputs[0]
        assert x is not None
        if x.dtype.kind not in "fiu":
            raise UnsupportedOpError(f"Clip (opset {self.opset}) does not support dtype {x.dtype.name}")
        low, high = self._bounds(inputs, attrs)
        result = x
        if low is not None:
            if np.size(low) != 1:
                raise UnsupportedOpError(f"Clip (opset {self.opset}): 'min' must be a scalar")
            result = np.maximum(result, np.asarray(low, dtype=x.dtype).reshape(()))
        if high is not None:
            if np.size(high) != 1:
                raise UnsupportedOpError(f"Clip (opset {self.opset}): 'max' must be a scalar")
            result = np.minimum(result, np.asarray(high, dtype=x.dtype).reshape(()))
        return [np.asarray(result, dtype=x.dtype)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x = inputs[0]
        assert x is not None
        require_device_dtype(
            "Clip", x.dtype, ("float32", "float16", "bfloat16", "int32", "uint32", "int16", "uint16", "int8", "uint8")
        )
        is_float = is_float_dtype(x.dtype)
        literal_of = wgsl_uint if x.dtype.kind == "u" else wgsl_int
        operands = [Operand(0, x)]
        expression = "x0"
        bound_values: dict[int, Any] = {}  # bound slot (1 = min, 2 = max) -> value baked into the kernel
        for slot, function_name in ((1, "max"), (2, "min")):
            if self.opset < 11:
                value = attrs.get("min" if slot == 1 else "max")
            else:
                info = inputs[slot] if len(inputs) > slot else None
                if info is None:
                    continue
                value = constants.get(slot)
                if value is None:
                    operands.append(Operand(slot, info))
                    expression = f"{function_name}({expression}, x{len(operands) - 1})"
                    continue
            if value is None:
                continue
            scalar = np.asarray(value, dtype=x.dtype).reshape(-1)[0]
            bound_values[slot] = scalar
            literal = wgsl_float(float(scalar)) if is_float else literal_of(int(scalar))
            expression = f"{function_name}({expression}, {literal})"
        dynamic_slots = [op.input_index for op in operands[1:]]

        def function(data: np.ndarray, *bounds: np.ndarray) -> np.ndarray:
            full: list[np.ndarray | None] = [data, None, None]
            for slot, array in zip(dynamic_slots, bounds):
                full[slot] = array
            for slot, scalar in bound_values.items():
                full[slot] = np.asarray(scalar)
            if self.opset < 11:
                return self.reference([data], attrs, outputs)[0]
            return self.reference(full, attrs, outputs)[0]

        return elementwise_plan("Clip", operands, outputs, expression, caps, function, inputs)
