"""ai.onnx.ml transforms (Binarizer, ArrayFeatureExtractor) through sessions on both backends, against onnxruntime."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper

import ortgpu
from ortgpu import ModelError, OrtGpuError


def _model(op_type: str, inputs: list[tuple[str, int, list[int]]], **attrs: Any) -> bytes:
    node = helper.make_node(op_type, [name for name, _, _ in inputs], ["Y"], domain="ai.onnx.ml", **attrs)
    graph = helper.make_graph(
        [node],
        "ml",
        [helper.make_tensor_value_info(name, dtype, shape) for name, dtype, shape in inputs],
        [helper.make_tensor_value_info("Y", inputs[0][1], None)],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    return bytes(helper.make_model(graph, opset_imports=opsets).SerializeToString())


def _compare(env: ortgpu.Env, model: bytes, feeds: dict[str, np.ndarray]) -> None:
    (expected,) = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    with ortgpu.InferenceSession(model, env=env) as session:
        (got,) = session.run(None, feeds)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(("dtype", "onnx_type"), [(np.float32, TensorProto.FLOAT)])
@pytest.mark.parametrize("threshold", [0.0, 0.5, -1.0])
def test_binarizer(env: ortgpu.Env, dtype: Any, onnx_type: int, threshold: float) -> None:
    x = (np.random.default_rng(1).standard_normal((3, 5)) * 2).astype(dtype)
    _compare(env, _model("Binarizer", [("X", onnx_type, [3, 5])], threshold=threshold), {"X": x})


def test_binarizer_on_integers(env: ortgpu.Env) -> None:
    """The spec allows int32/int64, which onnxruntime's CPU provider has no kernel for: numpy is the reference."""
    x = np.arange(-4, 5, dtype=np.int64).reshape(3, 3)
    with ortgpu.InferenceSession(_model("Binarizer", [("X", TensorProto.INT64, [3, 3])], threshold=1.5), env=env) as s:
        (got,) = s.run(None, {"X": x})
    np.testing.assert_array_equal(got, (x > 1.5).astype(np.int64))
    assert got.dtype == np.int64


@pytest.mark.parametrize("shape", [(7,), (2, 7), (2, 3, 7)])
def test_array_feature_extractor(env: ortgpu.Env, shape: tuple[int, ...]) -> None:
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    columns = np.array([4, 0, 6, 4], dtype=np.int64)
    model = _model("ArrayFeatureExtractor", [("X", TensorProto.FLOAT, list(shape)), ("C", TensorProto.INT64, [4])])
    _compare(env, model, {"X": x, "C": columns})


def test_array_feature_extractor_refuses_columns_out_of_range(env: ortgpu.Env) -> None:
    model = _model("ArrayFeatureExtractor", [("X", TensorProto.FLOAT, [2, 3]), ("C", TensorProto.INT64, [1])])
    x = np.zeros((2, 3), np.float32)
    with pytest.raises((ModelError, OrtGpuError), match="column indices"):
        with ortgpu.InferenceSession(model, env=env) as session:
            session.run(None, {"X": x, "C": np.array([3], dtype=np.int64)})
