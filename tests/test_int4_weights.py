"""4-bit weights (ONNX INT4/UINT4 constants): loading, DequantizeLinear and GatherBlockQuantized over them, on both
backends, against onnxruntime CPU.

The loader keeps 4-bit initializers and Constants as ``ml_dtypes.int4``/``uint4`` arrays; the planner widens them
into the 8-bit layouts the kernels read (``ortgpu._four_bit``).  Dequantized values must equal onnxruntime's
exactly (one float32 product each), the MatMul after them within 1e-4 of the output's largest magnitude.  Models
load with ``max_fold_bytes=0`` so that a DequantizeLinear of a weight larger than the always-folded size runs as a
step (folded at load time it would never reach the device).
"""

from __future__ import annotations

import gc
from typing import Any, Iterator

import ml_dtypes
import numpy as np
import onnx
import onnxruntime
import pytest
from helpers import run_model
from onnx import TensorProto, helper, numpy_helper
from test_ops_elementwise import open_device

import ortgpu
from ortgpu._executor import device_caps
from ortgpu._planner import plan_model
from ortgpu.loader._model import load_model
from ortgpu_core._errors import ModelError, UnsupportedOpError
from ortgpu_core.backends.protocol import BackendDevice

MS = "com.microsoft"
F32 = np.float32
INT4, UINT4 = np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4)
K, N = 24, 20  # a 24x20 float32 weight (1920 bytes) is above the size the loader always folds


@pytest.fixture(scope="module", params=["fake", "wgpu"])
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def op_device(backend_name: str) -> Iterator[BackendDevice]:
    device = open_device(backend_name)
    try:
        yield device
        gc.collect()
        assert device.live_handles() == 0, "the tests leaked device objects"
    finally:
        device.destroy()


def _codes(dtype: np.dtype[Any], shape: tuple[int, ...], seed: int) -> np.ndarray:
    low, high = (-8, 8) if dtype == INT4 else (0, 16)
    return np.random.default_rng(seed).integers(low, high, shape).astype(dtype)


def _model(nodes: list[Any], inputs: list[Any], outputs: list[str], inits: list[Any], opset: int = 21) -> Any:
    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])


def _onnxruntime(model: Any, feeds: dict[str, np.ndarray], optimize: bool = True) -> list[np.ndarray]:
    """onnxruntime CPU's outputs; ``optimize=False`` runs the graph as written (its default session fuses a
    blockwise DequantizeLinear and MatMul into MatMulNBits at accuracy level 4, which quantizes A to int8)."""
    options = onnxruntime.SessionOptions()
    if not optimize:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [np.asarray(value) for value in session.run(None, feeds)]


def _close(got: np.ndarray, want: np.ndarray, tolerance: float = 1e-4) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    scale = max(1.0, float(np.abs(want.astype(np.float64)).max(initial=0.0)))
    assert float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max(initial=0.0)) <= tolerance * scale


def _placements(plan: Any) -> dict[str, str]:
    return {row[0]: row[2] for row in plan.placement}


# -- loading ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [INT4, UINT4], ids=["int4", "uint4"])
def test_four_bit_initializers_load_as_ml_dtypes(dtype: np.dtype[Any]) -> None:
    codes = _codes(dtype, (3, 5), 1)  # an odd element count: the last byte holds one nibble
    model = _model(
        [helper.make_node("DequantizeLinear", ["w", "s"], ["y"])],
        [],
        ["y"],
        [numpy_helper.from_array(codes, "w"), numpy_helper.from_array(np.array(0.5, F32), "s")],
    )
    stored = model.graph.initializer[0]
    assert stored.data_type == (TensorProto.INT4 if dtype == INT4 else TensorProto.UINT4) and len(stored.raw_data) == 8
    loaded = load_model(model.SerializeToString(), max_fold_bytes=0)
    value = loaded.initializers["w"]
    assert value.dtype == dtype and value.shape == (3, 5)
    np.testing.assert_array_equal(value.astype(np.int8), codes.astype(np.int8))


def test_a_four_bit_constant_node_loads(op_device: BackendDevice) -> None:
    codes = _codes(INT4, (K, N), 2)
    value = helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(codes, "c"))
    nodes = [
        value,
        helper.make_node("DequantizeLinear", ["w", "s"], ["wd"]),
        helper.make_node("MatMul", ["x", "wd"], ["y"]),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, K])],
        ["wd", "y"],
        [numpy_helper.from_array(np.array(0.25, F32), "s")],
    )
    feeds = {"x": np.random.default_rng(3).standard_normal((3, K)).astype(F32)}
    (wd, y), plan = run_model(load_model(model.SerializeToString(), max_fold_bytes=0), feeds, op_device)
    want_wd, want_y = _onnxruntime(model, feeds)
    np.testing.assert_array_equal(wd, want_wd)
    _close(y, want_y)
    assert all(row[2] == "webgpu" for row in plan.placement), plan.placement


@pytest.mark.parametrize("dtype", [TensorProto.INT4, TensorProto.UINT4], ids=["int4", "uint4"])
def test_four_bit_graph_inputs_and_outputs_are_refused(dtype: int) -> None:
    scale = numpy_helper.from_array(np.array(1.0, F32), "s")
    as_input = _model(
        [helper.make_node("DequantizeLinear", ["w", "s"], ["y"])],
        [helper.make_tensor_value_info("w", dtype, [4])],
        ["y"],
        [scale],
    )
    name = TensorProto.DataType.Name(dtype)
    with pytest.raises(UnsupportedOpError, match=rf"graph input 'w' has element type {name}.*only as constants"):
        load_model(as_input.SerializeToString())
    as_output = helper.make_model(
        helper.make_graph(
            [helper.make_node("Identity", ["w"], ["y"])],
            "g",
            [],
            [helper.make_tensor_value_info("y", dtype, [4])],
            [numpy_helper.from_array(_codes(INT4 if dtype == TensorProto.INT4 else UINT4, (4,), 0), "w")],
        ),
        opset_imports=[helper.make_opsetid("", 21)],
    )
    with pytest.raises(UnsupportedOpError, match=rf"graph output 'y' has element type {name}.*int8/uint8"):
        load_model(as_output.SerializeToString())


# -- DequantizeLinear ------------------------------------------------------------------------------------------------

# (granularity, zero point present): per tensor, per axis (the weight's N axis), blocked along K (block 8, and a
# block of 16 whose last block is partial).
DEQUANTIZE_CASES = [
    ("per_tensor", False),
    ("per_tensor", True),
    ("per_axis", False),
    ("per_axis", True),
    ("blocked", False),
    ("blocked", True),
    ("blocked_partial", True),
]


def _dequantize_parameters(kind: str, dtype: np.dtype[Any], seed: int) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if kind == "per_tensor":
        shape: tuple[int, ...] = ()
        attrs: dict[str, Any] = {}
    elif kind == "per_axis":
        shape, attrs = (N,), {"axis": 1}
    else:
        block = 8 if kind == "blocked" else 16
        shape, attrs = (-(-K // block), N), {"axis": 0, "block_size": block}
    scale = rng.uniform(0.01, 0.2, shape).astype(F32)
    return attrs, scale, _codes(dtype, shape, seed + 1)


@pytest.mark.parametrize("dtype", [INT4, UINT4], ids=["int4", "uint4"])
@pytest.mark.parametrize(
    ("kind", "with_zero"), DEQUANTIZE_CASES, ids=[f"{k}-{'zp' if z else 'nozp'}" for k, z in DEQUANTIZE_CASES]
)
def test_dequantize_linear_of_a_four_bit_weight_feeding_a_matmul(
    op_device: BackendDevice, dtype: np.dtype[Any], kind: str, with_zero: bool
) -> None:
    attrs, scale, zero = _dequantize_parameters(kind, dtype, 5)
    weight = _codes(dtype, (K, N), 7)
    inits = [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(scale, "s")]
    names = ["w", "s"]
    if with_zero:
        inits.append(numpy_helper.from_array(zero, "z"))
        names.append("z")
    nodes = [
        helper.make_node("DequantizeLinear", names, ["wd"], name="dequantize", **attrs),
        helper.make_node("MatMul", ["x", "wd"], ["y"], name="matmul"),
    ]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, K])], ["wd", "y"], inits)
    feeds = {"x": np.random.default_rng(9).standard_normal((3, K)).astype(F32)}
    (wd, y), plan = run_model(load_model(model.SerializeToString(), max_fold_bytes=0), feeds, op_device)
    want_wd, want_y = _onnxruntime(model, feeds)
    np.testing.assert_array_equal(wd, want_wd)
    _close(y, want_y)
    where = _placements(plan)
    assert where["matmul"] == "webgpu"
    # per tensor and per axis run the 8-bit kernel on the widened weight; blocked scales run on the CPU (as 8-bit)
    assert where["dequantize"] == ("cpu" if kind.startswith("blocked") else "webgpu"), plan.placement
    # the weight is uploaded widened, never as 4-bit bytes
    assert all(plan.constants[name].dtype not in (INT4, UINT4) for name in plan.constant_keys)


def test_a_small_four_bit_weight_folds_at_load() -> None:
    """Below the always-folded size, DequantizeLinear folds at load time: the reference reads the 4-bit arrays."""
    weight = _codes(INT4, (4, 3), 11)
    model = _model(
        [helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wd"]), helper.make_node("MatMul", ["x", "wd"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        ["y"],
        [
            numpy_helper.from_array(weight, "w"),
            numpy_helper.from_array(np.array(0.5, F32), "s"),
            numpy_helper.from_array(np.array(-3, ml_dtypes.int4), "z"),
        ],
    )
    loaded = load_model(model.SerializeToString())
    assert [node.op_type for node in loaded.nodes] == ["MatMul"]
    wd = next(value for name, value in loaded.constants.items() if name not in ("w", "s", "z"))
    np.testing.assert_array_equal(wd, (weight.astype(np.float32) + 3) * F32(0.5))


def test_a_zero_point_of_another_type_is_refused(op_device: BackendDevice) -> None:
    model = _model(
        [helper.make_node("DequantizeLinear", ["w", "s", "z"], ["y"])],
        [],
        ["y"],
        [
            numpy_helper.from_array(_codes(INT4, (4,), 0), "w"),
            numpy_helper.from_array(np.array(1.0, F32), "s"),
            numpy_helper.from_array(np.array(0, np.int8), "z"),
        ],
    )
    with pytest.raises(ModelError, match="DequantizeLinear: zero point int8 differs from the input's int4"):
        run_model(load_model(model.SerializeToString(), max_fold_bytes=0), {}, op_device)


# -- GatherBlockQuantized --------------------------------------------------------------------------------------------

GATHER_CASES = [(8, 16, False), (8, 16, True), (6, 48, True), (5, 40, False), (4, 33, True)]


@pytest.mark.parametrize("dtype", [INT4, UINT4], ids=["int4", "uint4"])
@pytest.mark.parametrize(
    ("rows", "last", "with_zero"), GATHER_CASES, ids=[f"{r}x{c}-{'zp' if z else 'nozp'}" for r, c, z in GATHER_CASES]
)
def test_gather_block_quantized_over_four_bit_data(
    op_device: BackendDevice, dtype: np.dtype[Any], rows: int, last: int, with_zero: bool
) -> None:
    block = 16
    blocks = -(-last // block)
    rng = np.random.default_rng(rows * 100 + last)
    inits = [
        numpy_helper.from_array(_codes(dtype, (rows, last), 13), "data"),
        numpy_helper.from_array(rng.uniform(0.05, 1.0, (rows, blocks)).astype(F32), "scales"),
    ]
    names = ["data", "indices", "scales"]
    if with_zero:
        inits.append(numpy_helper.from_array(_codes(dtype, (rows, blocks), 17), "zeros"))
        names.append("zeros")
    node = helper.make_node("GatherBlockQuantized", names, ["y"], domain=MS, name="gather", block_size=block)
    model = _model([node], [helper.make_tensor_value_info("indices", TensorProto.INT64, [2, 3])], ["y"], inits)
    feeds = {"indices": np.array([[0, rows - 1, 2], [-1, 1, 0]], np.int64)}
    (y,), plan = run_model(load_model(model.SerializeToString(), max_fold_bytes=0), feeds, op_device)
    (want,) = _onnxruntime(model, feeds)
    np.testing.assert_array_equal(y, want)
    # packed into the uint8 form where the last axis is even; an odd one has no such form and runs on the CPU
    assert _placements(plan)["gather"] == ("webgpu" if last % 2 == 0 else "cpu"), plan.placement


def test_gather_block_quantized_four_bit_on_another_axis_is_refused(op_device: BackendDevice) -> None:
    node = helper.make_node(
        "GatherBlockQuantized", ["data", "indices", "scales"], ["y"], domain=MS, block_size=16, quantize_axis=0
    )
    model = _model(
        [node],
        [helper.make_tensor_value_info("indices", TensorProto.INT64, [2])],
        ["y"],
        [
            numpy_helper.from_array(_codes(UINT4, (32, 4), 0), "data"),
            numpy_helper.from_array(np.ones((2, 4), F32), "scales"),
        ],
    )
    with pytest.raises(UnsupportedOpError, match="GatherBlockQuantized.*last axis"):
        run_model(load_model(model.SerializeToString()), {"indices": np.array([0, 1], np.int64)}, op_device)


# -- what onnxruntime's tools write ----------------------------------------------------------------------------------


def _mlp() -> onnx.ModelProto:
    from onnxruntime_tool_models import mlp

    model: onnx.ModelProto = mlp()
    return model


def _nbits(model: onnx.ModelProto, **options: Any) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(model, quant_format=QuantFormat.QDQ, **options)
    quantizer.process()
    result: onnx.ModelProto = quantizer.model.model
    return result


@pytest.mark.parametrize("symmetric", [False, True], ids=["asymmetric", "symmetric"])
@pytest.mark.parametrize("max_fold_bytes", [None, 0], ids=["folded", "unfolded"])
def test_matmul_nbits_quantizer_qdq_format(env: Any, symmetric: bool, max_fold_bytes: int | None) -> None:
    """The QDQ format: blockwise DequantizeLinear over a 4-bit weight, feeding the MatMul.  By default the loader
    folds the dequantized weights (constants); unfolded, the blocked DequantizeLinear runs on the CPU reference."""
    quantized = _nbits(_mlp(), bits=4, block_size=32, is_symmetric=symmetric)
    four_bit = [t for t in quantized.graph.initializer if t.data_type in (TensorProto.INT4, TensorProto.UINT4)]
    assert four_bit, "the quantizer wrote no 4-bit initializer"
    blocked = [n for n in quantized.graph.node if n.op_type == "DequantizeLinear"]
    assert blocked and all(any(a.name == "block_size" for a in n.attribute) for n in blocked)
    feeds = {"ids": np.random.default_rng(21).integers(0, 100, (2, 8)).astype(np.int64)}
    with ortgpu.InferenceSession(quantized.SerializeToString(), env=env, max_fold_bytes=max_fold_bytes) as session:
        placements = session.get_node_placement({"ids": (2, 8)})
        off = [p.op_type for p in placements if p.placement != "webgpu"]
        assert off == ([] if max_fold_bytes is None else ["DequantizeLinear"] * len(blocked)), off
        got = session.run(None, feeds)
    for value, want in zip(got, _onnxruntime(quantized, feeds, optimize=False), strict=True):
        _close(np.asarray(value), want)


def test_plans_share_the_widened_weight(op_device: BackendDevice) -> None:
    """A second plan (another input shape) reuses the widened array the first one made."""
    model = _model(
        [helper.make_node("DequantizeLinear", ["w", "s"], ["wd"]), helper.make_node("MatMul", ["x", "wd"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", K])],
        ["y"],
        [numpy_helper.from_array(_codes(UINT4, (K, N), 3), "w"), numpy_helper.from_array(np.array(0.1, F32), "s")],
    )
    loaded = load_model(model.SerializeToString(), max_fold_bytes=0)
    caps = device_caps(op_device)
    first = plan_model(loaded, {"x": (2, K)}, caps)
    second = plan_model(loaded, {"x": (5, K)}, caps)
    (widened,) = [name for name in first.constant_keys if name != "s"]
    assert first.constants[widened].dtype == np.uint8 and first.constants[widened] is second.constants[widened]
