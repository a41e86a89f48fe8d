"""com.microsoft's QLinearSoftmax on the device (``ortgpu/ops/com_microsoft/qlinear_softmax.py``).

Each model runs on both backends with every node on the device (``allow_cpu=False``) and is compared twice: with
ortgpu's CPU path (the operator's numpy reference), byte for byte, since the device kernels compute the reference's
float32 row sums in its order and divide exactly; and with onnxruntime's CPU provider within one quantization step,
counting the elements that differ: onnxruntime's shipped kernel orders its last float32 operations in a way inferred
from its outputs, which agrees everywhere but near a few rounding ties (see the operator's module).  The wgpu-only
test checks the kernels' integer division against numpy's correctly rounded float32 division directly.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import onnx
import onnxruntime
import pytest
from helpers import run_model
from onnx import TensorProto, helper

from ortgpu.ops.com_microsoft.qlinear_softmax import (
    _QUOTIENT_WGSL,
    QLinearSoftmax,
    _requantize,
    quotient_thresholds,
)
from ortgpu_core._errors import UnsupportedOpError

MS = "com.microsoft"
_DEVICES: dict[str, Any] = {}


def _raw_device(backend_name: str) -> Any:
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
    return dev


@pytest.fixture
def device(backend_name: str) -> Iterator[Any]:
    """A raw backend device per backend (opened once), checked for leaked objects after each test."""
    dev = _raw_device(backend_name)
    before = dev.live_handles()
    yield dev
    assert dev.live_handles() == before, "the run leaked device objects"


def _model(
    x: np.ndarray,
    opset: int,
    axis: int | None,
    x_scale: float,
    y_scale: float,
    y_zero: int,
    runtime_scales: bool = False,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-node model; its scales and zero points are initializers (``quantize_static``'s form) or, with
    ``runtime_scales``, graph inputs."""
    as_type = helper.np_dtype_to_tensor_dtype
    parameters = {
        "sx": np.array(x_scale, np.float32),
        "zx": np.array(0, x.dtype),
        "sy": np.array(y_scale, np.float32),
        "zy": np.array(y_zero, x.dtype),
    }
    attrs: dict[str, Any] = {"opset": opset}
    if axis is not None:
        attrs["axis"] = axis
    node = helper.make_node("QLinearSoftmax", ["x", *parameters], ["y"], domain=MS, **attrs)
    feeds = {"x": x, **(parameters if runtime_scales else {})}
    graph = helper.make_graph(
        [node],
        "qlinear_softmax",
        [helper.make_tensor_value_info(name, as_type(value.dtype), value.shape) for name, value in feeds.items()],
        [helper.make_tensor_value_info("y", as_type(x.dtype), None)],
        [] if runtime_scales else [onnx.numpy_helper.from_array(v, n) for n, v in parameters.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    return model, feeds


def _onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, feeds)[0])


def _reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """ortgpu's CPU path: the operator's numpy reference on the model's inputs."""
    node = model.graph.node[0]
    values = {**{t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}, **feeds}
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return QLinearSoftmax(1).reference([values[name] for name in node.input], attrs, [])[0]


def _differences(got: np.ndarray, want: np.ndarray) -> int:
    """The number of elements that differ, after checking type, shape and that none differs by more than one."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    gap = np.abs(got.astype(np.int64) - want.astype(np.int64))
    assert gap.max(initial=0) <= 1, f"{int(np.count_nonzero(gap > 1))} values differ by more than one step"
    return int(np.count_nonzero(gap))


def _check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], device: Any) -> np.ndarray:
    """Run on the device (every node there), compare with ortgpu's reference (exactly) and with onnxruntime (within
    one step, in at most 1% of the elements); returns the device's output."""
    [got], plan = run_model(model.SerializeToString(), feeds, device, allow_cpu=False)
    assert [step.placement for step in plan.steps if step.op_type == "QLinearSoftmax"] == ["webgpu"]
    reference = _reference(model, feeds)
    assert _differences(got, reference) == 0
    differing = _differences(got, _onnxruntime(model, feeds))
    assert differing <= max(1, got.size // 100), f"{differing} of {got.size} values differ from onnxruntime by one"
    return np.asarray(got)


def _bytes(rng: np.random.Generator, dtype: Any, shape: tuple[int, ...], spread: int = 256) -> np.ndarray:
    info = np.iinfo(dtype)
    low = max(int(info.min), int(info.max) + 1 - spread)
    return rng.integers(low, int(info.max) + 1, shape).astype(dtype)


CASES = [
    # (shape, opset attribute, axis or None for the default, x_scale, y_scale, y_zero_point offset from the low end)
    ((3, 10), 13, None, 0.1, 1 / 256, 0),  # quantize_static's form
    ((4, 1), 13, -1, 0.1, 1 / 255, 0),  # D = 1: every output is the largest step
    ((3, 67), 13, 1, 0.05, 1 / 256, 0),  # D not a multiple of 4 (rows share output words) nor of a workgroup
    ((2, 1000), 13, -1, 0.02, 1 / 256, 0),  # large D
    ((2, 3, 5), 13, 1, 0.2, 1 / 255, 0),  # an inner axis: the rows are strided
    ((5, 3), 13, 0, 0.2, 1 / 255, 0),  # the outer axis
    ((2, 3, 5), 12, None, 0.1, 1 / 256, 0),  # the schema's default axis -1, even before opset 13
    ((2, 3, 5), 12, 1, 0.1, 1 / 256, 0),  # before opset 13: rows from axis 1 on, 15 terms each
    ((2, 2, 3, 7), 11, 2, 0.15, 0.01, 3),  # opset 11, rows of 21 terms, a zero point off the low end
    ((3, 2, 9), 13, -2, 0.3, 0.02, 20),  # opset 13 at the same kind of axis: rows of 2 strided terms
    ((6, 40), 13, -1, 1.0, 1 / 256, 0),  # a wide x_scale: far terms are subnormal or zero
    ((4, 33), 13, -1, 0.05, 1e-4, 0),  # a tiny y_scale: most outputs saturate
    ((4, 9), 13, -1, 0.05, 2.0, 5),  # y_scale above 1: floor(1 / y_scale) = 0, every output is the zero point
]


@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["u8", "s8"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_onnxruntime_on_the_device(case: Any, dtype: Any, device: Any) -> None:
    shape, opset, axis, x_scale, y_scale, zero_offset = case
    rng = np.random.default_rng(sum(shape) * 31 + opset)
    x = _bytes(rng, dtype, shape)
    zero = int(np.iinfo(dtype).min) + zero_offset
    _check(*_model(x, opset, axis, x_scale, y_scale, zero), device)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["u8", "s8"])
def test_edge_rows(dtype: Any, device: Any) -> None:
    """Rows of equal bytes (each term is the largest: 1 / D), rows of one byte value per row among others, the
    type's extremes, and every input element one step below the row's largest."""
    info = np.iinfo(dtype)
    x = np.empty((6, 12), dtype)
    x[0], x[1], x[2] = info.min, info.max, 7
    x[3] = info.min
    x[3, 5] = info.max  # one large value: its output saturates, the rest vanish
    x[4] = info.max - 1
    x[4, 0] = info.max
    x[5] = np.arange(12) * 20 + int(info.min)
    zero = int(info.min)
    got = _check(*_model(x, 13, -1, 0.125, 1 / 256, zero), device)
    assert len(set(got[0].tolist())) == 1 and (got[0] == got[1]).all() and (got[0] == got[2]).all()
    assert got[3, 5] == info.max and (got[3, np.arange(12) != 5] == zero).all()
    # 12 equal terms at y_scale 1/12 quantize to round(256 / 12 / ...) alike: the same for every flattened layout
    _check(*_model(np.full((2, 3, 4), 9, dtype), 12, 1, 0.1, 1 / 12, zero), device)


def test_empty_input(backend_name: str, device: Any) -> None:
    model, feeds = _model(np.zeros((0, 5), np.uint8), 13, -1, 0.1, 1 / 256, 0)
    [got], _ = run_model(model.SerializeToString(), feeds, device, allow_cpu=False)
    assert got.shape == (0, 5) and got.dtype == np.uint8


def test_runtime_scales_run_on_the_cpu(device: Any) -> None:
    """Scales fed at run time cannot build the plan-time table: the node runs on the CPU, says why, and still
    matches onnxruntime within one step."""
    x = _bytes(np.random.default_rng(3), np.uint8, (3, 8))
    model, feeds = _model(x, 13, -1, 0.1, 1 / 256, 0, runtime_scales=True)
    [got], plan = run_model(model.SerializeToString(), feeds, device)
    [step] = [step for step in plan.steps if step.op_type == "QLinearSoftmax"]
    assert step.placement == "cpu" and "computed at run time" in step.reason, step.reason
    assert _differences(got, _onnxruntime(model, feeds)) <= 1


def test_unusable_scales_run_on_the_cpu(device: Any) -> None:
    """A zero y_scale (1 / y_scale infinite) is no quantization the device kernels handle: the CPU runs it."""
    x = _bytes(np.random.default_rng(4), np.uint8, (2, 6))
    model, feeds = _model(x, 13, -1, 0.1, 0.0, 0)
    [got], plan = run_model(model.SerializeToString(), feeds, device)
    [step] = [step for step in plan.steps if step.op_type == "QLinearSoftmax"]
    assert step.placement == "cpu" and "positive and finite" in step.reason, step.reason
    assert (got == _reference(model, feeds)).all()


def test_bad_inputs(device: Any) -> None:
    x = _bytes(np.random.default_rng(5), np.uint8, (2, 4))
    model, feeds = _model(x, 13, -1, 0.1, 1 / 256, 0)
    floats = onnx.ModelProto()
    floats.CopyFrom(model)
    floats.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT
    with pytest.raises(UnsupportedOpError, match="QLinearSoftmax: X of dtype float32"):
        run_model(floats.SerializeToString(), {"x": x.astype(np.float32)}, device)
    half = onnx.ModelProto()
    half.CopyFrom(model)
    half.graph.initializer[2].CopyFrom(onnx.numpy_helper.from_array(np.array(1 / 256, np.float16), "sy"))
    with pytest.raises(UnsupportedOpError, match="QLinearSoftmax: y_scale of dtype float16"):
        run_model(half.SerializeToString(), feeds, device)


@pytest.mark.parametrize("y_scale", [1 / 256, 1 / 255, 0.01, 0.3, 1e-4, 3e-9])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["u8", "s8"])
def test_quotient_thresholds_give_the_reference_steps(y_scale: float, dtype: Any) -> None:
    """The host's thresholds reproduce the reference's requantization of every quotient tried: random ones and
    each threshold with its two neighbours."""
    zero = int(np.iinfo(dtype).min) + 2
    thresholds = quotient_thresholds(np.float32(y_scale), zero, np.dtype(dtype))
    used = thresholds[thresholds != 0xFFFFFFFF].astype(np.int64)
    assert (np.diff(used) > 0).all()
    rng = np.random.default_rng(6)
    bits = np.concatenate([rng.integers(0, 0x3F800001, 20000), used - 1, used, used + 1, [0, 0x3F800000]])
    bits = bits[(bits >= 0) & (bits <= 0x3F800000)].astype(np.uint32)
    want = _requantize(bits.view(np.float32), np.float32(y_scale), zero, np.dtype(dtype))
    got = (np.searchsorted(thresholds, bits, side="right") + zero).astype(dtype)
    assert (got == want).all()


@pytest.mark.wgpu_only
def test_integer_division_is_correctly_rounded() -> None:
    """The kernels' ``quotient_bits`` against numpy's float32 division (correctly rounded), on normal sums of every
    binade and terms from zero and subnormal to the sum itself.  (A quotient of two binary floats is never exactly
    half-way between two floats, so ties cannot arise above the subnormal range, which the kernel flushes.)"""
    rng = np.random.default_rng(7)
    count = 4096
    sums = (np.float32(2.0) ** rng.integers(-126, 127, count) * rng.uniform(1, 2, count)).astype(np.float32)
    sums[:64] = np.float32(2.0) ** rng.integers(-126, 127, 64)  # exact powers of two
    fractions = np.float32(2.0) ** rng.uniform(-40, 0, count)
    terms = np.minimum((sums * fractions).astype(np.float32), sums)
    terms[64:128] = sums[64:128]  # quotient 1
    terms[128:192] = 0
    sums[192:320] = (np.float32(2.0) ** -125 * rng.uniform(1, 2, 128)).astype(np.float32)
    terms[192:256] = np.arange(1, 65, dtype=np.uint32).view(np.float32)  # the smallest subnormal terms
    terms[256:320] = rng.integers(1, 0x800000, 64).astype(np.uint32).view(np.float32)  # any subnormal term
    terms[320:384] = (sums[320:384] * np.float32(2.0) ** -130).astype(np.float32)  # quotients flushed to zero
    kernel = (
        "@group(0) @binding(0) var<storage, read> pairs: array<u32>;\n"
        "@group(0) @binding(1) var<storage, read_write> out: array<u32>;\n"
        + _QUOTIENT_WGSL
        + "@compute @workgroup_size(64)\n"
        "fn main(@builtin(global_invocation_id) gid: vec3<u32>) {\n"
        f"  let i = gid.x;\n  if (i < {count}u) {{ out[i] = quotient_bits(pairs[2u * i], pairs[2u * i + 1u]); }}\n"
        "}\n"
    )
    from helpers import FrozenKernel

    device = _raw_device("wgpu")
    before = device.live_handles()
    frozen = FrozenKernel(device, kernel, 2 * count, "quotient_bits")
    try:
        frozen.submit(np.stack([terms, sums], 1).reshape(-1))
        got = frozen.read()[:count].view(np.uint32)
    finally:
        frozen.release()
    assert device.live_handles() == before
    want = (terms / sums).astype(np.float32)
    want[want < np.finfo(np.float32).tiny] = 0
    wrong = np.flatnonzero(got != want.view(np.uint32))
    assert wrong.size == 0, [(terms[i], sums[i], got[i], want.view(np.uint32)[i]) for i in wrong[:5]]
