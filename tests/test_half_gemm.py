"""float16 MatMul and Gemm on the device: f16 storage, products and sums in f32, one rounding at the end.

Every kernel of the GEMM family is reached (the tiled GEMM, its split-K variant and reduction, the legacy kernel,
the GEMV in both layouts with and without split-K, the strided GEMM of folded transposes) with its fused epilogue,
on both backends, against onnxruntime CPU running the same float16 model; and a device without ``shader-f16`` runs
them on the CPU and says why.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

import ortgpu
from ortgpu._planner import plan_model
from ortgpu.loader._model import load_model
from ortgpu.ops import DeviceCaps, _gemm
from ortgpu.ops._gemm import LEGACY, GemmConfig
from ortgpu_core.backends.fake import DEFAULT_FAKE_LIMITS, FakeBackend, FakeDeviceSpec

F16 = TensorProto.FLOAT16


def _model(nodes: list[Any], inputs: dict[str, tuple[int, ...]], output: str = "y") -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "half",
        [helper.make_tensor_value_info(name, F16, shape) for name, shape in inputs.items()],
        [helper.make_tensor_value_info(output, F16, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def matmul_relu(a: tuple[int, ...], b: tuple[int, ...], bias: bool = False) -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["a", "b"], ["p"])]
    inputs = {"a": a, "b": b}
    last = "p"
    if bias:
        inputs["bias"] = (b[-1],)
        nodes.append(helper.make_node("Add", ["p", "bias"], ["q"]))
        last = "q"
    nodes.append(helper.make_node("Relu", [last], ["y"]))
    return _model(nodes, inputs)


def gemm(m: int, k: int, n: int, trans_b: bool) -> onnx.ModelProto:
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transB=int(trans_b), alpha=0.5, beta=2.0)
    return _model([node], {"a": (m, k), "b": (n, k) if trans_b else (k, n), "c": (n,)})


def transposed(a: tuple[int, ...], b_source: tuple[int, ...]) -> onnx.ModelProto:
    """MatMul(a, Transpose(b)): the planner folds the Transpose into the GEMM's strided loads."""
    nodes = [
        helper.make_node("Transpose", ["b"], ["bt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["a", "bt"], ["y"]),
    ]
    return _model(nodes, {"a": a, "b": b_source})


def _feeds(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        value.name: rng.standard_normal([d.dim_value for d in value.type.tensor_type.shape.dim]).astype(np.float16)
        for value in model.graph.input
    }


def _check(env: ortgpu.Env, model: onnx.ModelProto, seed: int = 0) -> list[Any]:
    """The session's float16 outputs match onnxruntime CPU's within float16's precision, every node on the device;
    returns the placement."""
    feeds = _feeds(model, seed)
    expected = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
        placement = session.get_node_placement({name: value.shape for name, value in feeds.items()})
        got = session.run(None, feeds)
    assert [p.placement for p in placement] == ["webgpu"] * len(placement), [p.reason for p in placement]
    for actual, want in zip(got, expected):
        assert actual.dtype == np.float16 and actual.shape == want.shape
        scale = float(np.abs(want.astype(np.float32)).max())
        error = float(np.abs(actual.astype(np.float32) - want.astype(np.float32)).max())
        assert error <= 2e-3 * scale  # a couple of float16 rounding steps of the largest output
    return placement


@pytest.mark.parametrize(
    "a, b",
    [
        ((64, 96), (96, 80)),  # tiled, vec4 loads
        ((3, 37, 51), (51, 33)),  # tiled, scalar loads, batch rows merged
        ((2, 3, 20, 16), (3, 16, 24)),  # batched with a broadcast batch axis
        ((1, 512), (512, 256)),  # GEMV [K, N], vec4
        ((1, 510), (510, 254)),  # GEMV [K, N], scalar
        ((16, 2048), (2048, 16)),  # small output, long K: split-K and its reduction
    ],
)
def test_matmul(env: ortgpu.Env, a: tuple[int, ...], b: tuple[int, ...]) -> None:
    _check(env, matmul_relu(a, b))


def test_matmul_bias_relu_fuse_into_one_step(env: ortgpu.Env) -> None:
    model = matmul_relu((40, 64), (64, 48), bias=True)
    _check(env, model)
    feeds = _feeds(model, 1)
    plan = plan_model(
        load_model(model),
        {n: v.shape for n, v in feeds.items()},
        DeviceCaps(frozenset({"shader-f16"}), DEFAULT_FAKE_LIMITS),
        input_dtypes={n: v.dtype for n, v in feeds.items()},
    )
    assert len(plan.steps) == 1  # MatMul + Add + Relu: one kernel, its epilogue in f32


@pytest.mark.parametrize("m, k, n, trans_b", [(1, 300, 64, True), (48, 300, 72, True), (33, 20, 17, False)])
def test_gemm_alpha_beta_bias(env: ortgpu.Env, m: int, k: int, n: int, trans_b: bool) -> None:
    _check(env, gemm(m, k, n, trans_b))


def test_folded_transpose(env: ortgpu.Env) -> None:
    _check(env, transposed((2, 24, 32), (2, 40, 32)))


@pytest.mark.parametrize(
    "config",
    [
        LEGACY,
        GemmConfig(tile_m=32, tile_n=64, tile_k=16, rows=4, cols=4, stages=2, split_k=3),
        # f16 arithmetic on k-pairs: each K tile's products summed in f16 pairs, then in f32
        GemmConfig(tile_m=64, tile_n=64, tile_k=16, rows=4, cols=4, stages=2, split_k=1, half=True),
        GemmConfig(tile_m=128, tile_n=128, tile_k=16, rows=8, cols=8, stages=1, split_k=2, half=True),
        _gemm.GEMM_BIG_TILE,
    ],
    ids=lambda c: c.label,
)
def test_every_tiled_variant(env: ortgpu.Env, config: GemmConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_gemm, "GEMM_OVERRIDE", config)
    _check(env, matmul_relu((70, 200), (200, 36)))


def test_a_device_without_shader_f16_runs_them_on_the_cpu() -> None:
    env = ortgpu.Env(backend=FakeBackend([FakeDeviceSpec(features=frozenset())]))
    try:
        model = matmul_relu((8, 16), (16, 8))
        feeds = _feeds(model, 2)
        with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
            placement = session.get_node_placement({n: v.shape for n, v in feeds.items()})
            matmul = next(p for p in placement if p.op_type == "MatMul")
            assert matmul.placement == "cpu" and "shader-f16" in matmul.reason
            got = session.run(None, feeds)[0]
        want = np.maximum(np.matmul(feeds["a"].astype(np.float32), feeds["b"].astype(np.float32)), 0)
        np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-3, atol=2e-3)
    finally:
        env.close()


HALF_CONFIGS = [
    GemmConfig(tile_m=64, tile_n=64, tile_k=16, rows=4, cols=4, stages=2, split_k=1, half=True),
    GemmConfig(tile_m=32, tile_n=64, tile_k=32, rows=4, cols=8, stages=1, split_k=3, half=True),
]


def gemm_transposed(m: int, k: int, n: int, trans_a: bool, trans_b: bool) -> onnx.ModelProto:
    node = helper.make_node("Gemm", ["a", "b"], ["y"], transA=int(trans_a), transB=int(trans_b))
    return _model([node], {"a": (k, m) if trans_a else (m, k), "b": (n, k) if trans_b else (k, n)})


@pytest.mark.parametrize("config", HALF_CONFIGS, ids=lambda c: c.label)
@pytest.mark.parametrize(
    "build",
    [
        lambda: matmul_relu((70, 200), (200, 36)),  # A along k, B along n: vec4 loads both
        lambda: matmul_relu((33, 37), (37, 19)),  # odd K and N: scalar loads both, a lone last k of the pairs
        lambda: gemm_transposed(40, 24, 36, trans_a=True, trans_b=True),  # A along m, B along k
        lambda: gemm_transposed(20, 13, 11, trans_a=True, trans_b=False),  # A along m, odd K
        lambda: transposed((2, 24, 32), (2, 40, 32)),  # a folded Transpose: B's strided loads
    ],
    ids=["k4-n4", "scalar-scalar", "m4-k4", "m4-odd", "folded"],
)
def test_f16_arithmetic_in_every_operand_layout(
    env: ortgpu.Env, config: GemmConfig, build: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_gemm, "GEMM_OVERRIDE", config)
    monkeypatch.setattr(_gemm, "GEMM_HALF_MATH", True)
    _check(env, build())
