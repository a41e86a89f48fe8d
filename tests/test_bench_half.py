"""``bench/half.py`` (the float16 conversion of the bench's models) and ``python -m bench --dtype float16``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import bench.__main__ as bench_main
from bench.half import float16_accuracy, half_feeds, to_float16


def _resize_model() -> onnx.ModelProto:
    """X -> Mul by a weight -> Cast(to float) -> Resize by float32 scales -> Add a Constant -> If (a subgraph with a
    float32 constant) -> Y."""
    then = helper.make_graph(
        [helper.make_node("Constant", [], ["t"], value=numpy_helper.from_array(np.full(1, 2.0, np.float32)))],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1])],
    )
    other = helper.make_graph(
        [helper.make_node("Constant", [], ["e"], value=numpy_helper.from_array(np.full(1, 3.0, np.float32)))],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1])],
    )
    nodes = [
        helper.make_node("Mul", ["X", "w"], ["m"]),
        helper.make_node("Cast", ["m"], ["c"], to=TensorProto.FLOAT),
        helper.make_node("Resize", ["c", "", "scales"], ["r"], mode="nearest"),
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.full(1, 1e6, np.float32))),
        helper.make_node("Add", ["r", "k"], ["a"]),
        helper.make_node("If", ["flag"], ["s"], then_branch=then, else_branch=other),
        helper.make_node("Mul", ["a", "s"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "half",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 1, 2, 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 1, 4, 4])],
        [
            numpy_helper.from_array(np.full((1, 1, 2, 2), 0.5, np.float32), "w"),
            numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
            numpy_helper.from_array(np.array(True), "flag"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_to_float16_converts_every_float_tensor_but_the_float32_only_inputs() -> None:
    model = _resize_model()
    before = model.SerializeToString()
    half = to_float16(model)
    assert model.SerializeToString() == before  # the float32 model is left as it was
    onnx.checker.check_model(half, full_check=True)
    types = {tensor.name: tensor.data_type for tensor in half.graph.initializer}
    assert types == {"w": TensorProto.FLOAT16, "scales": TensorProto.FLOAT, "flag": TensorProto.BOOL}
    assert half.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    assert half.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    cast = next(node for node in half.graph.node if node.op_type == "Cast")
    assert helper.get_attribute_value(cast.attribute[0]) == TensorProto.FLOAT16
    constant = next(node for node in half.graph.node if node.op_type == "Constant")
    value = helper.get_attribute_value(constant.attribute[0])
    assert value.data_type == TensorProto.FLOAT16
    assert numpy_helper.to_array(value)[0] == np.finfo(np.float16).max  # saturated, not infinite
    branch = helper.get_attribute_value(next(n for n in half.graph.node if n.op_type == "If").attribute[0])
    assert helper.get_attribute_value(branch.node[0].attribute[0]).data_type == TensorProto.FLOAT16
    assert branch.output[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    x = np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)
    (y,) = onnxruntime.InferenceSession(half.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, half_feeds({"X": x})
    )
    assert y.dtype == np.float16 and y.shape == (1, 1, 4, 4)


def test_half_feeds_rounds_only_float32() -> None:
    feeds = half_feeds({"x": np.array([1.0 / 3.0], np.float32), "ids": np.array([7], np.int64)})
    assert feeds["x"].dtype == np.float16 and feeds["x"][0] == np.float16(1.0 / 3.0)
    assert feeds["ids"].dtype == np.int64


def test_float16_accuracy_measures_against_both_references() -> None:
    model = bench_main.build_model("matmul-4-16", 1)[0]
    half = to_float16(model)
    feeds = half_feeds({"X": np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)})
    session = onnxruntime.InferenceSession(half.SerializeToString(), providers=["CPUExecutionProvider"])
    outputs = session.run(None, feeds)
    accuracy = float16_accuracy(model, half, feeds, outputs)
    assert accuracy["vs_fp16_cpu"] == 0.0  # the same session's outputs
    assert 0.0 < accuracy["vs_fp32_cpu"] < 1e-2
    wrong = [outputs[0] * np.float16(1.1)]
    assert float16_accuracy(model, half, feeds, wrong)["vs_fp32_cpu"] == pytest.approx(0.1, rel=0.05)


def test_bench_dtype_float16_reports_the_error(backend_name: str, tmp_path: Path) -> None:
    path = tmp_path / "half.json"
    argv = ["--model", "matmul-8-64", "--dtype", "float16", "--capture", "on", "--iterations", "2", "--warmup", "1"]
    assert bench_main.main([*argv, "--backend", backend_name, "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    assert report["dtype"] == "float16"
    assert 0.0 < report["float16_accuracy"]["vs_fp32_cpu"] < 1e-2
    assert report["float16_accuracy"]["vs_fp16_cpu"] < 1e-2
