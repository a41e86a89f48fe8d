"""float16 convolution and pooling on the device: f16 storage, loads widened to f32, sums in f32, one rounding at
the store.

Every kernel variant is reached on both backends against onnxruntime CPU running the same float16 model: Conv's
direct kernel (depthwise, narrow groups) and its implicit GEMM (scalar and vec4 loads, grouped, 1-D, split-K and
its reduction, the legacy tile) with the bias and a fused epilogue, BatchNormalization folded into a float16 Conv,
ConvTranspose, CausalConvWithState, MaxPool (with and without Indices), AveragePool (count_include_pad both ways),
the global pools (the float16 row reduction and GlobalMaxPool's window kernel), LpPool, GlobalLpPool and LRN; a
device without ``shader-f16`` runs them on the CPU and says why.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortgpu
from ortgpu._planner import plan_model
from ortgpu.loader._model import load_model
from ortgpu.ops import DeviceCaps, _gemm
from ortgpu.ops._gemm import LEGACY, GemmConfig
from ortgpu_core.backends.fake import DEFAULT_FAKE_LIMITS, FakeBackend, FakeDeviceSpec

F16 = TensorProto.FLOAT16
CAPS = DeviceCaps(frozenset({"shader-f16"}), DEFAULT_FAKE_LIMITS)


def _model(
    nodes: list[Any],
    inputs: dict[str, tuple[int, ...]],
    outputs: tuple[str, ...] = ("y",),
    opset: int = 19,
    initializers: tuple[onnx.TensorProto, ...] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "half",
        [helper.make_tensor_value_info(name, F16, shape) for name, shape in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.INT64 if o == "indices" else F16, None) for o in outputs],
        initializer=list(initializers),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _op(
    op_type: str, inputs: dict[str, tuple[int, ...]], opset: int = 19, outputs: int = 1, **attrs: Any
) -> onnx.ModelProto:
    names = ("y", "indices") if op_type == "MaxPool" else ("y", "state")
    node = helper.make_node(op_type, list(inputs), list(names[:outputs]), **attrs)
    return _model([node], inputs, names[:outputs], opset)


def _conv(x: tuple[int, ...], w: tuple[int, ...], bias: bool = True, **attrs: Any) -> onnx.ModelProto:
    inputs = {"x": x, "w": w, **({"b": (w[0],)} if bias else {})}
    return _op("Conv", inputs, **attrs)


def _conv_add_relu(x: tuple[int, ...], w: tuple[int, ...], out: tuple[int, ...], **attrs: Any) -> onnx.ModelProto:
    """Conv + bias, then a residual Add and Relu: both ride on the Conv as its fused epilogue."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs),
        helper.make_node("Add", ["c", "r"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    return _model(nodes, {"x": x, "w": w, "b": (w[0],), "r": out})


def _feeds(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        value.name: rng.standard_normal([d.dim_value for d in value.type.tensor_type.shape.dim]).astype(np.float16)
        for value in model.graph.input
    }


def _kernels(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[list[str]]:
    """The WGSL of each planned step's kernels on a fake device with shader-f16 (which variant the planner chose)."""
    plan = plan_model(
        load_model(model),
        {n: v.shape for n, v in feeds.items()},
        CAPS,
        input_dtypes={n: v.dtype for n, v in feeds.items()},
    )
    return [[k.wgsl for k in step.op_plan.kernels] if step.op_plan is not None else [] for step in plan.steps]


def _check(env: ortgpu.Env, model: onnx.ModelProto, seed: int = 0) -> list[list[str]]:
    """The session's float16 outputs match onnxruntime CPU's within float16's precision (integer outputs exactly),
    every node on the device in float16 kernels; returns the WGSL of each step's kernels (fake device's plan)."""
    feeds = _feeds(model, seed)
    expected = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
        placement = session.get_node_placement({name: value.shape for name, value in feeds.items()})
        got = session.run(None, feeds)
    assert [p.placement for p in placement] == ["webgpu"] * len(placement), [p.reason for p in placement]
    for actual, want in zip(got, expected):
        assert actual.dtype == want.dtype and actual.shape == want.shape
        if want.dtype != np.float16:
            np.testing.assert_array_equal(actual, want)
            continue
        scale = float(np.abs(want.astype(np.float32)).max())
        error = float(np.abs(actual.astype(np.float32) - want.astype(np.float32)).max())
        assert error <= 2e-3 * scale  # a couple of float16 rounding steps of the largest output
    kernels = _kernels(model, feeds)
    for step in kernels:
        for wgsl in step:
            assert wgsl.startswith("enable f16;\n") and ("array<f16>" in wgsl or "array<vec4<f16>>" in wgsl)
    return kernels


# -- Conv ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model",
    [
        _conv((2, 8, 9, 9), (8, 1, 3, 3), group=8, pads=[1, 1, 1, 1], strides=[2, 1]),  # depthwise
        _conv((1, 6, 7, 8), (4, 3, 3, 2), group=2, strides=[1, 2], auto_pad="SAME_UPPER"),  # narrow groups
        _conv((2, 5, 11), (6, 5, 3), bias=False, pads=[2, 0], dilations=[2]),  # 1-D
    ],
    ids=["depthwise", "narrow-groups", "1d"],
)
def test_conv_direct(env: ortgpu.Env, model: onnx.ModelProto) -> None:
    (kernels,) = _check(env, model)
    assert len(kernels) == 1 and "var<workgroup>" not in kernels[0]  # the direct kernel, no GEMM tiles


def test_conv_direct_with_fused_epilogue(env: ortgpu.Env) -> None:
    (kernels,) = _check(env, _conv_add_relu((1, 4, 6, 6), (4, 1, 3, 3), (1, 4, 6, 6), group=4, pads=[1, 1, 1, 1]))
    assert len(kernels) == 1 and "var<workgroup>" not in kernels[0]


@pytest.mark.parametrize(
    "model, vectors",
    [
        (_conv((1, 3, 12, 12), (16, 3, 3, 3), pads=[1, 1, 1, 1]), ()),  # K = 27: scalar loads
        (_conv((2, 8, 10, 9), (24, 8, 3, 3), strides=[2, 2]), ("input_1",)),  # K = 72: vec4 weight loads
        (_conv((1, 16, 8, 8), (32, 16, 1, 1)), ("input_0", "input_1")),  # pointwise: vec4 image loads too
        (_conv((1, 16, 6, 6), (32, 8, 3, 3), bias=False, group=2, dilations=[1, 2]), ("input_1",)),  # grouped
        (_conv((2, 13, 30), (16, 13, 5), auto_pad="SAME_LOWER"), ()),  # 1-D, K = 65
    ],
    ids=["scalar", "vec4-weights", "pointwise", "grouped", "1d"],
)
def test_conv_implicit_gemm(env: ortgpu.Env, model: onnx.ModelProto, vectors: tuple[str, ...]) -> None:
    (kernels,) = _check(env, model)
    assert len(kernels) == 1 and "var<workgroup>" in kernels[0]  # the tiled GEMM
    for name in ("input_0", "input_1"):  # vec4<f16> loads where the operand allows them, scalar f16 elsewhere
        assert (f"{name}_vec4f16: array<vec4<f16>>" in kernels[0]) == (name in vectors), name


def test_conv_implicit_gemm_with_fused_epilogue(env: ortgpu.Env) -> None:
    kernels = _check(env, _conv_add_relu((1, 8, 8, 8), (16, 8, 3, 3), (1, 16, 8, 8), pads=[1, 1, 1, 1]))
    assert len(kernels) == 1 and "var<workgroup>" in kernels[0][0]  # Conv + Add + Relu: one kernel


def test_conv_split_k(env: ortgpu.Env) -> None:
    """A small output over a long K (2304): partial sums in f32 scratch, then the reduction adds the bias and
    stores f16."""
    (kernels,) = _check(env, _conv((1, 256, 4, 4), (8, 256, 3, 3), pads=[1, 1, 1, 1]))
    assert len(kernels) == 2
    assert re.search(r"scratch_0\w*: array<(vec4<)?f32>?>", kernels[0])  # the partial sums stay f32
    assert "var<storage, read_write> output_0_f16: array<f16>" in kernels[1]


@pytest.mark.parametrize(
    "config",
    [LEGACY, GemmConfig(tile_m=32, tile_n=64, tile_k=16, rows=4, cols=4, stages=2, split_k=3)],
    ids=lambda c: c.label,
)
def test_conv_every_tiled_variant(env: ortgpu.Env, config: GemmConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_gemm, "GEMM_OVERRIDE", config)
    (kernels,) = _check(env, _conv((1, 12, 9, 9), (20, 12, 3, 3), pads=[1, 1, 1, 1]))
    assert len(kernels) == (2 if config.split_k > 1 else 1)


def test_conv_3d_runs_on_the_cpu_in_float32() -> None:
    """No device kernel covers 3-D convolutions (float32 neither); the CPU reference sums float16 in float32."""
    env = ortgpu.Env(backend=FakeBackend([FakeDeviceSpec()]))
    try:
        model = _conv((1, 4, 5, 5, 5), (6, 4, 3, 3, 3))
        feeds = _feeds(model, 3)
        want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, feeds
        )[0]
        with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
            (placement,) = session.get_node_placement({n: v.shape for n, v in feeds.items()})
            got = session.run(None, feeds)[0]
        assert placement.placement == "cpu" and "1-D and 2-D" in placement.reason
        assert got.dtype == np.float16
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=0, atol=2e-3 * abs(want).max())
    finally:
        env.close()


def _conv_batch_norm(param_type: Any) -> onnx.ModelProto:
    rng = np.random.default_rng(5)
    channels = 16

    def constant(name: str, value: np.ndarray) -> onnx.TensorProto:
        return numpy_helper.from_array(value, name)

    params = {
        "s": rng.uniform(0.5, 1.5, channels),
        "bb": rng.standard_normal(channels),
        "m": rng.standard_normal(channels) * 0.1,
        "v": rng.uniform(0.5, 2.0, channels),
    }
    initializers = (
        constant("w", (rng.standard_normal((channels, 8, 3, 3)) * 0.2).astype(np.float16)),
        constant("b", rng.standard_normal(channels).astype(np.float16)),
        *(constant(name, value.astype(param_type)) for name, value in params.items()),
    )
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["y"], epsilon=1e-3),
    ]
    return _model(nodes, {"x": (1, 8, 6, 6)}, initializers=initializers, opset=15)


@pytest.mark.parametrize("param_type", [np.float16, np.float32], ids=["float16-params", "float32-params"])
def test_batch_norm_folds_into_a_float16_conv(env: ortgpu.Env, param_type: Any) -> None:
    model = _conv_batch_norm(param_type)
    feeds = _feeds(model, 4)
    plan = plan_model(load_model(model), {"x": feeds["x"].shape}, CAPS, input_dtypes={"x": np.dtype(np.float16)})
    assert [step.op_types for step in plan.steps] == [("Conv",)]
    weights = [plan.constants[name] for name in plan.steps[0].inputs[1:]]
    assert [w.dtype for w in weights] == [np.float16, np.float16]  # the folded weight and bias stay float16
    _check(env, model, seed=4)


def test_a_float16_fold_that_overflows_is_not_made() -> None:
    """Folding would scale the weights past float16's range; the two nodes stay (unfolded, the Conv's outputs are
    small enough)."""
    model = _conv_batch_norm(np.float16)
    scale = next(init for init in model.graph.initializer if init.name == "s")
    scale.CopyFrom(numpy_helper.from_array(np.full(16, 60000.0, np.float16), "s"))  # / sqrt(v + 1e-3): ~1e6
    plan = plan_model(load_model(model), {"x": (1, 8, 6, 6)}, CAPS, input_dtypes={"x": np.dtype(np.float16)})
    assert [step.op_types for step in plan.steps] == [("Conv",), ("BatchNormalization",)]


# -- ConvTranspose and CausalConvWithState --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model",
    [
        _op(
            "ConvTranspose",
            {"x": (1, 4, 5, 5), "w": (4, 3, 3, 3), "b": (3,)},
            strides=[2, 2],
            pads=[1, 1, 0, 0],
            output_padding=[1, 1],
        ),
        _op("ConvTranspose", {"x": (2, 4, 7), "w": (4, 2, 4)}, strides=[3], group=2, dilations=[2]),
    ],
    ids=["2d-bias", "1d-grouped"],
)
def test_conv_transpose(env: ortgpu.Env, model: onnx.ModelProto) -> None:
    _check(env, model)


@pytest.mark.parametrize(
    "inputs, activation",
    [
        ({"x": (2, 4, 8), "w": (4, 1, 3), "b": (4,), "p": (2, 4, 2)}, "silu"),
        ({"x": (1, 3, 6), "w": (3, 1, 4)}, "none"),
    ],
    ids=["bias-past-silu", "plain"],
)
def test_causal_conv_with_state(env: ortgpu.Env, inputs: dict[str, tuple[int, ...]], activation: str) -> None:
    _check(env, _op("CausalConvWithState", inputs, opset=27, outputs=2, activation=activation))


# -- pools ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model",
    [
        _op("MaxPool", {"x": (1, 3, 9, 9)}, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        _op("MaxPool", {"x": (2, 3, 7, 7)}, outputs=2, kernel_shape=[2, 2], ceil_mode=1),
        _op("MaxPool", {"x": (1, 2, 6, 5)}, outputs=2, kernel_shape=[3, 2], storage_order=1, pads=[1, 0, 1, 1]),
        _op("MaxPool", {"x": (2, 3, 12)}, kernel_shape=[3], dilations=[2]),
        _op("MaxPool", {"x": (1, 2, 5, 5, 4)}, kernel_shape=[2, 2, 2], strides=[2, 2, 1]),
    ],
    ids=["2d", "indices-ceil", "indices-column-major", "1d-dilated", "3d"],
)
def test_max_pool(env: ortgpu.Env, model: onnx.ModelProto) -> None:
    _check(env, model)


@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize(
    "shape, attrs",
    [
        ((1, 3, 8, 8), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
        ((2, 3, 9), {"kernel_shape": [4], "pads": [2, 1], "strides": [2], "ceil_mode": 1}),
        ((1, 2, 5, 6, 4), {"kernel_shape": [2, 3, 2], "pads": [1, 1, 0, 0, 1, 1]}),
        ((1, 2, 9, 9), {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 1, 1, 1]}),
    ],
    ids=["2d", "1d-ceil", "3d", "dilated"],
)
def test_average_pool(env: ortgpu.Env, include_pad: int, shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    _check(env, _op("AveragePool", {"x": shape}, count_include_pad=include_pad, **attrs))


@pytest.mark.parametrize("shape", [(2, 5, 3, 3), (1, 4, 40, 40), (2, 3, 17)], ids=["short-rows", "long-rows", "1d"])
@pytest.mark.parametrize("op_type", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pools(env: ortgpu.Env, op_type: str, shape: tuple[int, ...]) -> None:
    _check(env, _op(op_type, {"x": shape}))


@pytest.mark.parametrize(
    "p, attrs",
    [
        (1, {"kernel_shape": [2, 2]}),
        (2, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}),
        (3, {"kernel_shape": [2, 3], "dilations": [2, 1], "ceil_mode": 1}),
    ],
)
def test_lp_pool(env: ortgpu.Env, p: int, attrs: dict[str, Any]) -> None:
    _check(env, _op("LpPool", {"x": (2, 3, 7, 7)}, p=p, **attrs))


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("shape", [(2, 3, 5, 5), (1, 2, 48, 40)], ids=["short-rows", "long-rows"])
def test_global_lp_pool(env: ortgpu.Env, p: int, shape: tuple[int, ...]) -> None:
    _check(env, _op("GlobalLpPool", {"x": shape}, p=p))


@pytest.mark.parametrize(
    "shape, attrs",
    [
        ((2, 7, 4, 4), {"size": 3, "alpha": 1e-3, "beta": 0.75, "bias": 2.0}),
        ((1, 6, 5, 3), {"size": 5, "alpha": 0.5, "beta": 0.6}),  # windows clipped at both ends
    ],
)
def test_lrn(env: ortgpu.Env, shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    _check(env, _op("LRN", {"x": shape}, **attrs))


# -- without shader-f16 ---------------------------------------------------------------------------------------------


def test_a_device_without_shader_f16_runs_them_on_the_cpu() -> None:
    env = ortgpu.Env(backend=FakeBackend([FakeDeviceSpec(features=frozenset())]))
    try:
        nodes = [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("MaxPool", ["c"], ["m"], kernel_shape=[2, 2], strides=[2, 2]),
            helper.make_node("LRN", ["m"], ["n"], size=3),
            helper.make_node("GlobalAveragePool", ["n"], ["y"]),
        ]
        model = _model(nodes, {"x": (1, 4, 8, 8), "w": (16, 4, 3, 3), "b": (16,)})
        feeds = _feeds(model, 6)
        want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, feeds
        )[0]
        with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
            placement = session.get_node_placement({n: v.shape for n, v in feeds.items()})
            got = session.run(None, feeds)[0]
        assert [p.op_type for p in placement] == ["Conv", "MaxPool", "LRN", "GlobalAveragePool"]
        for node in placement:
            assert node.placement == "cpu" and "shader-f16" in node.reason, node.reason
        assert got.dtype == np.float16
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=0, atol=2e-3 * abs(want).max())
    finally:
        env.close()
