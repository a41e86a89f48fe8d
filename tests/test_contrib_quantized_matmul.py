"""com.microsoft's quantized weights and matmuls (MatMulNBits, GatherBlockQuantized, DynamicQuantizeMatMul,
MatMulIntegerToFloat, QuantizeLinear, DequantizeLinear) against onnxruntime's CPU provider, on both backends.

Weights are packed here as onnxruntime documents (``onnxruntime.quantization.matmul_nbits_quantizer`` needs
``onnx_ir``, which is not installed): codes low bits first along K, ``[N, blocks, blob]`` bytes, zero points packed
the same way per row.

Tolerances: float outputs within 1e-4 relative to the output's largest magnitude (a sum's error scales with the
magnitudes summed, not with the sum; cancellation makes single outputs small), float16 within one float16 ulp of
that magnitude (onnxruntime rounds the float32 result once, as the kernels do; summation order moves a value
across a rounding boundary now and then).  MatMulNBits at ``accuracy_level = 4``: onnxruntime's CPU kernel
quantizes A to int8 per block (about 1e-2 of the largest output away from the float product), and so does ortgpu:
those models meet the same tolerances.  Integer outputs are compared exactly.
MatMulIntegerToFloat and DynamicQuantizeMatMul: within two ulps of the last two float32 operations (see
:func:`assert_to_float_close`); on lavapipe their outputs have measured equal to onnxruntime's bit for bit.
"""

from __future__ import annotations

import gc
from typing import Any, Iterator

import numpy as np
import onnx
import onnxruntime
import pytest
from helpers import run_model
from onnx import helper, numpy_helper
from test_ops_elementwise import open_device

from ortgpu.ops import get_operator
from ortgpu.ops.com_microsoft.quantized_weights import quantize_rows_by_block
from ortgpu_core._errors import ShapeError, UnsupportedOpError
from ortgpu_core.backends.protocol import BackendDevice

F32, F16 = np.float32, np.float16
MS = "com.microsoft"


@pytest.fixture(scope="module", params=["fake", "wgpu"])
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def op_device(backend_name: str) -> Iterator[BackendDevice]:
    device = open_device(backend_name)
    try:
        yield device
        gc.collect()
        assert device.live_handles() == 0, "operator tests leaked device objects"
    finally:
        device.destroy()


def _element_type(dtype: Any) -> int:
    return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


def make_model(
    op_type: str,
    feeds: dict[str, np.ndarray],
    initializers: dict[str, np.ndarray],
    order: list[str],
    attrs: dict[str, Any],
    output_dtype: Any,
    outputs: int = 1,
) -> onnx.ModelProto:
    """One ``com.microsoft`` node over ``order`` (feeds and initializers by name, "" for an absent input)."""
    node = helper.make_node(op_type, order, [f"Y{i}" for i in range(outputs)], domain=MS, **attrs)
    graph = helper.make_graph(
        [node],
        "contrib",
        [helper.make_tensor_value_info(name, _element_type(a.dtype), list(a.shape)) for name, a in feeds.items()],
        [helper.make_tensor_value_info(f"Y{i}", _element_type(output_dtype), None) for i in range(outputs)],
        [numpy_helper.from_array(value, name) for name, value in initializers.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(v) for v in session.run(None, feeds)]


def run_both(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], device: BackendDevice, *, placement: str = "webgpu"
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(ortgpu's outputs, onnxruntime's); every com.microsoft node must have run where ``placement`` says."""
    got, plan = run_model(model, feeds, device, allow_cpu=placement != "webgpu")
    placements = [step.placement for step in plan.steps if step.operator.domain == MS]
    assert placements and all(p == placement for p in placements), [(s.op_type, s.reason) for s in plan.steps]
    return got, onnxruntime_outputs(model, feeds)


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float = 1e-4) -> None:
    """Within ``rtol`` of the largest magnitude (float16: one ulp there), same dtype and shape."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    scale = float(np.max(np.abs(want.astype(np.float64)))) if want.size else 0.0
    if want.dtype == np.float16:
        rtol = max(rtol, 2.0**-10)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=0, atol=rtol * scale + 1e-30)


# -- MatMulNBits ---------------------------------------------------------------------------------------------------


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes (last axis a multiple of 8 / bits) packed low bits first into bytes."""
    per = 8 // bits
    grouped = codes.reshape(*codes.shape[:-1], codes.shape[-1] // per, per).astype(np.uint8)
    packed = np.zeros(grouped.shape[:-1], np.uint8)
    for i in range(per):
        packed |= (grouped[..., i] << (bits * i)).astype(np.uint8)
    return packed


def nbits_model(
    rng: np.random.Generator,
    *,
    a_shape: tuple[int, ...],
    n: int,
    bits: int = 4,
    block_size: int = 32,
    dtype: Any = F32,
    zero_points: str = "none",
    bias: bool = False,
    accuracy_level: int | None = None,
    g_idx: bool = False,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    k = a_shape[-1]
    blocks = -(-k // block_size)
    codes = rng.integers(0, 1 << bits, (n, blocks * block_size))
    b = pack_codes(codes, bits).reshape(n, blocks, block_size * bits // 8)
    inits: dict[str, np.ndarray] = {"B": b, "scales": rng.uniform(0.005, 0.05, (n, blocks)).astype(dtype)}
    order = ["A", "B", "scales", "", "", ""]
    if zero_points == "packed":
        zeros = rng.integers(0, 1 << bits, (n, -(-blocks * bits // 8) * (8 // bits)))
        inits["zeros"] = pack_codes(zeros, bits)
        order[3] = "zeros"
    elif zero_points == "float":
        inits["zeros"] = rng.uniform(0, (1 << bits) - 1, (n, blocks)).astype(dtype)
        order[3] = "zeros"
    if g_idx:
        inits["g_idx"] = (np.arange(k) // block_size).astype(np.int32)[rng.permutation(k)]
        order[4] = "g_idx"
    if bias:
        inits["bias"] = rng.standard_normal(n).astype(dtype)
        order[5] = "bias"
    while order[-1] == "":
        order.pop()
    attrs: dict[str, Any] = {"K": k, "N": n, "block_size": block_size}
    if bits != 4:
        attrs["bits"] = bits
    if accuracy_level is not None:
        attrs["accuracy_level"] = accuracy_level
    feeds = {"A": rng.standard_normal(a_shape).astype(dtype)}
    return make_model("MatMulNBits", feeds, inits, order, attrs, dtype), feeds


NBITS_CASES: list[tuple[str, dict[str, Any]]] = [
    ("decode-4bit", {"a_shape": (1, 64), "n": 24}),
    ("decode-4bit-rank3-bias", {"a_shape": (1, 1, 96), "n": 13, "bias": True, "block_size": 16}),
    ("decode-4bit-packed-zeros-odd-k", {"a_shape": (1, 70), "n": 9, "zero_points": "packed"}),
    ("decode-4bit-odd-k-not-multiple-of-4", {"a_shape": (1, 37), "n": 5, "block_size": 16}),
    ("decode-8bit-packed-zeros", {"a_shape": (1, 48), "n": 10, "bits": 8, "zero_points": "packed", "block_size": 16}),
    ("decode-4bit-float-zeros", {"a_shape": (1, 64), "n": 7, "zero_points": "float"}),
    ("decode-2bit", {"a_shape": (1, 64), "n": 6, "bits": 2, "zero_points": "packed", "block_size": 16}),
    ("few-rows-float-zeros", {"a_shape": (3, 64), "n": 11, "zero_points": "float", "bias": True}),
    ("prefill-4bit", {"a_shape": (2, 5, 64), "n": 20, "zero_points": "packed", "bias": True}),
    ("prefill-odd-sizes", {"a_shape": (7, 45), "n": 9, "block_size": 16}),
    ("prefill-8bit-block-128", {"a_shape": (9, 130), "n": 12, "bits": 8, "block_size": 128}),
    ("accuracy-level-1", {"a_shape": (1, 64), "n": 8, "accuracy_level": 1}),
    ("decode-float16", {"a_shape": (1, 64), "n": 12, "dtype": F16, "zero_points": "packed", "bias": True}),
    ("prefill-float16", {"a_shape": (6, 48), "n": 10, "dtype": F16, "block_size": 16, "zero_points": "float"}),
    ("decode-float16-odd-k", {"a_shape": (1, 21), "n": 6, "dtype": F16, "block_size": 16}),
]


@pytest.mark.parametrize("case", NBITS_CASES, ids=[c[0] for c in NBITS_CASES])
def test_matmul_nbits_matches_onnxruntime(case: tuple[str, dict[str, Any]], op_device: BackendDevice) -> None:
    model, feeds = nbits_model(np.random.default_rng(0), **case[1])
    (got,), (want,) = run_both(model, feeds, op_device)
    assert_close(got, want)


LEVEL_4_CASES: list[tuple[str, dict[str, Any]]] = [
    ("decode", {"a_shape": (1, 256), "n": 16}),
    ("decode-packed-zeros-bias", {"a_shape": (1, 96), "n": 9, "zero_points": "packed", "bias": True}),
    ("decode-partial-block", {"a_shape": (1, 100), "n": 7}),
    ("decode-8bit", {"a_shape": (1, 64), "n": 10, "bits": 8, "block_size": 16, "zero_points": "packed"}),
    ("decode-2bit", {"a_shape": (1, 64), "n": 6, "bits": 2, "zero_points": "packed"}),
    ("prefill", {"a_shape": (2, 5, 128), "n": 20, "bias": True}),
    ("weight-block-512-quantizes-a-by-256", {"a_shape": (2, 1024), "n": 8, "block_size": 512}),
    ("prefill-block-128-odd-k", {"a_shape": (9, 130), "n": 12, "block_size": 128}),
    ("decode-float16", {"a_shape": (1, 64), "n": 12, "dtype": F16, "zero_points": "packed"}),
    ("prefill-float16", {"a_shape": (6, 48), "n": 10, "dtype": F16, "block_size": 16}),
]


@pytest.mark.parametrize("case", LEVEL_4_CASES, ids=[c[0] for c in LEVEL_4_CASES])
def test_matmul_nbits_accuracy_level_4_quantizes_a_as_onnxruntime_does(
    case: tuple[str, dict[str, Any]], op_device: BackendDevice
) -> None:
    model, feeds = nbits_model(np.random.default_rng(1), accuracy_level=4, **case[1])
    (got,), (want,) = run_both(model, feeds, op_device)
    assert_close(got, want)
    # the float product (level 0) is farther away than the tolerance: the int8 A is what made them equal
    node = model.graph.node[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name != "accuracy_level"}
    names = [*node.input]
    values = {"A": feeds["A"], **{t.name: numpy_helper.to_array(t) for t in model.graph.initializer}}
    in_float = get_operator("MatMulNBits", 1, MS).reference([values[n] if n else None for n in names], attrs, [])[0]
    scale = float(np.abs(want.astype(np.float64)).max())
    assert np.abs(in_float.astype(np.float64) - want).max() > 1e-3 * scale


@pytest.mark.parametrize("a_shape", [(0, 64), (2, 0, 64)], ids=["no-rows", "no-rows-rank-3"])
def test_matmul_nbits_accuracy_level_4_with_no_rows_matches_onnxruntime(
    a_shape: tuple[int, ...], op_device: BackendDevice
) -> None:
    model, feeds = nbits_model(np.random.default_rng(3), a_shape=a_shape, n=8, accuracy_level=4)
    (got,), (want,) = run_both(model, feeds, op_device)
    assert got.shape == want.shape == (*a_shape[:-1], 8)


LEVEL_4_FLOAT_CASES: list[tuple[str, dict[str, Any]]] = [
    ("float-zero-points", {"a_shape": (3, 64), "n": 11, "zero_points": "float"}),
    ("2bit-block-16", {"a_shape": (2, 64), "n": 6, "bits": 2, "zero_points": "packed", "block_size": 16}),
]


@pytest.mark.parametrize("case", LEVEL_4_FLOAT_CASES, ids=[c[0] for c in LEVEL_4_FLOAT_CASES])
def test_matmul_nbits_accuracy_level_4_keeps_float_a_where_onnxruntime_does(
    case: tuple[str, dict[str, Any]], op_device: BackendDevice
) -> None:
    """onnxruntime quantizes A only for integer (or default) zero points, and 2-bit weights only in blocks of 32 to
    128; elsewhere it multiplies in float."""
    model, feeds = nbits_model(np.random.default_rng(2), accuracy_level=4, **case[1])
    (got,), (want,) = run_both(model, feeds, op_device)
    assert_close(got, want)


def test_quantize_rows_by_block_codes() -> None:
    """Each block's largest magnitude becomes code +-127 of amax / 127, halves round to even codes, an all-zero
    block stays zero, and the last, shorter block is quantized on its own maximum."""
    a = np.zeros((2, 40), np.float32)
    a[0, :16] = np.linspace(-3.0, 1.5, 16)
    a[0, 32:] = [0.25, -0.5, 0.125, 1e-3, 0.0, 0.0, 0.5, -0.25]
    a[1, 16:32] = 7.0
    got = quantize_rows_by_block(a, 16)
    codes = np.rint(a[0, :16] * (np.float32(127) / np.float32(3.0)))
    assert codes[0] == -127
    np.testing.assert_array_equal(got[0, :16], codes * (np.float32(3.0) / np.float32(127)))
    np.testing.assert_array_equal(got[0, 16:32], 0.0)
    np.testing.assert_array_equal(got[1, :16], 0.0)
    np.testing.assert_array_equal(got[1, 16:32], np.float32(127) * (np.float32(7.0) / np.float32(127)))
    # 0.25 and -0.25 of 0.5 are codes 63.5 and -63.5: rounded to the even 64 and -64
    tail = np.array([64, -127, 32, 0, 0, 0, 127, -64], np.float32) * (np.float32(0.5) / np.float32(127))
    np.testing.assert_array_equal(got[0, 32:], tail)


@pytest.mark.parametrize("zero_points", ["none", "float"])
def test_matmul_nbits_g_idx_runs_on_the_cpu(zero_points: str, op_device: BackendDevice) -> None:
    """g_idx (each K index's block) is computed on the CPU.  Not compared with uint8 zero points: onnxruntime 1.32's
    CPU kernel then ignores them (its g_idx dequantization reads the zero point into a value it never uses)."""
    model, feeds = nbits_model(np.random.default_rng(0), a_shape=(2, 64), n=8, g_idx=True, zero_points=zero_points)
    (got,), (want,) = run_both(model, feeds, op_device, placement="cpu")
    assert_close(got, want)


def test_matmul_nbits_refusals_name_the_operator() -> None:
    operator = get_operator("MatMulNBits", 1, MS)
    a = np.zeros((1, 32), F32)
    b = np.zeros((4, 1, 16), np.uint8)
    scales = np.ones((4, 1), F32)
    attrs = {"K": 32, "N": 4, "block_size": 32}
    with pytest.raises(UnsupportedOpError, match="MatMulNBits: bits must be 2, 4 or 8"):
        operator.reference([a, b, scales], {**attrs, "bits": 3}, [])
    with pytest.raises(UnsupportedOpError, match="MatMulNBits: block_size must be a power of 2"):
        operator.reference([a, b, scales], {**attrs, "block_size": 24}, [])
    with pytest.raises(ShapeError, match=r"MatMulNBits: A of shape \(1, 31\) must end in K = 32"):
        operator.reference([a[:, :31], b, scales], attrs, [])
    with pytest.raises(ShapeError, match="MatMulNBits: B of shape"):
        operator.reference([a, b[:, :, :8], scales], attrs, [])
    with pytest.raises(UnsupportedOpError, match="MatMulNBits: scales of dtype float16 differ"):
        operator.reference([a, b, scales.astype(F16)], attrs, [])
    with pytest.raises(UnsupportedOpError, match="MatMulNBits: the required attribute 'K' is missing"):
        operator.reference([a, b, scales], {"N": 4, "block_size": 32}, [])
    with pytest.raises(ShapeError, match="MatMulNBits: g_idx"):
        operator.reference([a, b, scales, None, np.full(32, 5, np.int32)], attrs, [])


# -- GatherBlockQuantized ------------------------------------------------------------------------------------------


def gather_model(
    rng: np.random.Generator,
    *,
    data_shape: tuple[int, ...],
    indices: np.ndarray,
    bits: int = 4,
    block_size: int | None = None,
    dtype: Any = F32,
    zero_points: bool = False,
    attrs: dict[str, Any] | None = None,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``data_shape`` is the logical shape (last axis in codes); the data is packed along it."""
    per = 8 // bits
    codes = rng.integers(0, 1 << bits, data_shape)
    data = pack_codes(codes, bits)
    size = block_size or 128
    blocks = -(-data_shape[-1] // size)
    inits = {"data": data, "scales": rng.uniform(0.01, 0.1, data_shape[:-1] + (blocks,)).astype(dtype)}
    order = ["data", "indices", "scales"]
    if zero_points:
        zeros = rng.integers(0, 1 << bits, data_shape[:-1] + (-(-blocks // per) * per,))
        inits["zeros"] = pack_codes(zeros, bits)
        order.append("zeros")
    attributes = dict(attrs or {})
    if bits != 4:
        attributes["bits"] = bits
    if block_size is not None:
        attributes["block_size"] = block_size
    attributes.setdefault("quantize_axis", len(data_shape) - 1)
    return make_model("GatherBlockQuantized", {"indices": indices}, inits, order, attributes, dtype), {
        "indices": indices
    }


GATHER_CASES: list[tuple[str, dict[str, Any]]] = [
    ("embedding-4bit-defaults", {"data_shape": (10, 256), "indices": np.array([[3, 0, 9, 3]], np.int64)}),
    (
        "4bit-zeros-negative-and-out-of-range",
        {
            "data_shape": (6, 64),
            "indices": np.array([-1, 2, 6, -7, 5], np.int64),
            "block_size": 16,
            "zero_points": True,
        },
    ),
    ("8bit-int32-indices", {"data_shape": (5, 48), "indices": np.array([4, 1], np.int32), "bits": 8, "block_size": 16}),
    (
        "8bit-zeros-odd-blocks",
        {
            "data_shape": (4, 80),
            "indices": np.array([[1], [3]], np.int64),
            "bits": 8,
            "block_size": 32,
            "zero_points": True,
        },
    ),
    ("2bit-rank3", {"data_shape": (3, 2, 64), "indices": np.array([2, 0], np.int64), "bits": 2, "block_size": 16}),
    (
        "float16",
        {
            "data_shape": (7, 32),
            "indices": np.array([6, 1, 1], np.int64),
            "block_size": 16,
            "dtype": F16,
            "zero_points": True,
        },
    ),
    (
        "negative-axes",
        {
            "data_shape": (4, 32),
            "indices": np.array([0, 3], np.int64),
            "block_size": 16,
            "attrs": {"gather_axis": -2, "quantize_axis": -1},
        },
    ),
]


@pytest.mark.parametrize("case", GATHER_CASES, ids=[c[0] for c in GATHER_CASES])
def test_gather_block_quantized_matches_onnxruntime(case: tuple[str, dict[str, Any]], op_device: BackendDevice) -> None:
    model, feeds = gather_model(np.random.default_rng(0), **case[1])
    (got,), (want,) = run_both(model, feeds, op_device)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)  # one float32 product per element, rounded once: exact


def test_gather_block_quantized_refusals_name_the_operator() -> None:
    operator = get_operator("GatherBlockQuantized", 1, MS)
    data = np.zeros((4, 16), np.uint8)
    indices = np.array([0], np.int64)
    scales = np.ones((4, 1), F32)
    with pytest.raises(UnsupportedOpError, match="GatherBlockQuantized: uint8 data is gathered on axis 0"):
        operator.reference([data, indices, scales], {"gather_axis": 1, "block_size": 32}, [])
    with pytest.raises(UnsupportedOpError, match="GatherBlockQuantized: uint8 data is quantized along its last axis"):
        operator.reference([data, indices, scales], {"quantize_axis": 0, "block_size": 32}, [])
    with pytest.raises(ShapeError, match=r"GatherBlockQuantized: scales of shape \(4, 2\), expected \(4, 1\)"):
        operator.reference([data, indices, np.ones((4, 2), F32)], {"block_size": 32}, [])
    with pytest.raises(UnsupportedOpError, match="GatherBlockQuantized: data of dtype int8"):
        operator.reference([data.view(np.int8), indices, scales], {"block_size": 32}, [])
    with pytest.raises(UnsupportedOpError, match="GatherBlockQuantized: block_size must be a power of 2"):
        operator.reference([data, indices, scales], {"block_size": 8}, [])


# -- MatMulIntegerToFloat, DynamicQuantizeMatMul --------------------------------------------------------------------


def integers(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(int(info.min), int(info.max) + 1, shape).astype(dtype)


def assert_to_float_close(got: np.ndarray, want: np.ndarray, bias: np.ndarray | None) -> None:
    """Within onnxruntime's own rounding of ``f32(sum) * (a_scale * b_scale) + bias``.

    The int32 sums are exact on both sides (and so is their conversion: |sum| < 2^24 at these sizes); the float32
    multipliers are the same product of the scales.  What may differ is how the last two operations round: MLAS
    may fuse the product and the bias addition (one rounding), WGSL rounds each (or the driver contracts them).  Each
    side is then within half an ulp of the product plus half an ulp of the result of the exact value, so the two
    are within 2^-23 * (|product| + |y|) <= 2^-23 * (2 |y| + |bias|) of each other; the bound here is twice that.
    """
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    added = np.zeros(want.shape[-1:]) if bias is None else np.abs(bias.astype(np.float64))
    bound = 2.0**-22 * (2 * np.abs(want.astype(np.float64)) + added) + 1e-37
    np.testing.assert_array_less(np.abs(got.astype(np.float64) - want.astype(np.float64)), bound)


TO_FLOAT_CASES: list[tuple[str, dict[str, Any]]] = [
    ("uint8-all-inputs", {"a": (4, 9), "b": (9, 5), "b_dtype": np.uint8, "zeros": True, "bias": True}),
    ("int8-weights-no-zeros", {"a": (3, 16), "b": (16, 7), "b_dtype": np.int8}),
    ("batched-broadcast", {"a": (2, 3, 8), "b": (8, 6), "b_dtype": np.int8, "zeros": True, "bias": True}),
    ("one-row", {"a": (1, 33), "b": (33, 4), "b_dtype": np.uint8, "zeros": True}),
    ("batched-b", {"a": (2, 3, 9), "b": (2, 9, 4), "b_dtype": np.uint8, "zeros": True, "bias": True}),
    ("batch-broadcast-both-ways", {"a": (2, 1, 3, 5), "b": (4, 5, 2), "b_dtype": np.int8, "zeros": True}),
    ("per-column-int8", {"a": (3, 8), "b": (8, 5), "b_dtype": np.int8, "zeros": True, "columns": True}),
    (
        "per-column-uint8-odd-k-bias",
        {"a": (2, 4, 13), "b": (13, 6), "b_dtype": np.uint8, "zeros": True, "bias": True, "columns": True},
    ),
    ("per-column-scales-no-zeros", {"a": (5, 7), "b": (7, 3), "b_dtype": np.int8, "columns": True}),
]


def to_float_model(
    rng: np.random.Generator,
    a: tuple[int, ...],
    b: tuple[int, ...],
    b_dtype: Any,
    zeros: bool = False,
    bias: bool = False,
    columns: bool = False,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """MatMulIntegerToFloat; ``columns``: B's scale and zero point per column, else one value each."""
    feeds = {"A": integers(rng, a, np.uint8)}
    b_shape = (b[-1],) if columns else (1,)
    inits: dict[str, np.ndarray] = {
        "B": integers(rng, b, b_dtype),
        "a_scale": np.array(rng.uniform(0.01, 0.1), F32),
        "b_scale": rng.uniform(0.01, 0.1, b_shape).astype(F32),
    }
    order = ["A", "B", "a_scale", "b_scale", "", "", ""]
    if zeros:
        inits["a_zero"], inits["b_zero"] = integers(rng, (), np.uint8), integers(rng, b_shape, b_dtype)
        order[4:6] = ["a_zero", "b_zero"]
    if bias:
        inits["bias"] = rng.standard_normal(b[-1]).astype(F32)
        order[6] = "bias"
    while order[-1] == "":
        order.pop()
    return make_model("MatMulIntegerToFloat", feeds, inits, order, {}, F32), feeds


@pytest.mark.parametrize("case", TO_FLOAT_CASES, ids=[c[0] for c in TO_FLOAT_CASES])
def test_matmul_integer_to_float_matches_onnxruntime(
    case: tuple[str, dict[str, Any]], op_device: BackendDevice
) -> None:
    model, feeds = to_float_model(np.random.default_rng(0), **case[1])
    (got,), (want,) = run_both(model, feeds, op_device)
    bias = next((numpy_helper.to_array(t) for t in model.graph.initializer if t.name == "bias"), None)
    assert_to_float_close(got, want, bias)


def dynamic_model(
    rng: np.random.Generator,
    a: np.ndarray,
    b: tuple[int, ...],
    b_dtype: Any,
    extras: str,
    b_is_input: bool = False,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray], np.ndarray | None]:
    """DynamicQuantizeMatMul (and its bias); ``extras``: "none", "zero-and-bias" (per tensor) or "per-column"."""
    columns = (b[-1],) if extras == "per-column" else ()
    feeds = {"A": a}
    weights = {"B": integers(rng, b, b_dtype)}
    inits: dict[str, np.ndarray] = {"b_scale": rng.uniform(0.005, 0.05, columns).astype(F32)}
    if extras != "none":
        inits["b_zero"] = integers(rng, columns, b_dtype) // 4
        inits["bias"] = rng.standard_normal(b[-1]).astype(F32)
    if b_is_input:
        feeds.update(weights)
    else:
        inits = {**weights, **inits}
    order = ["A", "B", *[name for name in inits if name != "B"]]
    return make_model("DynamicQuantizeMatMul", feeds, inits, order, {}, F32), feeds, inits.get("bias")


DYNAMIC_CASES: list[tuple[str, dict[str, Any]]] = [
    ("rank3-a", {"a": (3, 2, 12), "b": (12, 7)}),
    ("odd-k", {"a": (5, 13), "b": (13, 4)}),
    ("batched-b", {"a": (2, 3, 9), "b": (2, 9, 5)}),
    ("batch-broadcast-both-ways", {"a": (3, 1, 2, 6), "b": (2, 6, 3)}),
    ("one-row-long-k", {"a": (1, 67), "b": (67, 5)}),
]


@pytest.mark.parametrize("case", DYNAMIC_CASES, ids=[c[0] for c in DYNAMIC_CASES])
@pytest.mark.parametrize("b_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("extras", ["none", "zero-and-bias", "per-column"])
def test_dynamic_quantize_matmul_matches_onnxruntime(
    case: tuple[str, dict[str, Any]], b_dtype: Any, extras: str, op_device: BackendDevice
) -> None:
    shapes = case[1]
    if extras == "per-column" and len(shapes["b"]) > 2:
        extras = "zero-and-bias"  # onnxruntime takes per-column parameters of a batched B only per batch
    rng = np.random.default_rng(0)
    a = rng.standard_normal(shapes["a"]).astype(F32)
    model, feeds, bias = dynamic_model(rng, a, shapes["b"], b_dtype, extras)
    (got,), (want,) = run_both(model, feeds, op_device)
    assert_to_float_close(got, want, bias)


@pytest.mark.parametrize(
    "label",
    ["rounding-ties", "all-positive", "all-negative", "all-zero", "one-element", "b-is-an-input", "wide-range"],
)
def test_dynamic_quantize_matmul_edges_match_onnxruntime(label: str, op_device: BackendDevice) -> None:
    """Ranges that fix the zero point at 0 or 255, a zero range (scale 1), many quotients on rounding ties, a
    runtime B: A quantizes exactly as onnxruntime's (a single code off would move an output by a whole step)."""
    rng = np.random.default_rng(0)
    shape = (4, 10)
    a = {
        "rounding-ties": (rng.integers(-255, 256, shape) * 0.5).astype(F32),
        "all-positive": rng.uniform(0.5, 3.0, shape).astype(F32),
        "all-negative": rng.uniform(-3.0, -0.5, shape).astype(F32),
        "all-zero": np.zeros(shape, F32),
        "one-element": np.array([[1.75]], F32),
        "b-is-an-input": rng.standard_normal(shape).astype(F32),
        "wide-range": (rng.standard_normal(shape) * 1e4).astype(F32),
    }[label]
    model, feeds, bias = dynamic_model(rng, a, (a.shape[-1], 6), np.int8, "zero-and-bias", label == "b-is-an-input")
    (got,), (want,) = run_both(model, feeds, op_device)
    assert_to_float_close(got, want, bias)


def test_dynamic_quantize_matmul_plan_is_three_kernels(op_device: BackendDevice) -> None:
    """The range, the quantization of A and the integer matmul, chained through scratch buffers."""
    rng = np.random.default_rng(0)
    model, feeds, _ = dynamic_model(rng, rng.standard_normal((2, 5)).astype(F32), (5, 3), np.uint8, "per-column")
    _, plan = run_model(model, feeds, op_device, allow_cpu=False)
    (step,) = [s for s in plan.steps if s.op_type == "DynamicQuantizeMatMul"]
    assert step.placement == "webgpu"
    assert step.op_plan is not None and len(step.op_plan.kernels) == 3 and len(step.op_plan.scratch_sizes) == 3


def test_integer_to_float_refusals_name_the_operator() -> None:
    operator = get_operator("MatMulIntegerToFloat", 1, MS)
    a, b = np.zeros((2, 3), np.uint8), np.zeros((3, 4), np.uint8)
    scale = np.array(0.1, F32)
    with pytest.raises(ShapeError, match="MatMulIntegerToFloat: a_scale must be one value"):
        operator.reference([a, b, np.ones(2, F32), scale], {}, [])
    with pytest.raises(ShapeError, match=r"MatMulIntegerToFloat: b_scale of shape \(3,\)"):
        operator.reference([a, b, scale, np.ones(3, F32)], {}, [])
    with pytest.raises(UnsupportedOpError, match="MatMulIntegerToFloat: scales of dtype float16"):
        operator.reference([a, b, scale.astype(F16), scale], {}, [])
    with pytest.raises(ShapeError, match="MatMulIntegerToFloat: shapes"):
        operator.reference([a, np.zeros((4, 4), np.uint8), scale, scale], {}, [])
    with pytest.raises(UnsupportedOpError, match="DynamicQuantizeMatMul: A of dtype float16"):
        get_operator("DynamicQuantizeMatMul", 1, MS).reference([a.astype(F16), b, scale], {}, [])
    dynamic, floats = get_operator("DynamicQuantizeMatMul", 1, MS), a.astype(F32)
    with pytest.raises(ShapeError, match=r"DynamicQuantizeMatMul: b_scale of shape \(3,\)"):
        dynamic.reference([floats, b, np.ones(3, F32)], {}, [])
    with pytest.raises(ShapeError, match=r"DynamicQuantizeMatMul: b_zero_point of shape \(2,\)"):
        dynamic.reference([floats, b, scale, np.zeros(2, np.uint8)], {}, [])
    with pytest.raises(UnsupportedOpError, match="DynamicQuantizeMatMul: a zero point's dtype differs"):
        dynamic.reference([floats, b, scale, np.zeros(4, np.int8)], {}, [])
    with pytest.raises(ShapeError, match=r"DynamicQuantizeMatMul: bias of shape \(3,\)"):
        dynamic.reference([floats, b, scale, None, np.zeros(3, F32)], {}, [])


# -- QuantizeLinear, DequantizeLinear --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "label, x_dtype, q_dtype, per_axis",
    [
        ("uint8-per-tensor", F32, np.uint8, False),
        ("int8-per-axis", F32, np.int8, True),
        ("int16-per-tensor", F32, np.int16, False),
        ("uint16-per-axis", F32, np.uint16, True),
    ],
)
def test_quantize_dequantize_linear_match_onnxruntime(
    label: str, x_dtype: Any, q_dtype: Any, per_axis: bool, op_device: BackendDevice
) -> None:
    rng = np.random.default_rng(0)
    shape = (3, 5, 7)
    scale_shape = (5,) if per_axis else ()
    scale = rng.uniform(0.02, 0.2, scale_shape).astype(x_dtype)
    zero = (
        integers(rng, scale_shape, q_dtype) // 4
        if np.iinfo(q_dtype).min == 0
        else integers(rng, scale_shape, q_dtype) // 2
    )
    attrs = {"axis": 1} if per_axis else {}
    x = (rng.integers(-300, 300, shape) * 0.05).astype(x_dtype)  # many quotients on rounding ties
    quantize = make_model(
        "QuantizeLinear", {"x": x}, {"scale": scale, "zero": zero}, ["x", "scale", "zero"], attrs, q_dtype
    )
    (got,), (want,) = run_both(quantize, {"x": x}, op_device)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    q = integers(rng, shape, q_dtype)
    dequantize = make_model(
        "DequantizeLinear", {"q": q}, {"scale": scale, "zero": zero}, ["q", "scale", "zero"], attrs, x_dtype
    )
    (got,), (want,) = run_both(dequantize, {"q": q}, op_device)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)  # one float32 product per element


def test_quantize_linear_float16_matches_onnxruntime(op_device: BackendDevice) -> None:
    rng = np.random.default_rng(0)
    x = (rng.integers(-200, 200, (4, 6)) * 0.125).astype(F16)
    model = make_model(
        "QuantizeLinear",
        {"x": x},
        {"scale": np.array(0.25, F16), "zero": np.array(3, np.int8)},
        ["x", "scale", "zero"],
        {},
        np.int8,
    )
    (got,), (want,) = run_both(model, {"x": x}, op_device, placement="cpu")  # float16 scales: CPU
    np.testing.assert_array_equal(got, want)
    q = integers(rng, (4, 6), np.uint8)
    model = make_model("DequantizeLinear", {"q": q}, {"scale": np.array(0.25, F16)}, ["q", "scale"], {}, F16)
    (got,), (want,) = run_both(model, {"q": q}, op_device, placement="webgpu")
    assert got.dtype == want.dtype == F16
    np.testing.assert_array_equal(got, want)
