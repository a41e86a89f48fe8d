"""float16 versions of the bench's models, and how far their outputs are from the float32 model's.

:func:`to_float16` is the conversion a deployment applies to a float32 model before shipping it in half precision:
every float32 tensor of the graph (initializers, ``Constant`` and ``ConstantOfShape`` values, the inputs, the outputs
and the recorded intermediate types) becomes float16, and ``Cast`` to float32 becomes ``Cast`` to float16, in the main
graph and in every subgraph.  The inputs the ONNX specification requires in float32 whatever the data's type
(``Resize``'s and ``Upsample``'s scales) stay float32.  Values outside float16's range saturate to +-65504 rather
than turning into infinities.

:func:`float16_accuracy` states the cost: the float16 model's outputs (as ortgpu computed them) against the float32
model's on onnxruntime's CPU provider, and against onnxruntime CPU running the same float16 model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, numpy_helper

#: (operator, input index) pairs that ONNX types as float32 whatever the data's type: left alone.
FLOAT32_ONLY_INPUTS = frozenset({("Resize", 2), ("Upsample", 1)})
_HALF_MAX = float(np.finfo(np.float16).max)


def to_float16(model: onnx.ModelProto) -> onnx.ModelProto:
    """A float16 copy of ``model`` (see the module's docstring); ``model`` is not changed."""
    half = onnx.ModelProto()
    half.CopyFrom(model)
    _convert_graph(half.graph)
    return half


def half_feeds(feeds: dict[str, npt.NDArray[Any]]) -> dict[str, npt.NDArray[Any]]:
    """``feeds`` with every float32 array rounded to float16 (other types unchanged)."""
    return {name: value.astype(np.float16) if value.dtype == np.float32 else value for name, value in feeds.items()}


def float16_accuracy(
    model: onnx.ModelProto,
    half_model: onnx.ModelProto,
    feeds: dict[str, npt.NDArray[Any]],
    outputs: list[npt.NDArray[Any]],
) -> dict[str, float]:
    """The worst relative error (2-norm, per output) of ``outputs`` (the float16 model ``half_model`` run on the
    float16 ``feeds``) against the float32 ``model`` on onnxruntime CPU fed the same values in float32
    (``vs_fp32_cpu``), and against onnxruntime CPU running ``half_model`` (``vs_fp16_cpu``; absent when onnxruntime
    cannot run it)."""
    import onnxruntime

    wide = {name: value.astype(np.float32) if value.dtype == np.float16 else value for name, value in feeds.items()}
    fp32 = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    result = {"vs_fp32_cpu": _worst_relative_error(outputs, fp32.run(None, wide))}
    try:
        fp16 = onnxruntime.InferenceSession(half_model.SerializeToString(), providers=["CPUExecutionProvider"])
        result["vs_fp16_cpu"] = _worst_relative_error(outputs, fp16.run(None, feeds))
    except Exception:  # noqa: BLE001 - onnxruntime CPU lacks a float16 kernel of some operator: reported as absent
        pass
    return result


def _worst_relative_error(actual: list[npt.NDArray[Any]], expected: list[Any]) -> float:
    worst = 0.0
    for got, want in zip(actual, expected):
        got64, want64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
        if got64.shape != want64.shape:
            return float("inf")
        scale = max(float(np.linalg.norm(want64)), 1e-30)
        error = float(np.linalg.norm(got64 - want64)) / scale
        worst = error if np.isnan(error) else max(worst, error)
        if np.isnan(worst):
            return worst
    return worst


def _half_tensor(tensor: TensorProto) -> TensorProto:
    values = np.clip(numpy_helper.to_array(tensor), -_HALF_MAX, _HALF_MAX).astype(np.float16)
    return numpy_helper.from_array(values, tensor.name)


def _convert_graph(graph: onnx.GraphProto) -> None:
    keep = {
        node.input[index]
        for node in graph.node
        for op, index in FLOAT32_ONLY_INPUTS
        if node.op_type == op and len(node.input) > index and node.input[index]
    }
    for position, tensor in enumerate(graph.initializer):
        if tensor.data_type == TensorProto.FLOAT and tensor.name not in keep:
            graph.initializer[position].CopyFrom(_half_tensor(tensor))
    for value in [*graph.input, *graph.output, *graph.value_info]:
        kind = value.type.tensor_type
        if kind.elem_type == TensorProto.FLOAT and value.name not in keep:
            kind.elem_type = TensorProto.FLOAT16
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR and attribute.t.data_type == TensorProto.FLOAT:
                if not (node.op_type == "Constant" and any(output in keep for output in node.output)):
                    attribute.t.CopyFrom(_half_tensor(attribute.t))
            elif attribute.type == onnx.AttributeProto.GRAPH:
                _convert_graph(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for subgraph in attribute.graphs:
                    _convert_graph(subgraph)
            elif node.op_type == "Cast" and attribute.name == "to" and attribute.i == TensorProto.FLOAT:
                attribute.i = TensorProto.FLOAT16
