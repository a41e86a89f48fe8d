"""onnxruntime's contributed activations and fused operators (com.microsoft): Gelu, FastGelu, BiasGelu, QuickGelu,
BiasAdd, BiasSplitGelu, FusedMatMul, FusedConv and NhwcConv.

Each case is a one-node model run by ortgpu on both backends with every node on the device (``allow_cpu=False``),
compared with onnxruntime's CPU provider: the node itself where onnxruntime has a CPU kernel, otherwise the
standard-operator graph onnxruntime's own fusions replace (BiasAdd: two Adds; BiasSplitGelu: Add, Slice, Gelu, Mul;
NhwcConv: Conv between Transposes).  float32 agrees within 1e-4 of the output's largest magnitude; float16 within
2e-3 (two roundings of a float16 result, ortgpu's from f32 and onnxruntime's from its own float16 arithmetic, may
differ by one unit in the last place, 1e-3 relative).
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np
import onnx
import onnxruntime
import pytest
from helpers import run_model
from onnx import TensorProto, helper

from ortgpu_core._errors import ModelError, UnsupportedOpError

F32, F16 = np.float32, np.float16
_DEVICES: dict[str, Any] = {}


def _open(backend_name: str) -> Any:
    device = _DEVICES.get(backend_name)
    if device is None:
        if backend_name == "fake":
            from ortgpu_core.backends.fake import FakeBackend

            device = FakeBackend().open_device(0)
        else:
            from ortgpu_core.backends.wgpu_native import WgpuBackend

            backend = WgpuBackend()
            device = backend.open_device(backend.default_adapter_index())
        _DEVICES[backend_name] = device
    return device


@pytest.fixture
def device(backend_name: str) -> Iterator[Any]:
    dev = _open(backend_name)
    before = dev.live_handles()
    yield dev
    assert dev.live_handles() == before, "the run leaked device objects"


def _elem(dtype: Any) -> int:
    return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


def contrib_model(
    op_type: str, shapes: Sequence[tuple[int, ...] | None], dtype: Any = F32, **attrs: Any
) -> onnx.ModelProto:
    """One com.microsoft node over graph inputs ``i0, i1, ...`` (``None``: an absent optional input)."""
    names = ["" if shape is None else f"i{k}" for k, shape in enumerate(shapes)]
    inputs = [helper.make_tensor_value_info(n, _elem(dtype), s) for n, s in zip(names, shapes) if n]
    node = helper.make_node(op_type, names, ["y"], domain="com.microsoft", **attrs)
    graph = helper.make_graph([node], op_type, inputs, [helper.make_tensor_value_info("y", _elem(dtype), None)])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def standard_model(
    nodes: list[onnx.NodeProto], names: Sequence[str], dtype: Any, inits: Sequence[onnx.TensorProto] = ()
) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info(n, _elem(dtype), None) for n in names]
    graph = helper.make_graph(
        nodes, "reference", inputs, [helper.make_tensor_value_info("y", _elem(dtype), None)], list(inits)
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def feeds_for(
    shapes: Sequence[tuple[int, ...] | None], dtype: Any, seed: int = 0, scale: float = 2.0
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"i{k}": (scale * rng.standard_normal(s)).astype(dtype) for k, s in enumerate(shapes) if s is not None}


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, feeds)[0])


def check(
    device: Any,
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    want: np.ndarray | None = None,
    *,
    on_device: bool = True,
) -> Any:
    """Run ``model`` on ``device``, compare with onnxruntime (``want``: its result of an equivalent graph); every
    com.microsoft node on the device when ``on_device``.  Returns the plan."""
    if want is None:
        want = ort_run(model, feeds)
    outputs, plan = run_model(model, feeds, device, allow_cpu=not on_device)
    got = outputs[0]
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    tolerance = 2e-3 if got.dtype == np.float16 else 1e-4
    scale = max(float(np.abs(want.astype(np.float64)).max(initial=0.0)), 1e-30)
    error = float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max(initial=0.0)) / scale
    assert error < tolerance, (error, plan.describe())
    if on_device:
        assert {row[2] for row in plan.placement} == {"webgpu"}, plan.describe()
    return plan


# -- Gelu, FastGelu, BiasGelu, QuickGelu -------------------------------------------------------------------------

ACTIVATION_CASES = [
    ("Gelu", [(3, 7, 13)], {}),
    ("Gelu", [(5,)], {}),
    ("Gelu", [(0, 5)], {}),  # empty: no kernel
    ("FastGelu", [(2, 3, 17)], {}),
    ("FastGelu", [(2, 3, 17), (17,)], {}),
    ("FastGelu", [(4, 9), None], {}),
    ("BiasGelu", [(2, 5, 11), (11,)], {}),
    ("BiasGelu", [(11,), (11,)], {}),
    ("QuickGelu", [(3, 37)], {}),
    ("QuickGelu", [(3, 37)], {"alpha": -0.75}),
]


@pytest.mark.parametrize("dtype", [F32, F16], ids=["float32", "float16"])
@pytest.mark.parametrize(("op_type", "shapes", "attrs"), ACTIVATION_CASES, ids=lambda v: str(v))
def test_activation_matches_onnxruntime(
    device: Any, op_type: str, shapes: list[Any], attrs: dict[str, Any], dtype: Any
) -> None:
    model = contrib_model(op_type, shapes, dtype, **attrs)
    check(device, model, feeds_for(shapes, dtype, scale=3.0))


def test_gelu_far_tails(device: Any) -> None:
    """Large magnitudes (tanh and erf saturate, exp(-x^2) underflows) stay finite and exact."""
    x = np.concatenate([np.linspace(-30.0, 30.0, 61), [-1e-7, 0.0, 1e-7, 88.0, -88.0]]).astype(F32)
    for op_type in ("Gelu", "FastGelu", "QuickGelu"):
        check(device, contrib_model(op_type, [x.shape]), {"i0": x})


def test_float64_runs_on_the_cpu(device: Any) -> None:
    """float64 has no WebGPU kernel: the node runs its reference on the CPU, which agrees with onnxruntime."""
    shapes = [(4, 6), (6,)]
    plan = check(device, contrib_model("FastGelu", shapes, np.float64), feeds_for(shapes, np.float64), on_device=False)
    assert {row[2] for row in plan.placement} == {"cpu"}


# -- BiasAdd, BiasSplitGelu (no onnxruntime CPU kernel: compared with the graphs they fuse) ------------------------


@pytest.mark.parametrize("dtype", [F32, F16], ids=["float32", "float16"])
@pytest.mark.parametrize("shape", [(2, 5, 8), (1, 3, 13)])
def test_bias_add(device: Any, shape: tuple[int, ...], dtype: Any) -> None:
    shapes = [shape, shape[-1:], shape]
    feeds = feeds_for(shapes, dtype)
    nodes = [helper.make_node("Add", ["i0", "i1"], ["s"]), helper.make_node("Add", ["s", "i2"], ["y"])]
    want = ort_run(standard_model(nodes, ["i0", "i1", "i2"], dtype), feeds)
    check(device, contrib_model("BiasAdd", shapes, dtype), feeds, want)


@pytest.mark.parametrize("dtype", [F32, F16], ids=["float32", "float16"])
@pytest.mark.parametrize("shape", [(2, 3, 8), (1, 5, 14)])
def test_bias_split_gelu(device: Any, shape: tuple[int, ...], dtype: Any) -> None:
    shapes = [shape, shape[-1:]]
    feeds = feeds_for(shapes, dtype)
    half = shape[-1] // 2
    inits = [
        helper.make_tensor(name, TensorProto.INT64, [1], [value])
        for name, value in (("zero", 0), ("half", half), ("end", shape[-1]), ("last", -1))
    ]
    nodes = [
        helper.make_node("Add", ["i0", "i1"], ["s"]),
        helper.make_node("Slice", ["s", "zero", "half", "last"], ["left"]),
        helper.make_node("Slice", ["s", "half", "end", "last"], ["right"]),
        helper.make_node("Gelu", ["right"], ["g"], domain="com.microsoft"),
        helper.make_node("Mul", ["left", "g"], ["y"]),
    ]
    want = ort_run(standard_model(nodes, ["i0", "i1"], dtype, inits), feeds)
    check(device, contrib_model("BiasSplitGelu", shapes, dtype), feeds, want)


# -- FusedMatMul -------------------------------------------------------------------------------------------------

MATMUL_CASES = [
    ((5, 4), (4, 6), {}),  # attribute defaults: a plain MatMul
    ((4, 5), (4, 6), {"transA": 1, "alpha": 0.5}),
    ((5, 4), (6, 4), {"transB": 1, "alpha": -1.25}),
    ((2, 4, 5), (2, 6, 4), {"transA": 1, "transB": 1}),
    ((3, 2, 4), (2, 4, 7), {"transBatchA": 1, "alpha": 2.0}),
    ((2, 4, 5), (5, 2, 7), {"transBatchB": 1}),
    ((3, 2, 5, 4), (3, 2, 5, 6), {"transBatchA": 1, "transBatchB": 1, "transA": 1}),
    ((3, 2, 4), (7, 2, 4), {"transBatchA": 1, "transBatchB": 1, "transB": 1}),
    ((2, 1, 5, 4), (3, 6, 4), {"transB": 1}),  # broadcast batch
    ((4,), (6, 4), {"transA": 1, "transB": 1}),  # a vector: transA has nothing to swap
    ((1, 9), (6, 9), {"transB": 1, "alpha": 0.25}),  # one row: the GEMV
]


@pytest.mark.parametrize("dtype", [F32, F16], ids=["float32", "float16"])
@pytest.mark.parametrize(("a", "b", "attrs"), MATMUL_CASES, ids=lambda v: str(v))
def test_fused_matmul(device: Any, a: tuple[int, ...], b: tuple[int, ...], attrs: dict[str, Any], dtype: Any) -> None:
    model = contrib_model("FusedMatMul", [a, b], dtype, **attrs)
    check(device, model, feeds_for([a, b], dtype, scale=1.0))


# -- FusedConv ---------------------------------------------------------------------------------------------------

ACTIVATIONS: list[dict[str, Any]] = [
    {},
    {"activation": "Relu"},
    {"activation": "Sigmoid"},
    {"activation": "Tanh"},
    {"activation": "LeakyRelu", "activation_params": [0.2]},
    {"activation": "Clip", "activation_params": [-0.5, 1.5]},
    {"activation": "HardSigmoid", "activation_params": [0.25, 0.4]},
]


@pytest.mark.parametrize("attrs", ACTIVATIONS, ids=lambda a: a.get("activation", "none"))
@pytest.mark.parametrize("inputs", ["xw", "xwb", "xwbz", "xwz"])
def test_fused_conv_activations(device: Any, attrs: dict[str, Any], inputs: str) -> None:
    x, w = (1, 3, 7, 6), (8, 3, 3, 3)  # 8 output channels: the implicit GEMM
    shapes = [x, w, (8,) if "b" in inputs else None, (1, 8, 5, 4) if "z" in inputs else None]
    while shapes[-1] is None:
        shapes.pop()
    check(device, contrib_model("FusedConv", shapes, **attrs), feeds_for(shapes, F32))


@pytest.mark.parametrize("activation", ["Relu", "Tanh"])
def test_fused_conv_float16_with_sum(device: Any, activation: str) -> None:
    shapes = [(1, 4, 6, 5), (8, 4, 3, 3), (8,), (1, 8, 4, 3)]
    check(device, contrib_model("FusedConv", shapes, F16, activation=activation), feeds_for(shapes, F16, scale=1.0))


FUSED_CONV_GEOMETRIES = [
    ((1, 4, 9, 9), (4, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),  # narrow groups: the direct kernel
    ((2, 6, 8, 7), (6, 1, 3, 3), {"group": 6, "strides": [2, 1], "dilations": [1, 2]}),  # depthwise
    ((1, 3, 11), (9, 3, 4), {"pads": [2, 1], "strides": [2]}),  # 1-D
    ((1, 2, 6, 6), (16, 2, 1, 1), {"auto_pad": "SAME_UPPER"}),  # pointwise
]


@pytest.mark.parametrize("dtype", [F32, F16], ids=["float32", "float16"])
@pytest.mark.parametrize(("x", "w", "attrs"), FUSED_CONV_GEOMETRIES, ids=lambda v: str(v))
def test_fused_conv_geometries(
    device: Any, x: tuple[int, ...], w: tuple[int, ...], attrs: dict[str, Any], dtype: Any
) -> None:
    shapes = [x, w, (w[0],)]
    model = contrib_model("FusedConv", shapes, dtype, activation="LeakyRelu", activation_params=[0.05], **attrs)
    check(device, model, feeds_for(shapes, dtype, scale=1.0))


# -- NhwcConv (no onnxruntime CPU kernel: compared with Transpose, Conv, Transpose) ----------------------------------


def nhwc_reference(
    shapes: Sequence[tuple[int, ...] | None], feeds: dict[str, np.ndarray], dtype: Any, **attrs: Any
) -> np.ndarray:
    rank = len(shapes[0] or ())
    first = [0, rank - 1] + list(range(1, rank - 1))
    last = [0] + list(range(2, rank)) + [1]
    names = ["xc", "wc"] + (["i2"] if len(shapes) > 2 else [])
    nodes = [
        helper.make_node("Transpose", ["i0"], ["xc"], perm=first),
        helper.make_node("Transpose", ["i1"], ["wc"], perm=first),
        helper.make_node("Conv", names, ["yc"], **attrs),
        helper.make_node("Transpose", ["yc"], ["y"], perm=last),
    ]
    return ort_run(standard_model(nodes, list(feeds), dtype), feeds)


NHWC_CASES = [
    ((1, 6, 5, 3), (8, 3, 3, 3), {}),  # channels not a multiple of 4: scalar loads
    ((2, 7, 6, 4), (5, 3, 2, 4), {"pads": [1, 0, 1, 2], "strides": [1, 2]}),  # vec4 loads along the channels
    ((1, 9, 9, 8), (12, 3, 3, 8), {"dilations": [2, 2], "pads": [2, 1, 2, 0]}),
    ((1, 7, 6, 8), (9, 3, 3, 8), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ((2, 10, 4), (6, 3, 4), {"pads": [1, 1]}),  # 1-D: (N, W, C)
    ((1, 4, 4, 5), (7, 1, 1, 5), {}),  # pointwise
]


@pytest.mark.parametrize("dtype", [F32, F16], ids=["float32", "float16"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize(("x", "w", "attrs"), NHWC_CASES, ids=lambda v: str(v))
def test_nhwc_conv(
    device: Any, x: tuple[int, ...], w: tuple[int, ...], attrs: dict[str, Any], bias: bool, dtype: Any
) -> None:
    shapes: list[tuple[int, ...] | None] = [x, w] + ([(w[0],)] if bias else [])
    feeds = feeds_for(shapes, dtype, scale=1.0)
    want = nhwc_reference(shapes, feeds, dtype, **attrs)
    check(device, contrib_model("NhwcConv", shapes, dtype, **attrs), feeds, want)


GROUPED_NHWC_CASES = [
    ((1, 5, 5, 4), (6, 3, 3, 2), {"group": 2}),
    ((2, 6, 7, 5), (5, 3, 3, 1), {"group": 5, "pads": [1, 1, 1, 1], "strides": [2, 1]}),  # depthwise
    ((1, 9, 6), (6, 2, 2), {"group": 3, "dilations": [2]}),  # 1-D
]


@pytest.mark.parametrize("dtype", [F32, F16], ids=["float32", "float16"])
@pytest.mark.parametrize(("x", "w", "attrs"), GROUPED_NHWC_CASES, ids=lambda v: str(v))
def test_grouped_nhwc_conv(
    device: Any, x: tuple[int, ...], w: tuple[int, ...], attrs: dict[str, Any], dtype: Any
) -> None:
    """Grouped channels-last convolutions run on the direct kernel."""
    shapes = [x, w, (w[0],)]
    feeds = feeds_for(shapes, dtype, scale=1.0)
    want = nhwc_reference(shapes, feeds, dtype, **attrs)
    check(device, contrib_model("NhwcConv", shapes, dtype, **attrs), feeds, want)


def test_three_d_nhwc_conv_runs_on_the_cpu(device: Any) -> None:
    """3-D convolutions have no WebGPU kernel: the node runs (correctly) on the CPU, and the plan says why."""
    shapes = [(1, 4, 4, 3, 2), (3, 2, 2, 2, 2)]
    feeds = feeds_for(shapes, F32)
    want = nhwc_reference(shapes, feeds, F32)
    plan = check(device, contrib_model("NhwcConv", shapes), feeds, want, on_device=False)
    row = plan.placement[0]
    assert row[2] == "cpu" and "3-D" in row[3]


# -- invalid models ------------------------------------------------------------------------------------------------


BAD_MODELS = [
    (contrib_model("BiasGelu", [(2, 6), (5,)]), ModelError, "BiasGelu.*last dimension"),
    (contrib_model("FastGelu", [(2, 6), (2, 6)]), ModelError, "FastGelu.*1-D"),
    (contrib_model("BiasAdd", [(2, 6), (6,), (2, 6)]), ModelError, "BiasAdd.*3-D"),
    (contrib_model("BiasAdd", [(1, 2, 6), (6,), (2, 2, 6)]), ModelError, "BiasAdd.*skip"),
    (contrib_model("BiasSplitGelu", [(1, 2, 7), (7,)]), ModelError, "BiasSplitGelu.*even"),
    (contrib_model("FusedMatMul", [(4, 5), (5, 6)], transBatchA=1), ModelError, "FusedMatMul.*rank"),
    (contrib_model("FusedMatMul", [(4, 5), (5, 6)], transA=1), ModelError, "FusedMatMul.*do not multiply"),
    (
        contrib_model("FusedConv", [(1, 2, 5, 5), (4, 2, 3, 3)], activation="Gelu"),
        UnsupportedOpError,
        "FusedConv.*Gelu",
    ),
    (
        contrib_model("FusedConv", [(1, 2, 5, 5), (4, 2, 3, 3)], activation="Clip", activation_params=[0.0]),
        UnsupportedOpError,
        "FusedConv.*Clip takes 2",
    ),
    (contrib_model("FusedConv", [(1, 2, 5, 5), (4, 2, 3, 3), (4,), (1, 4, 5, 5)]), ModelError, "FusedConv.*Z must"),
    (contrib_model("NhwcConv", [(1, 5, 5, 3), (4, 3, 3, 2)]), ModelError, "NhwcConv: X .* has 3 channels"),
    (contrib_model("NhwcConv", [(1, 5, 5, 4), (3, 3, 3, 2)], group=2), ModelError, "NhwcConv.*multiple of group"),
]


@pytest.mark.parametrize(
    ("model", "error", "match"),
    BAD_MODELS,
    ids=[f"{m.graph.node[0].op_type}-{i}" for i, (m, _, _) in enumerate(BAD_MODELS)],
)
def test_invalid_models_raise_typed_errors(
    device: Any, model: onnx.ModelProto, error: type[Exception], match: str
) -> None:
    shapes = [tuple(d.dim_value for d in v.type.tensor_type.shape.dim) for v in model.graph.input]
    with pytest.raises(error, match=match):
        run_model(model, feeds_for(shapes, F32), device, allow_cpu=False)
