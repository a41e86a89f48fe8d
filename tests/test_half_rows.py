"""float16 row-wise and normalisation kernels and reductions on the device: f16 storage, f32 arithmetic, one rounding.

Softmax and LogSoftmax (both opset families), LayerNormalization (its three outputs, either stash type),
RMSNormalization, BatchNormalization (inference, float16 or float32 parameters), every Reduce* operator (the row
kernel with one invocation, a team or a whole workgroup per row, LogSumExp's two-pass kernel, the serial kernel of
ReduceProd and of max/min over an empty axis), MeanVarianceNormalization, GroupNormalization and
InstanceNormalization run on the device in float16 and match onnxruntime CPU running the same float16 model (or,
where it has no float16 kernel, the float32 model rounded to float16), on both backends.  The planner's RMSNorm and
LayerNorm patterns fuse float16 graphs as ``model.half()`` exports them.  A device without ``shader-f16`` runs the
row kernels on the CPU and says why.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_ops_elementwise import Case, check_plan, halves, open_device

import ortgpu
from ortgpu._planner import plan_model
from ortgpu.loader._model import load_model
from ortgpu.ops import DeviceCaps
from ortgpu_core.backends.fake import DEFAULT_FAKE_LIMITS, FakeBackend, FakeDeviceSpec

F16, F32, I64 = TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.INT64
HALF_CAPS = DeviceCaps(frozenset({"shader-f16"}), DEFAULT_FAKE_LIMITS)


def _model(
    nodes: list[Any],
    inputs: dict[str, tuple[int, ...]],
    outputs: dict[str, int] | None = None,
    opset: int = 18,
    initializers: tuple[onnx.TensorProto, ...] = (),
    input_type: int = F16,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "half_rows",
        [helper.make_tensor_value_info(name, input_type, shape) for name, shape in inputs.items()],
        [helper.make_tensor_value_info(name, kind, None) for name, kind in (outputs or {"y": F16}).items()],
        list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    for index, node in enumerate(model.graph.node):
        node.name = node.name or f"{node.op_type}_{index}"
    return model


def _node(
    op_type: str,
    inputs: dict[str, tuple[int, ...]],
    opset: int,
    outputs: dict[str, int] | None = None,
    constants: dict[str, np.ndarray] | None = None,
    **attrs: Any,
) -> onnx.ModelProto:
    """One ``op_type`` node over float16 graph inputs, then the constant inputs (``constants``, in order)."""
    constants = constants or {}
    names = list(inputs) + list(constants)
    node = helper.make_node(op_type, names, list(outputs or {"y": F16}), **attrs)
    inits = tuple(numpy_helper.from_array(value, name) for name, value in constants.items())
    return _model([node], inputs, outputs, opset, inits)


def _feeds(model: onnx.ModelProto, seed: int, positive: bool = False, scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    initialized = {init.name for init in model.graph.initializer}
    for value in model.graph.input:
        if value.name in initialized:
            continue
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        data = rng.uniform(0.5, 1.5, shape) if positive else rng.standard_normal(shape) * scale
        feeds[value.name] = data.astype(helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))
    return feeds


def _as_float32(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same model over float32 tensors (for the operators onnxruntime has no float16 kernel of)."""
    wide = onnx.ModelProto()
    wide.CopyFrom(model)
    for value in list(wide.graph.input) + list(wide.graph.output):
        if value.type.tensor_type.elem_type == F16:
            value.type.tensor_type.elem_type = F32
    return wide


def _check(
    env: ortgpu.Env,
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    widened_peer: bool = False,
) -> list[np.ndarray]:
    """Every node on the device and the outputs (in their own types) within 2e-3 x max|want| (a couple of float16
    rounding steps) of onnxruntime CPU's (its float32 model's, rounded to float16, with ``widened_peer``); returns
    the outputs."""
    if widened_peer:
        wide = {name: value.astype(np.float32) for name, value in feeds.items()}
        peer = onnxruntime.InferenceSession(_as_float32(model).SerializeToString(), providers=["CPUExecutionProvider"])
        expected = [value.astype(np.float16) for value in peer.run(None, wide)]
    else:
        peer = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        expected = peer.run(None, feeds)
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
        placement = session.get_node_placement({name: value.shape for name, value in feeds.items()})
        got = session.run(None, feeds)
    assert [p.placement for p in placement] == ["webgpu"] * len(placement), [p.reason for p in placement]
    for actual, want in zip(got, expected):
        assert actual.dtype == want.dtype and actual.shape == want.shape
        wide_actual, wide_want = actual.astype(np.float64), want.astype(np.float64)
        assert np.array_equal(np.isnan(wide_actual), np.isnan(wide_want))
        finite = np.isfinite(wide_want)
        assert np.array_equal(wide_actual[~finite & ~np.isnan(wide_want)], wide_want[~finite & ~np.isnan(wide_want)])
        scale = float(np.abs(wide_want[finite]).max()) if finite.any() else 0.0
        error = float(np.abs(wide_actual[finite] - wide_want[finite]).max()) if finite.any() else 0.0
        assert error <= 2e-3 * scale, (error, scale)
    return got


# -- Softmax, LogSoftmax -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize(
    "shape, axis, opset",
    [
        ((6, 5), -1, 13),  # short rows: one invocation per row
        ((4, 100, 7), 1, 13),  # a middle axis (strided row elements), a team of invocations per row
        ((2, 3000), -1, 13),  # long rows: a whole workgroup per row
        ((3, 4, 5, 6), 1, 11),  # coerced to 2-D: the row is every axis from 1 on
        ((3, 4, 50), -1, 11),
    ],
    ids=["short", "middle-axis", "long", "coerced", "coerced-last"],
)
def test_softmax(env: ortgpu.Env, op_type: str, shape: tuple[int, ...], axis: int, opset: int) -> None:
    model = _node(op_type, {"x": shape}, opset, axis=axis)
    _check(env, model, _feeds(model, 0, scale=3.0))


def test_softmax_of_masked_rows(env: ortgpu.Env) -> None:
    """Rows masked with -inf keys and with float16's lowest value (as exporters write masks)."""
    model = _node("Softmax", {"x": (4, 40)}, 13, axis=-1)
    feeds = _feeds(model, 1)
    feeds["x"][0, 10:] = -np.inf
    feeds["x"][1, :30] = np.finfo(np.float16).min
    _check(env, model, feeds)


# -- LayerNormalization, RMSNormalization -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, axis, bias, stash_type, outputs",
    [
        ((2, 7, 48), -1, True, 1, 1),
        ((3, 5, 6), 1, False, 1, 1),  # normalised over two axes, no bias
        ((2, 4096), -1, True, 1, 3),  # a whole workgroup per row; Mean and InvStdDev in float32 (stash_type 1)
        ((4, 3, 10), -1, True, 0, 3),  # stash_type 0: Mean and InvStdDev in float16
        ((5, 3), -1, True, 1, 2),  # Mean only
    ],
    ids=["last-axis", "two-axes-no-bias", "long-with-stats", "stash-float16", "mean-only"],
)
def test_layer_normalization(
    env: ortgpu.Env, shape: tuple[int, ...], axis: int, bias: bool, stash_type: int, outputs: int
) -> None:
    norm_shape = shape[axis % len(shape) :]
    inputs = {"x": shape, "scale": norm_shape} | ({"bias": norm_shape} if bias else {})
    stats = F32 if stash_type == 1 else F16
    names = {"y": F16, "mean": stats, "inv_std": stats}
    model = _node(
        "LayerNormalization",
        inputs,
        17,
        dict(list(names.items())[:outputs]),
        axis=axis,
        epsilon=1e-3,
        stash_type=stash_type,
    )
    got = _check(env, model, _feeds(model, 2, scale=2.0))
    assert [g.dtype for g in got] == [np.float16] + [np.dtype(np.float32 if stash_type else np.float16)] * (outputs - 1)


@pytest.mark.parametrize(
    "shape, axis", [((2, 7, 48), -1), ((3, 4, 5), 1), ((2, 5000), -1)], ids=["last", "two-axes", "long"]
)
def test_rms_normalization(env: ortgpu.Env, shape: tuple[int, ...], axis: int) -> None:
    model = _node("RMSNormalization", {"x": shape, "scale": shape[axis % len(shape) :]}, 23, axis=axis, epsilon=1e-4)
    _check(env, model, _feeds(model, 3, scale=2.0))


# -- BatchNormalization -----------------------------------------------------------------------------------------


def _batch_norm(shape: tuple[int, ...], params: tuple[int, ...], opset: int, param_type: int, **attrs: Any) -> Any:
    rng = np.random.default_rng(4)
    dtype = helper.tensor_dtype_to_np_dtype(param_type)
    values = {
        "scale": rng.standard_normal(params),
        "bias": rng.standard_normal(params),
        "mean": rng.standard_normal(params),
        "var": rng.uniform(0.5, 2.0, params),
    }
    return _node(
        "BatchNormalization", {"x": shape}, opset, constants={k: v.astype(dtype) for k, v in values.items()}, **attrs
    )


@pytest.mark.parametrize(
    "shape, params, opset, param_type, attrs",
    [
        ((2, 3, 5, 4), (3,), 15, F16, {}),
        ((2, 3, 5, 4), (3,), 15, F32, {"epsilon": 1e-3}),  # float32 parameters (T1, T2) for float16 X
        ((4, 6), (6,), 9, F16, {}),  # rank 2: the channel is the last axis
        ((2, 3, 4), (3, 4), 7, F16, {"spatial": 0}),  # per-activation parameters
    ],
    ids=["nchw", "float32-parameters", "rank-2", "per-activation"],
)
def test_batch_normalization(
    env: ortgpu.Env,
    shape: tuple[int, ...],
    params: tuple[int, ...],
    opset: int,
    param_type: int,
    attrs: dict[str, Any],
) -> None:
    model = _batch_norm(shape, params, opset, param_type, **attrs)
    _check(env, model, _feeds(model, 5, scale=2.0))


# -- Reduce* -------------------------------------------------------------------------------------------------------

REDUCE_OPS = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
]


def _reduce(op_type: str, shape: tuple[int, ...], axes: list[int] | None, keepdims: int = 1, **attrs: Any) -> Any:
    """The reduction at opset 18 (axes as a constant input; ``None``: no axes input)."""
    constants = {} if axes is None else {"axes": np.array(axes, np.int64)}
    return _node(op_type, {"x": shape}, 18, constants=constants, keepdims=keepdims, **attrs)


@pytest.mark.parametrize("op_type", REDUCE_OPS)
@pytest.mark.parametrize(
    "shape, axes, keepdims",
    [
        ((6, 5), [1], 1),  # short rows: one invocation per row
        ((4, 60, 3), [1], 0),  # a middle axis (strided), a team per row
        ((3, 4, 5), [0, 2], 1),  # two separate axes
        ((2, 2400), None, 1),  # every axis: one long row, a whole workgroup
    ],
    ids=["short", "middle-axis", "two-axes", "all"],
)
def test_reductions(
    env: ortgpu.Env, op_type: str, shape: tuple[int, ...], axes: list[int] | None, keepdims: int
) -> None:
    model = _reduce(op_type, shape, axes, keepdims)
    # positive data where the logarithm needs it; factors near 1 for the product (so it stays in float16's range)
    positive = op_type in ("ReduceLogSum", "ReduceProd")
    feeds = _feeds(model, 6, positive=positive)
    if op_type == "ReduceProd":
        feeds["x"] = (1.0 + (feeds["x"].astype(np.float32) - 1.0) / 16).astype(np.float16)
    # (a row of 4800: the kernel and onnxruntime sum in float32 in different orders, ~1e-5 of the result apart)
    _check(env, model, feeds)


@pytest.mark.parametrize("op_type", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd"])
def test_reductions_over_an_empty_axis(env: ortgpu.Env, op_type: str) -> None:
    """The identities (0, 1, -inf, +inf; the mean 0) from the row kernel, or the serial kernel for max/min/prod."""
    model = _reduce(op_type, (3, 0, 4), [1], 1)
    _check(env, model, {"x": np.zeros((3, 0, 4), np.float16)})


@pytest.mark.parametrize("op_type", ["ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceSumSquare"])
def test_reductions_over_no_axes_transform_each_element(env: ortgpu.Env, op_type: str) -> None:
    model = _reduce(op_type, (5, 7), [], 1, noop_with_empty_axes=1)
    _check(env, model, _feeds(model, 7, positive=op_type == "ReduceLogSum"))


@pytest.mark.parametrize("op_type", ["ReduceSum", "ReduceMax", "ReduceL2", "ReduceLogSumExp"])
def test_reductions_with_axes_attribute(env: ortgpu.Env, op_type: str) -> None:
    opset = 11 if op_type == "ReduceSum" else 13
    model = _node(op_type, {"x": (3, 4, 9)}, opset, axes=[-1], keepdims=0)
    _check(env, model, _feeds(model, 8, scale=4.0))


def test_max_min_and_log_sum_exp_keep_nans_and_infinities(env: ortgpu.Env) -> None:
    """Rows holding +inf, all -inf, and (apart: onnxruntime's max and min skip NaN where ONNX and numpy give NaN) a
    NaN."""
    x = np.random.default_rng(9).standard_normal((4, 30)).astype(np.float16)
    x[1, 7], x[2, :] = np.inf, -np.inf
    for op_type in ("ReduceMax", "ReduceMin", "ReduceLogSumExp"):
        model = _reduce(op_type, (4, 30), [1], 1)
        _check(env, model, {"x": x})
        with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
            (got,) = session.run(None, {"x": np.where(np.arange(30) == 3, np.float16(np.nan), x)})
        assert np.isnan(got).all(), (op_type, got)


# -- MeanVarianceNormalization, GroupNormalization, InstanceNormalization ----------------------------------------


@pytest.mark.parametrize("axes", [None, [2, 3], [1]], ids=["default-axes", "spatial", "channels"])
def test_mean_variance_normalization(env: ortgpu.Env, axes: list[int] | None) -> None:
    model = _node("MeanVarianceNormalization", {"x": (2, 3, 6, 5)}, 13, **({} if axes is None else {"axes": axes}))
    # onnxruntime has no float16 kernel of it (its function body adds a float32 epsilon to float16): the float32
    # model's result, rounded to float16, is the peer
    _check(env, model, _feeds(model, 10, scale=3.0), widened_peer=True)


def test_group_normalization(env: ortgpu.Env) -> None:
    model = _node(
        "GroupNormalization", {"x": (2, 6, 5, 7), "scale": (6,), "bias": (6,)}, 21, num_groups=2, epsilon=1e-3
    )
    _check(env, model, _feeds(model, 11, scale=2.0))


def test_group_normalization_18_per_group(backend_name: str) -> None:
    """GroupNormalization-18 (scale and bias per group; onnx's checker refuses models of it, so the kernel is run
    alone, against the reference)."""
    device = open_device(backend_name)
    try:
        case = Case(
            "GroupNormalization",
            [halves(2, 6, 5, 7), halves(2), halves(2)],
            {"num_groups": 2, "epsilon": 1e-3},
            opset=18,
            label="float16",
        )
        check_plan(case, device)
    finally:
        device.destroy()


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 4, 30, 40)], ids=["short", "long"])
def test_instance_normalization(env: ortgpu.Env, shape: tuple[int, ...]) -> None:
    model = _node("InstanceNormalization", {"x": shape, "scale": (shape[1],), "bias": (shape[1],)}, 22, epsilon=1e-3)
    _check(env, model, _feeds(model, 12, scale=2.0))


# -- the planner's fused RMSNorm and LayerNorm in float16 graphs -------------------------------------------------

SHAPE = (2, 7, 48)


def half_rms_norm(
    upcast: bool = True, scalars: int = F32, inverse: str = "div", x_read_elsewhere: bool = False
) -> onnx.ModelProto:
    """HF LlamaRMSNorm of ``model.half()``: x cast to float32 (``upcast``), Pow, ReduceMean, Add eps, Sqrt, Div or
    Reciprocal, Mul, Cast back to float16, Mul weight; then a residual Add of x (or, ``x_read_elsewhere``, of
    x's float32 copy, cast back)."""
    x = "x32" if upcast else "x"
    nodes = [helper.make_node("Cast", ["x"], ["x32"], to=F32)] if upcast else []
    nodes += [
        helper.make_node("Pow", [x, "two"], ["p"]),
        helper.make_node("ReduceMean", ["p", "axes"], ["m"], keepdims=1),
        helper.make_node("Add", ["m", "eps"], ["a"]),
        helper.make_node("Sqrt", ["a"], ["s"]),
        helper.make_node("Div", ["one", "s"], ["r"])
        if inverse == "div"
        else helper.make_node("Reciprocal", ["s"], ["r"]),
        helper.make_node("Mul", [x, "r"], ["n"]),
    ]
    last = "n"
    if upcast:
        nodes.append(helper.make_node("Cast", ["n"], ["nh"], to=F16))
        last = "nh"
    nodes.append(helper.make_node("Mul", ["w", last], ["normed"]))
    if x_read_elsewhere:
        nodes.append(helper.make_node("Cast", ["x32"], ["back"], to=F16))
        nodes.append(helper.make_node("Add", ["normed", "back"], ["y"]))
    else:
        nodes.append(helper.make_node("Add", ["normed", "x"], ["y"]))
    scalar = helper.tensor_dtype_to_np_dtype(scalars if not upcast else F32)
    inits = (
        numpy_helper.from_array(np.array(2.0, scalar), "two"),
        numpy_helper.from_array(np.array(1e-5 if scalar == np.float32 else 1e-4, scalar), "eps"),
        numpy_helper.from_array(np.array(1.0, scalar), "one"),
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
        numpy_helper.from_array(np.random.default_rng(13).standard_normal(SHAPE[-1]).astype(np.float16), "w"),
    )
    return _model(nodes, {"x": SHAPE}, opset=18, initializers=inits)


def half_layer_norm(beta: bool = True) -> onnx.ModelProto:
    """LayerNorm written out in float16 (an export before opset 17): every tensor and scalar float16."""
    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
        helper.make_node("Sub", ["x", "m"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["p"]),
        helper.make_node("ReduceMean", ["p", "axes"], ["v"], keepdims=1),
        helper.make_node("Add", ["v", "eps"], ["a"]),
        helper.make_node("Sqrt", ["a"], ["s"]),
        helper.make_node("Div", ["d", "s"], ["n"]),
        helper.make_node("Mul", ["n", "gamma"], ["g" if beta else "y"]),
    ]
    if beta:
        nodes.append(helper.make_node("Add", ["g", "beta"], ["y"]))
    rng = np.random.default_rng(14)
    inits = (
        numpy_helper.from_array(np.array(2.0, np.float16), "two"),
        numpy_helper.from_array(np.array(1e-3, np.float16), "eps"),
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
        numpy_helper.from_array(rng.standard_normal(SHAPE[-1]).astype(np.float16), "gamma"),
        numpy_helper.from_array(rng.standard_normal(SHAPE[-1]).astype(np.float16), "beta"),
    )
    return _model(nodes, {"x": SHAPE}, opset=18, initializers=inits)


def _fused_groups(model: onnx.ModelProto, kind: str) -> list[tuple[str, ...]]:
    plan = plan_model(load_model(model), {"x": SHAPE}, HALF_CAPS, input_dtypes={"x": np.float16})
    return [step.op_types for step in plan.steps if f"fused {kind}" in step.reason]


@pytest.mark.parametrize(
    "kwargs, group",
    [
        ({}, ("Cast", "Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "Cast", "Mul")),
        (
            {"upcast": False, "scalars": F16, "inverse": "reciprocal"},
            ("Pow", "ReduceMean", "Add", "Sqrt", "Reciprocal", "Mul", "Mul"),
        ),
        ({"x_read_elsewhere": True}, ("Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "Cast", "Mul")),
    ],
    ids=["upcast-absorbed", "all-float16", "upcast-read-elsewhere"],
)
def test_half_rms_norm_is_one_step(env: ortgpu.Env, kwargs: dict[str, Any], group: tuple[str, ...]) -> None:
    model = half_rms_norm(**kwargs)
    assert _fused_groups(model, "RMS") == [group]
    x = (np.random.default_rng(15).standard_normal(SHAPE) * 4).astype(np.float16)
    _check(env, model, {"x": x})


def test_a_chain_rounding_otherwise_stays_unfused(env: ortgpu.Env) -> None:
    """float32 x whose normalised value is cast to float16 and back before a float32 weight: the graph rounds it to
    float16, a float32 RMSNormalization would not, so the nodes are planned one by one."""
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["p"]),
        helper.make_node("ReduceMean", ["p", "axes"], ["m"], keepdims=1),
        helper.make_node("Add", ["m", "eps"], ["a"]),
        helper.make_node("Sqrt", ["a"], ["s"]),
        helper.make_node("Reciprocal", ["s"], ["r"]),
        helper.make_node("Mul", ["x", "r"], ["n"]),
        helper.make_node("Cast", ["n"], ["nh"], to=F16),
        helper.make_node("Cast", ["nh"], ["nf"], to=F32),
        helper.make_node("Mul", ["nf", "w"], ["y"]),
    ]
    inits = (
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
        numpy_helper.from_array(np.random.default_rng(16).standard_normal(SHAPE[-1]).astype(np.float32), "w"),
    )
    model = _model(nodes, {"x": SHAPE}, {"y": F32}, initializers=inits, input_type=F32)
    plan = plan_model(load_model(model), {"x": SHAPE}, HALF_CAPS)
    assert not any("fused RMS" in step.reason for step in plan.steps)
    x = np.random.default_rng(17).standard_normal(SHAPE).astype(np.float32)
    _check(env, model, {"x": x})


@pytest.mark.parametrize("beta", [True, False], ids=["beta", "no-beta"])
def test_half_layer_norm_is_one_step(env: ortgpu.Env, beta: bool) -> None:
    model = half_layer_norm(beta)
    groups = _fused_groups(model, "layer")
    assert len(groups) == 1 and groups[0][:2] == ("ReduceMean", "Sub") and len(groups[0]) == 8 + beta
    x = (np.random.default_rng(18).standard_normal(SHAPE) * 3).astype(np.float16)
    _check(env, model, {"x": x})


# -- a device without shader-f16 -----------------------------------------------------------------------------------

NO_F16_MODELS = {
    "Softmax": lambda: _node("Softmax", {"x": (3, 20)}, 13),
    "LayerNormalization": lambda: _node("LayerNormalization", {"x": (3, 20), "scale": (20,), "bias": (20,)}, 17),
    "RMSNormalization": lambda: _node("RMSNormalization", {"x": (3, 20), "scale": (20,)}, 23),
    "BatchNormalization": lambda: _batch_norm((2, 3, 4), (3,), 15, F16),
    "ReduceSum": lambda: _reduce("ReduceSum", (3, 20), [1]),
    "ReduceLogSumExp": lambda: _reduce("ReduceLogSumExp", (3, 20), [1]),
    "InstanceNormalization": lambda: _node("InstanceNormalization", {"x": (2, 3, 20), "scale": (3,), "bias": (3,)}, 22),
}


@pytest.mark.parametrize("op_type", list(NO_F16_MODELS))
def test_a_device_without_shader_f16_runs_them_on_the_cpu(op_type: str) -> None:
    env = ortgpu.Env(backend=FakeBackend([FakeDeviceSpec(features=frozenset())]))
    try:
        model = NO_F16_MODELS[op_type]()
        feeds = _feeds(model, 19)
        with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
            (placement,) = session.get_node_placement({n: v.shape for n, v in feeds.items()})
            assert placement.placement == "cpu" and "shader-f16" in placement.reason, placement.reason
            got = session.run(None, feeds)
        want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, feeds
        )
        for actual, expected in zip(got, want):
            assert actual.dtype == np.float16
            np.testing.assert_allclose(
                actual.astype(np.float32), expected.astype(np.float32), rtol=2e-3, atol=2e-3 * np.abs(expected).max()
            )
    finally:
        env.close()


@pytest.mark.parametrize(
    "op_type, shape", [("ReduceProd", (3, 9)), ("ReduceMax", (3, 0, 4))], ids=["prod", "empty-max"]
)
def test_the_serial_reductions_need_no_shader_f16(op_type: str, shape: tuple[int, ...]) -> None:
    """ReduceProd and max/min over an empty axis use the serial kernel, which unpacks float16 from 32-bit words with
    core WGSL: they stay on the device without ``shader-f16``."""
    env = ortgpu.Env(backend=FakeBackend([FakeDeviceSpec(features=frozenset())]))
    try:
        model = _reduce(op_type, shape, [1])
        feeds = _feeds(model, 20, positive=True)
        with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
            (placement,) = session.get_node_placement({n: v.shape for n, v in feeds.items()})
            assert placement.placement == "webgpu", placement.reason
            (got,) = session.run(None, feeds)
        (want,) = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, feeds
        )
        assert got.dtype == np.float16 and got.shape == want.shape
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3)
    finally:
        env.close()
