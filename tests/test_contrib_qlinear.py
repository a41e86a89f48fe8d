"""onnxruntime's QOperator quantized operators (com.microsoft): QLinearAdd, QLinearMul, QLinearSigmoid,
QLinearLeakyRelu, QLinearConcat, QLinearGlobalAveragePool and DynamicQuantizeLSTM.

Each model runs on both backends with every node on the device (``allow_cpu=False``) and is judged by onnxruntime's
CPU provider: quantized outputs must match exactly (the kernels reproduce onnxruntime's rounding order, so the scales
include powers of two, whose products land on rounding ties).  DynamicQuantizeLSTM quantizes X and the hidden state
as onnxruntime does: it matches onnxruntime with one thread within float32 rounding of the activations.  The last tests run the models onnxruntime's own quantization tools
write (``quantize_static`` in QOperator format, ``quantize_dynamic``).
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import onnx
import onnxruntime
import pytest
from helpers import run_model
from onnx import TensorProto, helper

import ortgpu
from ortgpu.ops.com_microsoft._qlinear_math import scalar_input
from ortgpu_core._errors import InvalidArgumentError, ModelError, ShapeError, UnsupportedOpError

MS = "com.microsoft"
ELEMENT = {np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int8): TensorProto.INT8}
BYTES = [np.dtype(np.uint8), np.dtype(np.int8)]
_DEVICES: dict[str, Any] = {}


@pytest.fixture
def device(backend_name: str) -> Iterator[Any]:
    """A raw backend device per backend (opened once), checked for leaked objects after each test."""
    dev = _DEVICES.get(backend_name)
    if dev is None:
        if backend_name == "fake":
            from ortgpu_core.backends.fake import FakeBackend

            dev = FakeBackend().open_device(0)
        else:
            from ortgpu_core.backends.wgpu_native import WgpuBackend

            backend = WgpuBackend()
            dev = backend.open_device(backend.default_adapter_index())
        _DEVICES[backend_name] = dev
    before = dev.live_handles()
    yield dev
    assert dev.live_handles() == before, "the run leaked device objects"


def _model(
    nodes: list[onnx.NodeProto],
    inputs: dict[str, tuple[Any, tuple[int, ...]]],
    outputs: dict[str, Any],
    constants: dict[str, np.ndarray],
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "qlinear",
        [
            helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(d)), s)
            for n, (d, s) in inputs.items()
        ],  # fmt: skip
        [
            helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(d)), None)
            for n, d in outputs.items()
        ],  # fmt: skip
        [onnx.numpy_helper.from_array(np.asarray(value), name) for name, value in constants.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])


def _onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(v) for v in session.run(None, feeds)]


def _check_exact(model: onnx.ModelProto, feeds: dict[str, np.ndarray], device: Any) -> Any:
    """Run on ``device`` with every node on it; every output must equal onnxruntime's bit for bit."""
    got, plan = run_model(model.SerializeToString(), feeds, device, allow_cpu=False)
    want = _onnxruntime(model, feeds)
    for index, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, (index, g.dtype, w.dtype, g.shape, w.shape)
        mismatched = int(np.count_nonzero(g != w))
        assert mismatched == 0, f"output {index}: {mismatched} of {w.size} values differ from onnxruntime"
    return plan


def _random_bytes(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)


def _scale(rng: np.random.Generator, tie: bool) -> np.ndarray:
    """A scale: a power of two (products and quotients land on ties) or an arbitrary one."""
    value = 2.0 ** rng.integers(-7, 1) if tie else rng.uniform(0.003, 0.3)
    return np.array(value, dtype=np.float32)


def _zero(rng: np.random.Generator, dtype: np.dtype[Any]) -> np.ndarray:
    return _random_bytes(rng, (), dtype)


# ---------------------------------------------------------------------------------------------------------------------
# QLinearAdd / QLinearMul

BINARY_SHAPES = [
    ((3, 5), (3, 5)),
    ((2, 3, 7), (7,)),  # B a vector per row span
    ((4, 1), (1, 7)),  # both broadcast
    ((2, 3, 1), (3, 5)),  # A scalar per span
    ((2, 3, 5), (3, 1)),  # B scalar per span
    ((), (3, 4)),  # rank-0 A
    ((5, 3), (1,)),  # one-value B
    ((4, 1, 1), (1, 7, 1)),  # trailing 1s: the axis before decides
]


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", BYTES, ids=str)
@pytest.mark.parametrize("shapes", BINARY_SHAPES, ids=str)
def test_binary_matches_onnxruntime(op: str, dtype: np.dtype[Any], shapes: Any, device: Any) -> None:
    rng = np.random.default_rng(0)
    a_shape, b_shape = shapes
    tie = bool(rng.integers(0, 2))
    constants = {name: _scale(rng, tie) for name in ("sa", "sb", "sc")}
    constants.update({name: _zero(rng, dtype) for name in ("za", "zb", "zc")})
    node = helper.make_node(op, ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["c"], domain=MS)
    model = _model([node], {"a": (dtype, a_shape), "b": (dtype, b_shape)}, {"c": dtype}, constants)
    feeds = {"a": _random_bytes(rng, a_shape, dtype), "b": _random_bytes(rng, b_shape, dtype)}
    plan = _check_exact(model, feeds, device)
    assert [step.placement for step in plan.steps] == ["webgpu"]


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", BYTES, ids=str)
@pytest.mark.parametrize("b_shape", [(256, 256), (256, 1)], ids=["pairs", "b-scalar-per-span"])
def test_binary_every_byte_pair(op: str, dtype: np.dtype[Any], b_shape: tuple[int, ...], device: Any) -> None:
    """All 65536 byte pairs at tie-prone scales (powers of two)."""
    rng = np.random.default_rng(0)
    bytes_ = np.arange(256, dtype=np.uint8).view(dtype)
    constants = {"sa": np.float32(0.25), "sb": np.float32(0.125), "sc": np.float32(0.5)}
    constants.update({name: _zero(rng, dtype) for name in ("za", "zb", "zc")})
    node = helper.make_node(op, ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["c"], domain=MS)
    a = np.broadcast_to(bytes_[None, :], (256, 256)).copy()
    b = np.broadcast_to(bytes_[rng.permutation(256)][:, None], b_shape).copy()  # row i: one b against every a
    model = _model([node], {"a": (dtype, a.shape), "b": (dtype, b_shape)}, {"c": dtype}, constants)
    _check_exact(model, {"a": a, "b": b}, device)


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_binary_absent_zero_points_are_zero(op: str, device: Any) -> None:
    """The schema makes the zero points optional (0); onnxruntime's type inference wants them all, so its result
    with explicit zeros judges."""
    rng = np.random.default_rng(0)
    dtype = np.dtype(np.int8)
    constants = {name: _scale(rng, True) for name in ("sa", "sb", "sc")}
    bare = helper.make_node(op, ["a", "sa", "", "b", "sb", "", "sc", ""], ["c"], domain=MS)
    zeros = helper.make_node(op, ["a", "sa", "z", "b", "sb", "z", "sc", "z"], ["c"], domain=MS)
    inputs = {"a": (dtype, (3, 7)), "b": (dtype, (3, 7))}
    feeds = {"a": _random_bytes(rng, (3, 7), dtype), "b": _random_bytes(rng, (3, 7), dtype)}
    got, _ = run_model(_model([bare], inputs, {"c": dtype}, constants).SerializeToString(), feeds, device,
                       allow_cpu=False)  # fmt: skip
    want = _onnxruntime(_model([zeros], inputs, {"c": dtype}, {**constants, "z": np.int8(0)}), feeds)
    np.testing.assert_array_equal(got[0], want[0])


def test_broadcast_spans_follow_onnxruntime() -> None:
    """Which input onnxruntime reads as a scalar per span decides QLinearAdd's rounding order."""
    assert scalar_input((3, 5), (3, 5)) == ""
    assert scalar_input((2, 3, 1), (3, 5)) == "a"
    assert scalar_input((2, 3, 5), (3, 1)) == "b"
    assert scalar_input((), (3,)) == "a"
    assert scalar_input((3, 1), ()) == "a"
    assert scalar_input((3, 4), ()) == "b"
    assert scalar_input((4, 1, 1), (1, 7, 1)) == "a"  # the trailing 1s are skipped
    assert scalar_input((4, 7, 1), (7, 1)) == ""


# ---------------------------------------------------------------------------------------------------------------------
# QLinearSigmoid / QLinearLeakyRelu


@pytest.mark.parametrize("op, attrs", [("QLinearSigmoid", {}), ("QLinearLeakyRelu", {}),
                                       ("QLinearLeakyRelu", {"alpha": 0.3})], ids=["sigmoid", "leaky", "leaky-0.3"])  # fmt: skip
@pytest.mark.parametrize("dtype", BYTES, ids=str)
@pytest.mark.parametrize("zero_points", [True, False], ids=["zero-points", "no-zero-points"])
def test_lookup_activations(
    op: str, attrs: dict[str, Any], dtype: np.dtype[Any], zero_points: bool, device: Any
) -> None:
    rng = np.random.default_rng(0)
    constants: dict[str, np.ndarray] = {"sx": _scale(rng, False), "sy": _scale(rng, True)}
    names = ["x", "sx", "", "sy", ""]
    if zero_points:
        constants.update({"zx": _zero(rng, dtype), "zy": _zero(rng, dtype)})
        names = ["x", "sx", "zx", "sy", "zy"]
    node = helper.make_node(op, names, ["y"], domain=MS, **attrs)
    every = np.arange(256, dtype=np.uint8).view(dtype)
    x = np.concatenate([every, _random_bytes(rng, (2 * 3 * 7 * 7 - 256,), dtype)]).reshape(2, 3, 7, 7)
    model = _model([node], {"x": (dtype, x.shape)}, {"y": dtype}, constants)
    _check_exact(model, {"x": x}, device)


# ---------------------------------------------------------------------------------------------------------------------
# QLinearConcat


@pytest.mark.parametrize("dtype", BYTES, ids=str)
@pytest.mark.parametrize("axis", [1, -1, 0])
def test_concat_requantizes_each_input(dtype: np.dtype[Any], axis: int, device: Any) -> None:
    rng = np.random.default_rng(0)
    base = [2, 3, 5]
    sizes = [3, 1, 4]
    shapes = [tuple(size if d == axis % 3 else base[d] for d in range(3)) for size in sizes]
    constants: dict[str, np.ndarray] = {"sy": _scale(rng, True), "zy": _zero(rng, dtype)}
    names = ["sy", "zy"]
    for k in range(3):
        if k == 1:  # the output's own parameters: copied as it is
            constants[f"s{k}"], constants[f"z{k}"] = constants["sy"], constants["zy"]
        else:
            constants[f"s{k}"], constants[f"z{k}"] = _scale(rng, k == 2), _zero(rng, dtype)
        names += [f"x{k}", f"s{k}", f"z{k}"]
    node = helper.make_node("QLinearConcat", names, ["y"], domain=MS, axis=axis)
    inputs = {f"x{k}": (dtype, shapes[k]) for k in range(3)}
    model = _model([node], inputs, {"y": dtype}, constants)
    _check_exact(model, {f"x{k}": _random_bytes(rng, shapes[k], dtype) for k in range(3)}, device)


# ---------------------------------------------------------------------------------------------------------------------
# QLinearGlobalAveragePool


@pytest.mark.parametrize("dtype", BYTES, ids=str)
@pytest.mark.parametrize(
    "shape, channels_last",
    [((2, 3, 5, 7), 0), ((2, 5, 7, 3), 1), ((1, 4, 9), 0), ((3, 2, 2, 2, 5), 1), ((1, 1, 6, 6), 1)],
    ids=["nchw", "nhwc", "1d", "3d-channels-last", "one-channel-last"],
)
def test_global_average_pool(dtype: np.dtype[Any], shape: tuple[int, ...], channels_last: int, device: Any) -> None:
    rng = np.random.default_rng(0)
    constants = {"sx": _scale(rng, True), "zx": _zero(rng, dtype), "sy": _scale(rng, False), "zy": _zero(rng, dtype)}
    attrs = {"channels_last": channels_last} if channels_last else {}
    node = helper.make_node("QLinearGlobalAveragePool", ["x", "sx", "zx", "sy", "zy"], ["y"], domain=MS, **attrs)
    model = _model([node], {"x": (dtype, shape)}, {"y": dtype}, constants)
    _check_exact(model, {"x": _random_bytes(rng, shape, dtype)}, device)


# ---------------------------------------------------------------------------------------------------------------------
# Scales known only at run time, and invalid nodes


def test_run_time_scales_run_on_the_cpu(device: Any) -> None:
    rng = np.random.default_rng(0)
    dtype = np.dtype(np.uint8)
    node = helper.make_node("QLinearAdd", ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["c"], domain=MS)
    constants = {"sb": _scale(rng, False), "sc": _scale(rng, False), "zb": _zero(rng, dtype), "zc": _zero(rng, dtype),
                 "za": _zero(rng, dtype)}  # fmt: skip
    model = _model(
        [node], {"a": (dtype, (3, 4)), "b": (dtype, (3, 4)), "sa": (np.float32, ())}, {"c": dtype}, constants
    )
    feeds = {"a": _random_bytes(rng, (3, 4), dtype), "b": _random_bytes(rng, (3, 4), dtype), "sa": _scale(rng, True)}
    got, plan = run_model(model.SerializeToString(), feeds, device)
    assert plan.steps[0].placement == "cpu" and "run time" in plan.steps[0].reason
    np.testing.assert_array_equal(got[0], _onnxruntime(model, feeds)[0])


def _invalid(node: onnx.NodeProto, inputs: dict[str, tuple[Any, tuple[int, ...]]], constants: dict[str, Any]) -> bytes:
    return _model([node], inputs, {name: np.uint8 for name in node.output}, constants).SerializeToString()


def test_invalid_nodes_raise_typed_errors(device: Any) -> None:
    u8, i8, f32 = np.dtype(np.uint8), np.dtype(np.int8), np.float32
    one, zero = np.array(0.5, f32), np.array(3, np.uint8)
    add = helper.make_node("QLinearAdd", ["a", "s", "z", "b", "s", "z", "s", "z"], ["c"], domain=MS)
    feeds = {"a": np.zeros((2, 3), u8), "b": np.zeros((2, 3), i8)}
    with pytest.raises(UnsupportedOpError, match="QLinearAdd: A is uint8 but B is int8"):
        run_model(_invalid(add, {"a": (u8, (2, 3)), "b": (i8, (2, 3))}, {"s": one, "z": zero}), feeds, device)
    feeds = {"a": np.zeros((2, 3), u8), "b": np.zeros((2, 4), u8)}
    with pytest.raises((ShapeError, ModelError), match="QLinearAdd: shapes"):
        run_model(_invalid(add, {"a": (u8, (2, 3)), "b": (u8, (2, 4))}, {"s": one, "z": zero}), feeds, device)
    feeds = {"a": np.zeros((2, 3), u8), "b": np.zeros((2, 3), u8)}
    two = np.array([0.5, 0.25], f32)
    with pytest.raises((ShapeError, ModelError), match="QLinearAdd: A_scale must be a scalar"):
        run_model(_invalid(add, {"a": (u8, (2, 3)), "b": (u8, (2, 3))}, {"s": two, "z": zero}), feeds, device)
    concat = helper.make_node("QLinearConcat", ["s", "z", "a", "s", "z"], ["c"], domain=MS)
    with pytest.raises(UnsupportedOpError, match="QLinearConcat: the 'axis' attribute is required"):
        run_model(_invalid(concat, {"a": (u8, (2, 3))}, {"s": one, "z": zero}), {"a": feeds["a"]}, device)
    pool = helper.make_node("QLinearGlobalAveragePool", ["a", "s", "z", "s", "z"], ["c"], domain=MS)
    with pytest.raises((ShapeError, ModelError), match="QLinearGlobalAveragePool: X must have rank >= 3"):
        run_model(_invalid(pool, {"a": (u8, (2, 3))}, {"s": one, "z": zero}), {"a": feeds["a"]}, device)
    tiny = helper.make_node("QLinearGlobalAveragePool", ["a", "s", "z", "big", "z"], ["c"], domain=MS)
    constants = {"s": np.array(1e-9, f32), "big": np.array(1e3, f32), "z": zero}
    with pytest.raises(UnsupportedOpError, match="outside the range onnxruntime computes"):
        run_model(_invalid(tiny, {"a": (u8, (1, 2, 3))}, constants), {"a": np.zeros((1, 2, 3), u8)}, device)
    sigmoid = helper.make_node("QLinearSigmoid", ["a", "s", "z", "s", "z"], ["c"], domain=MS)
    with pytest.raises(UnsupportedOpError, match="QLinearSigmoid: X of dtype float32"):
        run_model(_invalid(sigmoid, {"a": (f32, (2, 3))}, {"s": one, "z": zero}), {"a": np.zeros((2, 3), f32)}, device)


# ---------------------------------------------------------------------------------------------------------------------
# DynamicQuantizeLSTM


#: How far an output may be from onnxruntime's (one thread): both quantize the same values with the same exact
#: quotients and sum the same integers; the activations differ by float32 ulps (at most 1e-6 seen over 30 random
#: nodes on lavapipe).  A hidden-state value within those ulps of a rounding tie would quantize one step apart and
#: exceed this; none does in these seeded cases.
LSTM_TOLERANCE = 1e-5


def _onnxruntime_one_thread(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime CPU with one thread: with more, it splits the batch rows among its threads and quantizes each
    thread's hidden states on their own range, so its result depends on its thread count."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [np.asarray(v) for v in session.run(None, feeds)]


def _lstm_case(
    rng: np.random.Generator,
    dtype: np.dtype[Any],
    direction: str = "forward",
    per_channel: bool = False,
    *,
    sizes: tuple[int, int, int, int] = (4, 3, 5, 6),
    bias: bool = False,
    lengths: list[int] | None = None,
    states: bool = False,
    peepholes: bool = False,
    outputs: tuple[str, ...] = ("Y", "Y_h", "Y_c"),
    **attributes: Any,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A DynamicQuantizeLSTM node of ``sizes`` (seq, batch, input, hidden) with random 8-bit weights."""
    seq, batch, size, hidden = sizes
    directions = 2 if direction == "bidirectional" else 1
    columns = 4 * hidden
    constants: dict[str, np.ndarray] = {}
    for name, rows in (("W", size), ("R", hidden)):
        constants[name] = _random_bytes(rng, (directions, rows, columns), dtype)
        shape = (directions, columns) if per_channel else (directions,)
        constants[f"{name}_scale"] = rng.uniform(0.002, 0.01, shape).astype(np.float32)
        zero = _random_bytes(rng, shape, dtype)
        if per_channel:  # onnxruntime takes per-channel zero points only when they are one value (0 for int8)
            zero = np.zeros(shape, dtype) if dtype == np.int8 else np.full(shape, zero.reshape(-1)[0], dtype)
        constants[f"{name}_zero_point"] = zero
    names = ["X", "W", "R", "", "", "", "", ""]
    feeds = {"X": rng.standard_normal((seq, batch, size)).astype(np.float32)}
    inputs: dict[str, tuple[Any, tuple[int, ...]]] = {"X": (np.float32, (seq, batch, size))}
    if bias:
        constants["B"] = rng.uniform(-0.2, 0.2, (directions, 8 * hidden)).astype(np.float32)
        names[3] = "B"
    if lengths is not None:
        feeds["lengths"] = np.array(lengths, np.int32)
        inputs["lengths"] = (np.int32, (batch,))
        names[4] = "lengths"
    if states:
        for position, name in ((5, "h0"), (6, "c0")):
            feeds[name] = rng.uniform(-0.5, 0.5, (directions, batch, hidden)).astype(np.float32)
            inputs[name] = (np.float32, (directions, batch, hidden))
            names[position] = name
    if peepholes:
        constants["P"] = rng.uniform(-0.5, 0.5, (directions, 3 * hidden)).astype(np.float32)
        names[7] = "P"
    names += ["W_scale", "W_zero_point", "R_scale", "R_zero_point"]
    node = helper.make_node(
        "DynamicQuantizeLSTM", names, [n if n in outputs else "" for n in ("Y", "Y_h", "Y_c")], domain=MS,
        hidden_size=hidden, direction=direction, **attributes,
    )  # fmt: skip
    return _model([node], inputs, dict.fromkeys(outputs, np.float32), constants), feeds


def _check_lstm(model: onnx.ModelProto, feeds: dict[str, np.ndarray], device: Any) -> None:
    """On the device, every output within LSTM_TOLERANCE of onnxruntime (one thread) and of the reference (which
    computes onnxruntime's arithmetic in numpy: the same tolerance, for the same reason)."""
    got, plan = run_model(model.SerializeToString(), feeds, device, allow_cpu=False)
    assert [step.placement for step in plan.steps] == ["webgpu"]
    expected = _reference_outputs(model, feeds)
    peer = _onnxruntime_one_thread(model, feeds)
    assert len(got) == len(peer)
    for g, e, p in zip(got, expected, peer):
        assert g.shape == p.shape
        np.testing.assert_allclose(g, p, rtol=0, atol=LSTM_TOLERANCE)
        np.testing.assert_allclose(g, e, rtol=0, atol=LSTM_TOLERANCE)


def _reference_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The operator's reference on the node's inputs (the CPU path)."""
    from ortgpu.ops import get_operator
    from ortgpu.ops._kernel import TensorInfo

    node = model.graph.node[0]
    constants = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    values = {**constants, **feeds, "": None}
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    seq, batch = feeds["X"].shape[:2]
    directions, hidden = 2 if attrs.get("direction") == b"bidirectional" else 1, int(attrs["hidden_size"])
    shapes = [(seq, directions, batch, hidden), (directions, batch, hidden), (directions, batch, hidden)]
    infos = [TensorInfo(shape if name else (0,), np.dtype(np.float32)) for shape, name in zip(shapes, node.output)]
    operator = get_operator("DynamicQuantizeLSTM", 1, MS)
    results = operator.reference([values[name] for name in node.input], attrs, infos)
    return [result for result, name in zip(results, node.output) if name]


@pytest.mark.parametrize("dtype", BYTES, ids=str)
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
@pytest.mark.parametrize("extras", [False, True], ids=["bare", "bias-lengths-states"])
def test_dynamic_quantize_lstm(dtype: np.dtype[Any], direction: str, per_channel: bool, extras: bool,
                               device: Any) -> None:  # fmt: skip
    options: dict[str, Any] = {"bias": True, "lengths": [4, 2, 3], "states": True} if extras else {}
    model, feeds = _lstm_case(np.random.default_rng(0), dtype, direction, per_channel, **options)
    _check_lstm(model, feeds, device)


@pytest.mark.parametrize(
    "options",
    [
        # a reverse direction walks each row's own length back: rows at different times share a step's range
        {"direction": "reverse", "lengths": [5, 2, 0, 4], "states": True, "bias": True},
        {"direction": "bidirectional", "peepholes": True, "clip": 0.8, "input_forget": 1, "bias": True},
        # without Y an ended row keeps its state, which stays in the later steps' range (with Y it reads 0); no row
        # of length 0 here: onnxruntime then reads that row's state from memory it never wrote
        {"direction": "bidirectional", "lengths": [5, 1, 3, 2], "states": True, "outputs": ("Y_h", "Y_c")},
        {"direction": "forward", "lengths": [5, 1, 3, 2], "states": True, "outputs": ("Y", "Y_h")},
        {
            "direction": "forward",
            "activations": ["HardSigmoid", "Relu", "Softsign"],
            "activation_alpha": [0.3],
            "activation_beta": [0.4],
            "bias": True,
        },
    ],
    ids=["reverse-lengths", "peepholes-clip-coupled", "no-y", "lengths-y", "activations"],
)
def test_dynamic_quantize_lstm_options(options: dict[str, Any], device: Any) -> None:
    dtype = np.dtype(np.uint8)
    model, feeds = _lstm_case(np.random.default_rng(1), dtype, sizes=(5, 4, 7, 6), **options)
    _check_lstm(model, feeds, device)


@pytest.mark.parametrize("dtype", BYTES, ids=str)
def test_dynamic_quantize_lstm_wider_than_a_workgroup(dtype: np.dtype[Any], device: Any) -> None:
    """More hidden units and batch rows than one workgroup holds (the range spans workgroup-sized chunks), more than
    4 rows (where onnxruntime would split the batch among threads) and a long input row."""
    model, feeds = _lstm_case(np.random.default_rng(2), dtype, "bidirectional", True, sizes=(3, 6, 300, 80),
                              bias=True, lengths=[3, 1, 2, 3, 0, 2], states=True)  # fmt: skip
    _check_lstm(model, feeds, device)


def test_dynamic_quantize_lstm_reference_is_onnxruntimes_arithmetic() -> None:
    """The reference alone (float32 numpy) against onnxruntime with one thread, on many random nodes: within float32
    rounding of the activations (the integer parts are equal)."""
    worst = 0.0
    for seed in range(24):
        rng = np.random.default_rng(seed)
        dtype = BYTES[seed % 2]
        direction = ["forward", "reverse", "bidirectional"][seed % 3]
        lengths = [int(n) for n in rng.integers(0, 5, 3)] if seed % 4 else None
        model, feeds = _lstm_case(rng, dtype, direction, bool(seed % 5 < 2), bias=True, lengths=lengths,
                                  states=bool(seed % 2), sizes=(4, 3, 5, 6))  # fmt: skip
        for mine, peer in zip(_reference_outputs(model, feeds), _onnxruntime_one_thread(model, feeds)):
            worst = max(worst, float(np.abs(mine - peer).max()))
    assert worst < 1e-5, worst


@pytest.mark.parametrize("lengths", [[4, 5, 1], [-1, 2, 1]], ids=["too-long", "negative"])
def test_dynamic_quantize_lstm_invalid_lengths_raise(lengths: list[int], env: Any) -> None:
    """Lengths are read at run time: invalid ones make that run raise, and the session runs on."""
    model, feeds = _lstm_case(np.random.default_rng(0), np.dtype(np.uint8), lengths=[4, 2, 1])
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
        assert {p.placement for p in session.get_node_placement()} == {"webgpu"}
        first = session.run(None, feeds)
        with pytest.raises(InvalidArgumentError, match=r"sequence_lens must lie in \[0, seq_length\]"):
            session.run(None, {**feeds, "lengths": np.array(lengths, np.int32)})
        for before, after in zip(first, session.run(None, feeds)):
            np.testing.assert_array_equal(np.asarray(before), np.asarray(after))


def test_dynamic_quantize_lstm_refuses_misshapen_weights(device: Any) -> None:
    rng = np.random.default_rng(0)
    model, feeds = _lstm_case(rng, np.dtype(np.uint8))
    for tensor in model.graph.initializer:
        if tensor.name == "W_scale":
            tensor.CopyFrom(onnx.numpy_helper.from_array(np.full((3,), 0.01, np.float32), "W_scale"))
    with pytest.raises((ShapeError, ModelError), match="DynamicQuantizeLSTM: W's scale has shape"):
        run_model(model.SerializeToString(), feeds, device)


# ---------------------------------------------------------------------------------------------------------------------
# What onnxruntime's quantization tools write


class _Calibration:
    """A tiny calibration data reader for ``quantize_static``."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self._feeds = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def test_quantize_static_qoperator_model(device: Any, tmp_path: Any) -> None:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(0)
    shape = (1, 4, 5, 5)
    nodes = [
        helper.make_node("Sigmoid", ["X"], ["s"]),
        helper.make_node("LeakyRelu", ["X"], ["l"], alpha=0.1),
        helper.make_node("Add", ["s", "l"], ["a"]),
        helper.make_node("Mul", ["a", "X"], ["m"]),
        helper.make_node("Concat", ["m", "s"], ["c"], axis=1),
        helper.make_node("GlobalAveragePool", ["c"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes, "float", [helper.make_tensor_value_info("X", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    float_path, quantized_path = tmp_path / "float.onnx", tmp_path / "quantized.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), float_path)
    calibration = _Calibration([{"X": rng.standard_normal(shape).astype(np.float32)} for _ in range(4)])
    quantize_static(
        str(float_path), str(quantized_path), calibration, quant_format=QuantFormat.QOperator,
        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
    )  # fmt: skip
    model = onnx.load(quantized_path)
    contributed = {node.op_type for node in model.graph.node if node.domain == MS}
    assert {"QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat",
            "QLinearGlobalAveragePool"} <= contributed, contributed  # fmt: skip
    feeds = {"X": rng.standard_normal(shape).astype(np.float32)}
    _check_exact(model, feeds, device)


def test_quantize_dynamic_lstm_model(device: Any, tmp_path: Any) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    seq, batch, size, hidden = 3, 2, 6, 5
    weights = {
        "W": rng.uniform(-0.5, 0.5, (1, 4 * hidden, size)).astype(np.float32),
        "R": rng.uniform(-0.5, 0.5, (1, 4 * hidden, hidden)).astype(np.float32),
        "B": rng.uniform(-0.1, 0.1, (1, 8 * hidden)).astype(np.float32),
    }
    node = helper.make_node("LSTM", ["X", "W", "R", "B"], ["Y", "Y_h"], hidden_size=hidden)
    graph = helper.make_graph(
        [node], "float", [helper.make_tensor_value_info("X", TensorProto.FLOAT, (seq, batch, size))],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Y", "Y_h")],
        [onnx.numpy_helper.from_array(v, k) for k, v in weights.items()],
    )  # fmt: skip
    float_path, quantized_path = tmp_path / "float.onnx", tmp_path / "quantized.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), float_path)
    quantize_dynamic(str(float_path), str(quantized_path), weight_type=QuantType.QInt8)
    model = onnx.load(quantized_path)
    assert [n.op_type for n in model.graph.node if n.domain == MS] == ["DynamicQuantizeLSTM"]
    feeds = {"X": rng.standard_normal((seq, batch, size)).astype(np.float32)}
    _check_lstm(model, feeds, device)


@pytest.mark.parametrize("sizes", [(0, 2, 5, 6), (3, 0, 5, 6), (3, 2, 0, 6)], ids=["no-steps", "no-rows", "no-inputs"])
def test_dynamic_quantize_lstm_empty_dimensions(sizes: tuple[int, int, int, int], device: Any) -> None:
    """Empty dimensions run on the CPU and give zeros without a bias or states, as the LSTM's equations do (no steps:
    onnxruntime leaves Y_h and Y_c unwritten, their values varied run to run; no rows: it aborts the process)."""
    model, feeds = _lstm_case(np.random.default_rng(0), np.dtype(np.uint8), sizes=sizes)
    got, _ = run_model(model.SerializeToString(), feeds, device)
    seq, batch, _, hidden = sizes
    assert [g.shape for g in got] == [(seq, 1, batch, hidden), (1, batch, hidden), (1, batch, hidden)]
    assert all(not np.any(g) for g in got)
