"""Operators: each with its WGSL kernel generator and numpy twin, one subpackage per ONNX domain.

Layout::

    ops/ai_onnx/                    the default domain: one module per operator or per family of same-shaped
                                    operators (a table of rows over one class: unary, trigonometric, compare...)
    ops/ai_onnx_ml/                 ai.onnx.ml (LabelEncoder, TreeEnsemble, Binarizer, ArrayFeatureExtractor)
    ops/ai_onnx_preview_training/   ai.onnx.preview.training (Adagrad, Adam, Momentum)
    ops/com_microsoft/              onnxruntime's contributed operators (its docstring says how to add one)
    ops/_kernel.py, _registry.py    the operator base class, the registry; the other ``_`` modules are the shared
                                    kernel machinery (WGSL helpers, tiling, GEMM/GEMV, epilogues)

A registered class states the opset of its domain it starts at (``since_version``); ``get_operator(op_type, opset,
domain)`` picks the one with the highest ``since_version`` not above the model's opset, as onnx's reference
evaluator does.  Adding an operator is reading a sibling and touching one file (plus its test).
"""

from __future__ import annotations

from ._kernel import Binding, DeviceCaps, KernelSpec, NotOnDevice, Operator, OpPlan, TensorInfo, reference_twin
from ._registry import get_operator, register, register_row, registered_op_types, version_ranges

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
    "register_row",
    "registered_op_types",
    "version_ranges",
]
