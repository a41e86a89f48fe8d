"""ai.onnx.ml transforms (Binarizer, ArrayFeatureExtractor) through sessions on both backends, against onnxruntime."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

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


def _random_forest(rng: np.random.Generator, features: int, targets: int, trees: int, depth: int) -> dict[str, Any]:
    """Attributes of a random ensemble of full binary trees (every mode, NaN routing, set membership)."""
    nodes: dict[str, list[Any]] = {k: [] for k in ("feat", "mode", "split", "t", "f", "tl", "fl", "miss")}
    leaves_target: list[int] = []
    leaves_weight: list[float] = []
    members: list[float] = []
    roots = []

    def grow(level: int) -> tuple[int, int]:
        """(index, is_leaf) of a new subtree."""
        if level == depth:
            leaves_target.append(int(rng.integers(0, targets)))
            leaves_weight.append(float(rng.standard_normal()))
            return len(leaves_target) - 1, 1
        index = len(nodes["feat"])
        for key in nodes:
            nodes[key].append(0)
        mode = int(rng.integers(0, 7))
        nodes["feat"][index] = int(rng.integers(0, features))
        nodes["mode"][index] = mode
        nodes["split"][index] = float(np.round(rng.standard_normal(), 1))
        nodes["miss"][index] = int(rng.integers(0, 2))
        if mode == 6:
            members.extend([float(v) for v in np.round(rng.standard_normal(3) * 2)] + [float("nan")])  # integers
        nodes["t"][index], nodes["tl"][index] = grow(level + 1)
        nodes["f"][index], nodes["fl"][index] = grow(level + 1)
        return index, 0

    for _ in range(trees):
        roots.append(grow(0)[0])
    attrs: dict[str, Any] = {
        "n_targets": targets,
        "tree_roots": roots,
        "nodes_featureids": nodes["feat"],
        "nodes_modes": numpy_helper.from_array(np.array(nodes["mode"], np.uint8), "modes"),
        "nodes_splits": numpy_helper.from_array(np.array(nodes["split"], np.float32), "splits"),
        "nodes_truenodeids": nodes["t"],
        "nodes_falsenodeids": nodes["f"],
        "nodes_trueleafs": nodes["tl"],
        "nodes_falseleafs": nodes["fl"],
        "nodes_missing_value_tracks_true": nodes["miss"],
        "leaf_targetids": leaves_target,
        "leaf_weights": numpy_helper.from_array(np.array(leaves_weight, np.float32), "weights"),
    }
    if members:
        attrs["membership_values"] = numpy_helper.from_array(np.array(members, np.float32), "members")
    return attrs


@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_tree_ensemble_matches_onnxruntime(env: ortgpu.Env, aggregate: int, seed: int) -> None:
    """Random trees with every branch mode, NaN routing and integer membership sets (onnxruntime's limit)."""
    transform = 0
    rng = np.random.default_rng([aggregate, seed])
    attrs = _random_forest(rng, features=4, targets=3, trees=3, depth=3)
    node = helper.make_node(
        "TreeEnsemble",
        ["X"],
        ["Y"],
        domain="ai.onnx.ml",
        aggregate_function=aggregate,
        post_transform=transform,
        **attrs,
    )
    graph = helper.make_graph(
        [node],
        "forest",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [16, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("ai.onnx.ml", 5)]
    model = bytes(helper.make_model(graph, opset_imports=opsets).SerializeToString())
    x = np.round(rng.standard_normal((16, 4)) * 2).astype(np.float32)  # integers: membership is defined
    x[rng.random((16, 4)) < 0.1] = np.nan
    (expected,) = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"X": x})
    with ortgpu.InferenceSession(model, env=env) as session:
        (got,) = session.run(None, {"X": x})
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("transform", [1, 2, 3, 4])
def test_tree_ensemble_refuses_post_transforms_onnxruntime_numbers_differently(env: ortgpu.Env, transform: int) -> None:
    attrs = _random_forest(np.random.default_rng(3), features=2, targets=2, trees=1, depth=1)
    node = helper.make_node("TreeEnsemble", ["X"], ["Y"], domain="ai.onnx.ml", post_transform=transform, **attrs)
    graph = helper.make_graph(
        [node],
        "forest",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("ai.onnx.ml", 5)]
    model = bytes(helper.make_model(graph, opset_imports=opsets).SerializeToString())
    with pytest.raises((ModelError, OrtGpuError), match="post_transform"):
        with ortgpu.InferenceSession(model, env=env) as session:
            session.run(None, {"X": np.zeros((1, 2), np.float32)})
