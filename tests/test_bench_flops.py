"""bench/flops.py against hand-counted FLOPs, the compute-bound chain models (matmul-M-K, conv-C-S) on both
backends, and the FLOP/s reporting of ``python -m bench``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortgpu
from bench.__main__ import build_model, main
from bench.flops import model_flops
from bench.models import conv_chain, matmul_chain, random_feeds, transformer_encoder


def _model(
    nodes: list[onnx.NodeProto], inputs: dict[str, list[int | str]], initializers: dict[str, tuple[int, ...]]
) -> onnx.ModelProto:
    """One graph: float inputs of the given dims, float initializers of the given shapes, output ``Y`` (rank unknown)."""
    graph = helper.make_graph(
        nodes,
        "flops",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, dims) for name, dims in inputs.items()],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.zeros(shape, np.float32), name) for name, shape in initializers.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_matmul_with_broadcast_batch_dims() -> None:
    # [2, 1, 3, 4] @ [5, 4, 6]: batch dims broadcast to [2, 5], each a 3x4 by 4x6 product.
    model = _model([helper.make_node("MatMul", ["A", "B"], ["Y"])], {"A": ["n", 1, 3, 4]}, {"B": (5, 4, 6)})
    assert model_flops(model, {"A": (2, 1, 3, 4)}) == 2 * (2 * 5) * 3 * 4 * 6
    # The input's symbolic dim is what shapes fixes: another batch, another count.
    assert model_flops(model, {"A": (7, 1, 3, 4)}) == 2 * (7 * 5) * 3 * 4 * 6


def test_matmul_with_vector_operands() -> None:
    vector_left = _model([helper.make_node("MatMul", ["A", "B"], ["Y"])], {"A": [4]}, {"B": (3, 4, 6)})
    assert model_flops(vector_left, {}) == 2 * 3 * 4 * 6
    vector_right = _model([helper.make_node("MatMul", ["A", "B"], ["Y"])], {"A": [2, 3, 4]}, {"B": (4,)})
    assert model_flops(vector_right, {}) == 2 * 2 * 3 * 4


def test_gemm_honours_transposes() -> None:
    # A is [K, M] = [4, 3] (transA), B is [N, K] = [5, 4] (transB): M=3, K=4, N=5; the bias is not counted.
    node = helper.make_node("Gemm", ["A", "B", "C"], ["Y"], transA=1, transB=1, alpha=2.0)
    model = _model([node], {"A": [4, 3]}, {"B": (5, 4), "C": (5,)})
    assert model_flops(model, {"A": (4, 3)}) == 2 * 3 * 4 * 5
    plain = _model([helper.make_node("Gemm", ["A", "B"], ["Y"])], {"A": ["m", 4]}, {"B": (4, 5)})
    assert model_flops(plain, {"A": (10, 4)}) == 2 * 10 * 4 * 5


def test_conv_with_groups_and_stride() -> None:
    # X [2, 8, 10, 10], W [6, 8/2, 3, 3], group 2, stride 2, pad 1 -> Y [2, 6, 5, 5];
    # each output element is a dot product of 4 input channels x 3 x 3 taps.
    node = helper.make_node(
        "Conv", ["X", "W", "B"], ["Y"], group=2, strides=[2, 2], pads=[1, 1, 1, 1], kernel_shape=[3, 3]
    )
    model = _model([node], {"X": ["n", 8, 10, 10]}, {"W": (6, 4, 3, 3), "B": (6,)})
    assert model_flops(model, {"X": (2, 8, 10, 10)}) == 2 * (2 * 6 * 5 * 5) * (4 * 3 * 3)
    # Depthwise with dilation 2, no pads: [1, 8, 9, 9] -> [1, 8, 5, 5], one channel x 3 x 3 taps each.
    depthwise = helper.make_node("Conv", ["X", "W"], ["Y"], group=8, dilations=[2, 2])
    model = _model([depthwise], {"X": [1, 8, 9, 9]}, {"W": (8, 1, 3, 3)})
    assert model_flops(model, {}) == 2 * (8 * 5 * 5) * 9


def test_conv_transpose() -> None:
    # Every input element meets M/group x k x k weights: X [1, 4, 5, 5], W [4, 3, 2, 2] -> 100 x 12.
    node = helper.make_node("ConvTranspose", ["X", "W"], ["Y"], strides=[2, 2])
    model = _model([node], {"X": ["n", 4, 5, 5]}, {"W": (4, 3, 2, 2)})
    assert model_flops(model, {"X": (1, 4, 5, 5)}) == 2 * 100 * 12
    grouped = helper.make_node("ConvTranspose", ["X", "W"], ["Y"], group=2, strides=[1, 1], pads=[1, 1, 1, 1])
    model = _model([grouped], {"X": [3, 4, 5, 5]}, {"W": (4, 2, 3, 3)})
    assert model_flops(model, {}) == 2 * (3 * 4 * 5 * 5) * (2 * 3 * 3)


def test_unknown_shapes_count_zero_and_other_ops_are_not_counted() -> None:
    nodes = [helper.make_node("MatMul", ["X", "W"], ["H"]), helper.make_node("Relu", ["H"], ["Y"])]
    model = _model(nodes, {"X": ["n", 4]}, {"W": (4, 4)})
    assert model_flops(model, {}) == 0.0  # n unknown: the MatMul is skipped
    assert model_flops(model, {"X": (3, 4)}) == 2 * 3 * 4 * 4  # the Relu adds nothing


def test_shapes_computed_at_run_time_are_followed() -> None:
    # Y = Reshape(X, concat(shape(X)[0], 3, 4)) @ W: the reshape target comes from Shape, which onnx's
    # inference alone does not fold.
    nodes = [
        helper.make_node("Shape", ["X"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Concat", ["n", "tail"], ["target"], axis=0),
        helper.make_node("Reshape", ["X", "target"], ["R"]),
        helper.make_node("MatMul", ["R", "W"], ["Y"]),
    ]
    model = _model(nodes, {"X": ["n", 12]}, {"W": (4, 5)})
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([0], np.int64), "zero"),
            numpy_helper.from_array(np.array([3, 4], np.int64), "tail"),
        ]
    )
    before = model.SerializeToString()
    assert model_flops(model, {"X": (6, 12)}) == 2 * 6 * 3 * 4 * 5
    assert model.SerializeToString() == before  # the folding and the fixed dims live on a copy


def test_encoder_counts_every_matmul() -> None:
    batch, seq, d_model, heads, ffn = 2, 8, 32, 4, 64
    model = transformer_encoder(batch=batch, seq=seq, vocab=50, d_model=d_model, heads=heads, ffn=ffn)
    tokens = batch * seq
    projections = 4 * tokens * d_model * d_model + 2 * tokens * d_model * ffn
    attention = 2 * batch * heads * seq * seq * (d_model // heads)  # Q K^T and P V
    assert model_flops(model, {"ids": (batch, seq)}) == 2 * (projections + attention)


def test_chain_models_count() -> None:
    assert model_flops(matmul_chain(k=64), {"X": (8, 64)}) == 8 * 2 * 8 * 64 * 64
    assert model_flops(conv_chain(channels=4, size=8), {"X": (2, 4, 8, 8)}) == 8 * 2 * (2 * 4 * 8 * 8) * (4 * 9)


def _relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.linalg.norm(actual - expected) / max(float(np.linalg.norm(expected)), 1e-30))


@pytest.mark.parametrize("name", ["matmul-8-64", "conv-4-8"])
def test_chain_models_run_on_ortgpu(env: ortgpu.Env, name: str) -> None:
    model, shapes = build_model(name, 2 if name.startswith("conv") else 1)
    assert shapes == ({"X": (8, 64)} if name.startswith("matmul") else {"X": (2, 4, 8, 8)})
    feeds = random_feeds(model, shapes)
    expected = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    if name.startswith("matmul"):
        x = feeds["X"].astype(np.float64)
        for weight in model.graph.initializer:
            x = x @ numpy_helper.to_array(weight).astype(np.float64)
        assert _relative_error(expected[0].astype(np.float64), x) < 1e-5
        assert 0.1 < float(np.abs(x).max()) < 100  # the 1/sqrt(K) scaling keeps the chain bounded
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
        (actual,) = session.run(None, feeds)
    assert actual.shape == expected[0].shape
    assert _relative_error(actual, expected[0]) < 1e-4


def test_bench_reports_flops(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "report.json"
    argv = ["--backend", "fake", "--model", "matmul-8-64", "--iterations", "3", "--warmup", "1", "--json", str(path)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "GFLOP per run" in printed and "TFLOP/s" in printed
    report = json.loads(path.read_text())
    assert report["flops_per_run"] == 8 * 2 * 8 * 64 * 64
    assert report["model"]["inputs"] == {"X": [8, 64]} and report["model"]["batch"] == 8
    assert report["results"]
    for entry in report["results"].values():
        assert entry["tflops_p50"] == pytest.approx(report["flops_per_run"] / (entry["p50_ms"] * 1e-3) / 1e12)
        assert {"p50_ms", "p90_ms", "p99_ms", "iterations", "raw_s"} <= set(entry)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "matmul-64"], "matmul-M-K"),
        (["--model", "conv-0-8"], "conv-C-S"),
        (["--model", "matmul-8-64-2"], "matmul-M-K"),
        (["--model", "no-such-model.onnx"], "path to an .onnx file"),
        (["--model", "matmul-8-64", "--batch", "4"], "M = 8"),
    ],
)
def test_bad_model_names_exit_with_a_message(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--backend", "fake", *argv])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
    with pytest.raises(ValueError, match="matmul-M-K|M = 8"):
        build_model(argv[1], int(argv[3]) if len(argv) > 2 else 1)
