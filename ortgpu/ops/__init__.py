"""Operators: one module per ONNX operator, each with its WGSL kernel generator and numpy twin.

``get_operator(op_type, opset)`` picks the implementation with the highest
``since_version`` not above the model's opset (as onnx's reference evaluator does).
"""

from __future__ import annotations

from ._kernel import Binding, DeviceCaps, KernelSpec, NotOnDevice, Operator, OpPlan, TensorInfo, reference_twin
from ._registry import get_operator, register, registered_op_types

__all__ = [
    "Binding",
    "DeviceCaps",
    "KernelSpec",
    "NotOnDevice",
    "Operator",
    "OpPlan",
    "TensorInfo",
    "reference_twin",
    "get_operator",
    "register",
    "registered_op_types",
]
