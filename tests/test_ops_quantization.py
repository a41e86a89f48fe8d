"""Quantization and signal operators: references vs onnxruntime CPU, and the CPU placement of their plans.

Same method as ``test_ops_elementwise.py``: single-node models on fresh random
inputs judged by onnxruntime's CPU provider.  Integer results (quantized
outputs, int32 accumulators) must match exactly; inputs are drawn to land on
rounding ties (``x / scale`` exactly half-way) and past the saturation bounds.
"""

from __future__ import annotations

import gc
from typing import Any, Iterator

import numpy as np
import onnx
import pytest
from test_ops_elementwise import (
    NUMPY_ORACLES,
    Case,
    absent,
    check_plan,
    check_reference,
    const,
    floats,
    ints,
    open_device,
)

from ortgpu.ops import get_operator
from ortgpu_core._errors import ShapeError, UnsupportedOpError
from ortgpu_core.backends.protocol import BackendDevice

F32 = np.float32
U8, I8, U16, I16 = np.uint8, np.int8, np.uint16, np.int16


def ties(*shape: int, scale: float, span: int, dtype: Any = F32) -> Any:
    """Multiples of ``scale / 2`` (``x / scale`` lands on ties half the time) over ``[-span, span]`` steps."""
    return lambda rng: (rng.integers(-2 * span, 2 * span + 1, shape) * (scale / 2)).astype(dtype)


def awkward(*shape: int) -> Any:
    """float32 values of every magnitude (subnormals, near-ties, huge) with zeros, infinities and NaN."""

    def make(rng: np.random.Generator) -> np.ndarray:
        bits = rng.integers(0, 2**32, shape, dtype=np.uint64).astype(np.uint32).view(F32).copy()
        near = (rng.integers(-600, 600, shape) / 2 * 0.1).astype(F32)
        near = np.nextafter(near, rng.choice([-np.inf, np.inf], shape).astype(F32)) if rng.random() < 0.5 else near
        values = np.where(rng.random(shape) < 0.5, near, bits)
        flat = values.reshape(-1)
        flat[: min(6, flat.size)] = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-42], F32)[: min(6, flat.size)]
        return values.astype(F32)

    return make


def quantized(*shape: int, dtype: Any) -> Any:
    info = np.iinfo(dtype)
    return lambda rng: rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)


def scales(*shape: int, dtype: Any = F32) -> Any:
    return lambda rng: rng.uniform(0.01, 0.2, shape).astype(dtype)


def spectrum(*shape: int) -> Any:
    return lambda rng: rng.standard_normal(shape).astype(F32)


CASES: list[Case] = [
    # QuantizeLinear
    Case("QuantizeLinear", [ties(4, 9, scale=0.5, span=300), const(0.5, F32), const(7, U8)], opset=13),
    Case("QuantizeLinear", [ties(4, 9, scale=0.25, span=40), const(0.25, F32)], opset=10, label="no-zero-point"),
    Case("QuantizeLinear", [awkward(16, 33), const(0.1, F32), const(-7, I8)], opset=13, label="awkward-values"),
    Case(
        "QuantizeLinear",
        [ties(4, 6, scale=0.5, span=300, dtype=np.float16), const(0.5, F32), const(3, U8)],
        opset=21,
        label="float16-input",
        in_onnxruntime=False,  # onnxruntime binds x and the scale to one type: NUMPY_ORACLES judges
    ),
    Case(
        "QuantizeLinear",
        [awkward(4, 3, 50), const([0.1, 3e-39, 7e30], F32), const([1, 2, 3], U16)],
        opset=21,
        label="awkward-scales-uint16",
    ),
    Case(
        "QuantizeLinear",
        [ties(7, 6, scale=0.3, span=300), lambda rng: rng.uniform(0.01, 5, 7).astype(F32), const(np.arange(7), I16)],
        {"axis": 0},
        opset=21,
        label="random-scales-int16",
    ),
    Case(
        "QuantizeLinear",
        [ties(2, 3, 5, scale=0.5, span=200), const([0.5, 0.25, 1.0], F32), const([-3, 0, 9], I8)],
        opset=13,
        label="per-axis-int8",
    ),
    Case(
        "QuantizeLinear",
        [ties(3, 4, scale=0.5, span=200), const([0.5, 1.0, 0.25, 2.0], F32), const([1, 2, 3, 4], U8)],
        {"axis": -1},
        opset=13,
        label="negative-axis",
    ),
    Case(
        "QuantizeLinear",
        [ties(6, 5, scale=2.0, span=40000), const(2.0, F32), const(-100, I16)],
        opset=21,
        label="int16",
    ),
    Case(
        "QuantizeLinear",
        [ties(6, 5, scale=2.0, span=40000), const(2.0, F32), const(100, U16)],
        opset=21,
        label="uint16",
    ),
    Case(
        "QuantizeLinear",
        [
            ties(3, 4, scale=0.5, span=300),
            const([[0.5, 1.0], [0.25, 2.0], [1.0, 0.5]], F32),
            const([[0, 5], [9, 200], [128, 3]], U8),
        ],
        {"axis": 1, "block_size": 2},
        opset=21,
        label="blocked",
    ),
    Case(
        "QuantizeLinear",
        [ties(5, 3, scale=0.5, span=200), const([[0.5, 1.0, 0.25], [2.0, 0.5, 1.0]], F32)],
        {"axis": 0, "block_size": 3, "output_dtype": onnx.TensorProto.INT8},
        opset=21,
        label="blocked-ragged-output-dtype",
    ),
    Case(
        "QuantizeLinear",
        [ties(4, 6, scale=0.5, span=300, dtype=np.float16), const(0.5, np.float16), const(3, U8)],
        opset=19,
        label="float16",
    ),
    # DequantizeLinear
    Case("DequantizeLinear", [quantized(4, 9, dtype=U8), const(0.5, F32), const(7, U8)], opset=13),
    Case("DequantizeLinear", [quantized(4, 9, dtype=I8), const(0.125, F32)], opset=10, label="no-zero-point"),
    Case(
        "DequantizeLinear",
        [quantized(2, 3, 5, dtype=I8), scales(3), const([-3, 0, 9], I8)],
        opset=13,
        label="per-axis",
    ),
    Case("DequantizeLinear", [quantized(4, 9, dtype=np.int32), scales()], opset=13, label="int32"),
    Case("DequantizeLinear", [quantized(4, 9, dtype=I16), scales(), const(-17, I16)], opset=21, label="int16"),
    Case("DequantizeLinear", [quantized(4, 9, dtype=U16), scales(), const(1000, U16)], opset=21, label="uint16"),
    Case(
        "DequantizeLinear",
        [quantized(4, 6, dtype=U8), scales(4, 2), quantized(4, 2, dtype=U8)],
        {"axis": 1, "block_size": 3},
        opset=21,
        label="blocked",
    ),
    Case(
        "DequantizeLinear",
        [quantized(4, 9, dtype=U8), scales(dtype=np.float16), const(7, U8)],
        opset=19,
        constants=frozenset({1}),
        label="float16",
    ),
    Case(
        "DequantizeLinear",
        [quantized(4, 9, dtype=U8), scales(dtype=np.float16), const(7, U8)],
        opset=19,
        label="float16-runtime-scale",
    ),
    Case(
        "DequantizeLinear",
        [quantized(4, 9, dtype=I8), const(300.0, np.float16), const(0, I8)],
        opset=19,
        constants=frozenset({1}),
        label="float16-large",
    ),
    # DynamicQuantizeLinear
    Case("DynamicQuantizeLinear", [floats(4, 7, scale=3.0)], opset=11, outputs=3),
    Case("DynamicQuantizeLinear", [floats(9, low=0.5, high=4.0)], opset=11, outputs=3, label="positive"),
    Case("DynamicQuantizeLinear", [floats(9, low=-4.0, high=-0.5)], opset=11, outputs=3, label="negative"),
    Case("DynamicQuantizeLinear", [const(np.zeros(5), F32)], opset=11, outputs=3, label="zeros"),
    Case("DynamicQuantizeLinear", [const(np.zeros(0), F32)], opset=11, outputs=3, label="empty"),
    Case("DynamicQuantizeLinear", [floats(3, 700, scale=50.0)], opset=11, outputs=3, label="large"),
    Case(
        "DynamicQuantizeLinear",
        [const([1e-40, 2e-41, -3e-42, 0.0], F32)],
        opset=11,
        outputs=3,
        label="subnormal-scale",
    ),
    *[
        Case("DynamicQuantizeLinear", [const(values, F32)], opset=11, outputs=3, label=label)
        for label, values in (
            ("nan", [1.0, np.nan, -2.0]),
            ("plus-infinity", [1.0, np.inf, -2.0, np.nan]),
            ("minus-infinity", [1.0, -np.inf, 2.0]),
            ("both-infinities", [np.inf, 3.0, -np.inf]),
            ("range-overflow", [3e38, -3e38, 1.0]),
        )
    ],
    # MatMulInteger, QLinearMatMul
    Case(
        "MatMulInteger", [quantized(4, 3, dtype=U8), quantized(3, 5, dtype=U8), const(12, U8), const(200, U8)], opset=10
    ),
    Case("MatMulInteger", [quantized(2, 4, 33, dtype=U8), quantized(33, 6, dtype=I8)], opset=10, label="batched"),
    Case(
        "MatMulInteger",
        [quantized(3, 1, 5, 300, dtype=I8), quantized(2, 300, 7, dtype=I8), quantized(1, dtype=I8), const(-128, I8)],
        opset=10,
        label="broadcast-batches-long-k",
    ),
    Case(
        "MatMulInteger",
        [quantized(4, 3, dtype=U8), quantized(3, 5, dtype=U8), quantized(4, dtype=U8), quantized(5, dtype=U8)],
        opset=10,
        label="per-row-per-column",
        in_onnxruntime=False,  # onnxruntime takes per-tensor zero points only: NUMPY_ORACLES judges
    ),
    Case(
        "QLinearMatMul",
        [
            quantized(3, 16, dtype=U8),
            scales(),
            const(128, U8),
            quantized(16, 5, dtype=U8),
            scales(),
            const(120, U8),
            const(0.05, F32),
            const(100, U8),
        ],
        opset=10,
    ),
    Case(
        "QLinearMatMul",
        [
            quantized(2, 7, 64, dtype=U8),
            scales(),
            quantized(1, dtype=U8),
            quantized(64, 9, dtype=U8),
            scales(),
            const(120, U8),
            const(0.4, F32),
            const(100, U8),
        ],
        opset=10,
        constants=frozenset({1, 4, 6}),
        label="constant-scales",
    ),
    Case(
        "QLinearMatMul",
        [
            quantized(2, 3, 16, dtype=I8),
            scales(),
            const(-2, I8),
            quantized(2, 16, 5, dtype=I8),
            scales(),
            const(3, I8),
            const(0.2, F32),
            const(-5, I8),
        ],
        opset=21,
        constants=frozenset({1, 4, 6}),
        label="int8-batched",
    ),
    Case(
        "QLinearMatMul",
        [
            quantized(3, 8, dtype=U8),
            scales(dtype=np.float16),
            const(128, U8),
            quantized(8, 5, dtype=U8),
            scales(dtype=np.float16),
            const(120, U8),
            const(0.05, np.float16),
            const(100, U8),
        ],
        opset=21,
        constants=frozenset({1, 4, 6}),
        label="float16-scales",
    ),
    # ConvInteger, QLinearConv
    Case(
        "ConvInteger",
        [quantized(1, 2, 5, 5, dtype=U8), quantized(3, 2, 3, 3, dtype=U8), const(100, U8)],
        {"pads": [1, 1, 1, 1]},
        opset=10,
    ),
    Case(
        "ConvInteger",
        [quantized(2, 4, 7, 6, dtype=U8), quantized(6, 2, 2, 3, dtype=U8), const(3, U8), const(250, U8)],
        {"strides": [2, 1], "dilations": [1, 2], "group": 2, "pads": [0, 2, 1, 1]},
        opset=10,
        label="strided-grouped",
    ),
    Case(
        "ConvInteger",
        [quantized(1, 2, 7, 6, dtype=U8), quantized(2, 2, 3, 2, dtype=U8)],
        {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
        opset=10,
        label="same-upper",
    ),
    Case(
        "ConvInteger",
        [quantized(1, 3, 9, dtype=U8), quantized(2, 3, 4, dtype=U8)],
        {"auto_pad": "SAME_LOWER"},
        opset=10,
        label="1d",
    ),
    Case(
        "QLinearConv",
        [
            quantized(1, 2, 6, 6, dtype=U8),
            scales(),
            const(128, U8),
            quantized(4, 2, 3, 3, dtype=U8),
            scales(4),
            const(np.full(4, 120), U8),
            const(0.05, F32),
            const(100, U8),
            ints(4, low=-300, high=300),
        ],
        {"pads": [1, 0, 1, 2]},
        opset=10,
    ),
    Case(
        "QLinearConv",
        [
            quantized(2, 3, 7, 6, dtype=U8),
            scales(),
            quantized(1, dtype=U8),
            quantized(4, 3, 3, 2, dtype=U8),
            scales(4),
            quantized(4, dtype=U8),
            const(0.05, F32),
            const(100, U8),
            ints(4, low=-3000, high=3000),
        ],
        {"pads": [1, 0, 2, 1], "strides": [2, 1], "dilations": [1, 2]},
        opset=10,
        constants=frozenset({1, 4, 6}),
        label="per-channel-constant-scales",
    ),
    Case(
        "QLinearConv",
        [
            quantized(1, 4, 11, dtype=U8),
            scales(),
            const(128, U8),
            quantized(6, 2, 3, dtype=U8),
            scales(),
            const(128, U8),
            const(0.02, F32),
            const(128, U8),
        ],
        {"group": 2, "auto_pad": "SAME_UPPER"},
        opset=10,
        constants=frozenset({1, 4, 6}),
        label="1d-grouped-constant-scales",
    ),
    Case(
        "QLinearConv",
        [
            quantized(1, 4, 5, 5, dtype=I8),
            scales(),
            const(-1, I8),
            quantized(4, 2, 2, 2, dtype=I8),
            scales(),
            const(0, I8),
            const(0.3, F32),
            const(5, I8),
        ],
        {"group": 2, "strides": [2, 2]},
        opset=10,
        constants=frozenset({1, 4, 6}),
        label="int8-grouped",
    ),
    # windows, MelWeightMatrix
    *[
        Case(op, [const(size, np.int64)], {"periodic": periodic}, opset=17, label=f"{size}-{periodic}")
        for op in ("HannWindow", "HammingWindow", "BlackmanWindow")
        for size, periodic in ((16, 1), (11, 0), (1, 1))
        # a Blackman window of one sample is 0.42 - 0.5 + 0.08 = 0: onnxruntime's float32 sum leaves 1.5e-8
        if (op, size) != ("BlackmanWindow", 1)
    ],
    Case("HannWindow", [const(9, np.int32)], {"output_datatype": onnx.TensorProto.DOUBLE}, opset=17, label="double"),
    *[
        Case(
            op,
            [const(size, np.int64)],
            {"periodic": size % 2, "output_datatype": onnx.TensorProto.INT64},
            opset=17,
            label=f"int64-{size}",
        )
        for op in ("HannWindow", "HammingWindow", "BlackmanWindow")
        for size in (16, 33, 1000)
    ],
    Case("BlackmanWindow", [const(1, np.int64)], {"periodic": 0}, opset=17, label="one-sample-symmetric"),
    Case(
        "MelWeightMatrix",
        [const(10, np.int64), const(64, np.int64), const(16000, np.int64), const(20.0, F32), const(7000.0, F32)],
        opset=17,
    ),
    Case(
        "MelWeightMatrix",
        [const(5, np.int32), const(33, np.int32), const(8000, np.int32), const(0.0, F32), const(3700.0, F32)],
        {"output_datatype": onnx.TensorProto.DOUBLE},
        opset=17,
        label="odd-double",
    ),
    # DFT, STFT
    Case("DFT", [spectrum(2, 12, 3, 1)], opset=17),
    Case("DFT", [spectrum(2, 5, 7, 2), const(9, np.int64)], {"axis": 2, "inverse": 1}, opset=17, label="inverse-len"),
    Case("DFT", [spectrum(3, 10, 1)], {"onesided": 1}, opset=17, label="rfft"),
    Case("DFT", [spectrum(2, 6, 4, 2), absent(), const(-3, np.int64)], opset=20, label="opset20-axis"),
    Case("DFT", [spectrum(2, 6, 4, 2), const(5, np.int64)], {"inverse": 1}, opset=20, label="opset20-default-axis"),
    Case(
        "DFT",
        [
            lambda rng: np.fft.rfft(rng.standard_normal((3, 8)), axis=1).view(np.float64).reshape(3, 5, 2).astype(F32),
            absent(),
            const(1, np.int64),
        ],
        {"inverse": 1, "onesided": 1},
        opset=20,
        label="irfft",
    ),
    Case(
        "STFT",
        [spectrum(2, 64, 1), const(8, np.int64), floats(16), const(16, np.int64)],
        {"onesided": 1},
        opset=17,
        label="window",
    ),
    Case("STFT", [spectrum(1, 50, 2), const(6, np.int64), floats(10)], {"onesided": 0}, opset=17, label="complex"),
]

#: Ops with device kernels (their cases are planned on the device, except the variants listed as CPU-only).
DEVICE_OPS = {
    "QuantizeLinear",
    "DequantizeLinear",
    "DynamicQuantizeLinear",
    "MatMulInteger",
    "QLinearMatMul",
    "ConvInteger",
    "QLinearConv",
}
CPU_VARIANTS = {
    "QuantizeLinear-opset21-blocked",
    "QuantizeLinear-opset21-blocked-ragged-output-dtype",
    "QuantizeLinear-opset19-float16",
    "DequantizeLinear-opset21-blocked",
    "DequantizeLinear-opset19-float16-runtime-scale",
    "DequantizeLinear-opset19-float16-large",  # 300 * 255 may exceed float16: the CPU
    "MatMulInteger-opset10-per-row-per-column",
    "QLinearMatMul-opset10",  # scales fed at run time
    "QLinearConv-opset10",  # scales fed at run time
}
for case in CASES:
    case.on_device = case.op_type in DEVICE_OPS and case.id not in CPU_VARIANTS

NUMPY_ORACLES["QuantizeLinear-opset21-float16-input"] = lambda x, scale, zero: np.clip(
    np.rint(x.astype(F32) / scale) + int(zero), 0, 255
).astype(U8)
NUMPY_ORACLES["MatMulInteger-opset10-per-row-per-column"] = lambda a, b, a_zero, b_zero: (
    (a.astype(np.int64) - a_zero.astype(np.int64)[:, None]) @ (b.astype(np.int64) - b_zero.astype(np.int64))
).astype(np.int32)


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


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_reference_matches_onnxruntime(case: Case) -> None:
    check_reference(case)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_plan_matches_reference(case: Case, op_device: BackendDevice) -> None:
    check_plan(case, op_device)


def test_rounding_is_half_to_even_and_saturating() -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 1000.0, -1000.0, np.nan, np.inf], F32)
    (y,) = get_operator("QuantizeLinear", 13).reference([x, np.array(1.0, F32), np.array(0, I8)], {}, [])
    np.testing.assert_array_equal(y, np.array([0, 2, 2, 0, -2, 127, -128, -128, 127], I8))


def test_float8_and_4bit_are_refused() -> None:
    x = np.zeros(4, F32)
    for element_type in (onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
        with pytest.raises(UnsupportedOpError, match="output_dtype"):
            get_operator("QuantizeLinear", 21).reference([x, np.array(1.0, F32)], {"output_dtype": element_type}, [])
    with pytest.raises(UnsupportedOpError, match="DequantizeLinear"):
        get_operator("DequantizeLinear", 21).reference([np.zeros(3, np.int64), np.array(1.0, F32)], {}, [])
    with pytest.raises(ShapeError, match="scale"):
        get_operator("QuantizeLinear", 10).reference([x, np.ones(4, F32)], {}, [])


def test_accumulators_wrap_in_int32() -> None:
    a = np.full((1, 70000), 255, U8)
    b = np.full((70000, 1), 255, U8)
    (y,) = get_operator("MatMulInteger", 10).reference([a, b], {}, [])
    assert y.dtype == np.int32 and int(y[0, 0]) == (255 * 255 * 70000 + 2**31) % 2**32 - 2**31


def test_exact_division_is_correctly_rounded(op_device: BackendDevice) -> None:
    """The WGSL long division behind QuantizeLinear/DynamicQuantizeLinear against numpy's float32 division, bit for
    bit, on random bit patterns (every exponent, subnormals, zeros, infinities; NaN only as NaN)."""
    from test_ops_elementwise import caps_of

    from ortgpu.ops import Binding, KernelSpec, OpPlan, TensorInfo, reference_twin
    from ortgpu.ops._runner import run_plan
    from ortgpu.ops._wgsl import LINEAR_INVOCATION, grid_for, kernel_entry, storage_declaration, workgroup_size_for
    from ortgpu.ops.ai_onnx.quantize import EXACT_DIVISION_WGSL

    rng = np.random.default_rng()
    count = 1 << 16
    a = rng.integers(0, 2**32, count, dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 2**32, count, dtype=np.uint64).astype(np.uint32)
    # Nearby exponents too (quotients near 1, ties after rounding), and a few specials.
    b[: count // 2] = (a[: count // 2] & 0xFF800000) ^ (b[: count // 2] & 0x807FFFFF)
    b[:8] = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 1, 0x00800000, 0x7F7FFFFF, 0x3F800000], np.uint32)
    infos = [TensorInfo((count,), np.dtype(np.uint32))] * 2
    out = [TensorInfo((count,), np.dtype(np.uint32))]
    caps = caps_of(op_device)
    workgroup = workgroup_size_for(caps.limits)

    def divide(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray((x.view(F32) / y.view(F32)).astype(F32).view(np.uint32))

    bindings = [Binding("input", 0), Binding("input", 1), Binding("output", 0)]
    wgsl = (
        storage_declaration(0, "a", writable=False)
        + storage_declaration(1, "b", writable=False)
        + storage_declaration(2, "dst", writable=True)
        + EXACT_DIVISION_WGSL
        + kernel_entry(
            workgroup,
            f"  let w = {LINEAR_INVOCATION};\n  if (w >= {count}u) {{ return; }}\n  dst[w] = div_bits(a[w], b[w]);\n",
        )
    )
    kernel = KernelSpec(
        "Divide",
        wgsl,
        grid_for(count, workgroup, caps.limits),
        tuple(bindings),
        reference_twin(divide, bindings, infos, out),
    )
    (got,) = run_plan(op_device, OpPlan(kernels=(kernel,)), [a, b], out)
    want = divide(a, b)
    nan = np.isnan(want.view(F32))
    assert np.array_equal(np.isnan(got.view(F32)), nan)
    mismatches = np.flatnonzero(got[~nan] != want[~nan])
    assert mismatches.size == 0, (
        f"{mismatches.size} quotients differ, e.g. {a[~nan][mismatches[:3]]} / {b[~nan][mismatches[:3]]}"
    )
