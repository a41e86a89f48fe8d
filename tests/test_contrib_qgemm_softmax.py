"""com.microsoft's QGemm and QLinearSoftmax, which ``quantize_static`` writes in QOperator format for Gemm and Softmax.

Each model runs on both backends and is judged by onnxruntime's CPU provider.  QGemm bit for bit: its integer sums
are exact and its requantization is MLAS's (float32 multiplier computed in onnxruntime's order, one rounding half to
even).  QLinearSoftmax reproduces onnxruntime's table of exponentials and its float32 row sums; the order of the last
float32 operations of onnxruntime's shipped kernel is inferred (see its module), so its outputs are held within one
quantization step of onnxruntime's and the elements one step away are counted (none, so far).  QGemm with constant
scales and a per-tensor B zero point, and QLinearSoftmax with constant scales, run on the device (``allow_cpu=False``);
QGemm runs on the CPU where its scales are computed at run time or B's zero point is per column.

Operand ranges keep every pair of uint8 x int8 products below 2^15, so that onnxruntime's AVX2 kernels (which add
such pairs in saturating 16-bit lanes on CPUs without VNNI) compute the exact sums these tests expect on any machine.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import onnx
import onnxruntime
import pytest
from helpers import run_model
from onnx import TensorProto, helper

from ortgpu_core._errors import InvalidModelError, ModelError, UnsupportedOpError

MS = "com.microsoft"
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
    node: onnx.NodeProto,
    inputs: dict[str, np.ndarray],
    output: tuple[str, Any],
    constants: dict[str, np.ndarray],
) -> onnx.ModelProto:
    as_type = onnx.helper.np_dtype_to_tensor_dtype
    graph = helper.make_graph(
        [node],
        "qgemm_softmax",
        [helper.make_tensor_value_info(name, as_type(value.dtype), value.shape) for name, value in inputs.items()],
        [helper.make_tensor_value_info(output[0], as_type(np.dtype(output[1])), None)],
        [onnx.numpy_helper.from_array(np.asarray(value), name) for name, value in constants.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])


def _onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, feeds)[0])


def _check_exact(model: onnx.ModelProto, feeds: dict[str, np.ndarray], device: Any, on_device: bool) -> Any:
    got, plan = run_model(model.SerializeToString(), feeds, device, allow_cpu=not on_device)
    want = _onnxruntime(model, feeds)
    assert got[0].dtype == want.dtype and got[0].shape == want.shape, (got[0].dtype, want.dtype, want.shape)
    mismatched = int(np.count_nonzero(got[0] != want))
    assert mismatched == 0, f"{mismatched} of {want.size} values differ from onnxruntime"
    return plan


# ---------------------------------------------------------------------------------------------------------------------
# QGemm


def _operands(
    rng: np.random.Generator, a_dtype: Any, shapes: tuple[tuple[int, int], tuple[int, int]]
) -> tuple[np.ndarray, np.ndarray]:
    a_low, a_high = (0, 128) if a_dtype == np.uint8 else (-64, 64)
    a = rng.integers(a_low, a_high, shapes[0]).astype(a_dtype)
    b = rng.integers(-64, 64, shapes[1]).astype(np.int8)
    return a, b


def _qgemm(
    rng: np.random.Generator,
    a_dtype: Any,
    m: int,
    k: int,
    n: int,
    *,
    trans_a: int = 0,
    trans_b: int = 0,
    bias_shape: tuple[int, ...] | None = None,
    quantized: bool = True,
    alpha: float | None = None,
    per_column_scale: bool = False,
    scales_as_inputs: bool = False,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    a, b = _operands(rng, a_dtype, ((k, m) if trans_a else (m, k), (n, k) if trans_b else (k, n)))
    feeds = {"a": a, "b": b}
    scales = {
        "sa": np.array(rng.uniform(0.005, 0.05), np.float32),
        "sb": np.asarray(rng.uniform(0.002, 0.02, n if per_column_scale else ()), np.float32),
    }
    constants: dict[str, np.ndarray] = {
        "za": np.array(rng.integers(0, 128) if a_dtype == np.uint8 else rng.integers(-20, 20), a_dtype),
        "zb": np.zeros(n, np.int8) if per_column_scale else np.array(rng.integers(-8, 8), np.int8),
    }
    (feeds if scales_as_inputs else constants).update(scales)
    names = ["a", "sa", "za", "b", "sb", "zb"]
    if bias_shape is not None:
        constants["c"] = rng.integers(-3000, 3000, bias_shape).astype(np.int32)
        names.append("c")
    if quantized:
        constants["sy"] = np.array(rng.uniform(0.05, 0.3), np.float32)
        constants["zy"] = np.array(rng.integers(0, 256) if a_dtype == np.uint8 else rng.integers(-128, 128), a_dtype)
        names += ([""] if bias_shape is None else []) + ["sy", "zy"]  # C is optional: "" holds its place
    attrs: dict[str, Any] = {"transA": trans_a, "transB": trans_b}
    if alpha is not None:
        attrs["alpha"] = alpha
    node = helper.make_node("QGemm", names, ["y"], domain=MS, **attrs)
    return _model(node, feeds, ("y", a_dtype if quantized else np.float32), constants), feeds


QGEMM_CASES = [
    # (m, k, n, trans_a, trans_b, bias shape, quantized, alpha)
    (3, 5, 4, 0, 0, None, True, None),
    (3, 5, 4, 0, 1, (4,), True, None),  # quantize_static's form: B stored (N, K), a bias per column
    (4, 7, 3, 1, 0, (4, 1), True, 0.5),
    (2, 9, 5, 1, 1, (2, 5), False, None),  # float output
    (5, 3, 6, 0, 1, (1, 6), False, 2.0),
    (1, 33, 7, 0, 0, (), True, 1.5),  # odd sizes, a scalar bias
]


@pytest.mark.parametrize("a_dtype", [np.uint8, np.int8], ids=["u8", "s8"])
@pytest.mark.parametrize("case", QGEMM_CASES, ids=str)
def test_qgemm_matches_onnxruntime_on_the_device(case: Any, a_dtype: Any, device: Any) -> None:
    m, k, n, trans_a, trans_b, bias_shape, quantized, alpha = case
    model, feeds = _qgemm(
        np.random.default_rng(m * 100 + k * 10 + n),
        a_dtype,
        m,
        k,
        n,
        trans_a=trans_a,
        trans_b=trans_b,
        bias_shape=bias_shape,
        quantized=quantized,
        alpha=alpha,
    )
    plan = _check_exact(model, feeds, device, on_device=True)
    assert all(step.placement == "webgpu" for step in plan.steps if step.op_type == "QGemm")


@pytest.mark.parametrize("quantized", [True, False], ids=["quantized", "float"])
def test_qgemm_per_column_scales_on_the_device(quantized: bool, device: Any) -> None:
    """Per-channel weights (one B scale per output column) keep the node on the device: a multiplier per column."""
    model, feeds = _qgemm(np.random.default_rng(7), np.uint8, 4, 6, 5, trans_b=1, bias_shape=(5,), quantized=quantized)
    per_column, _ = _qgemm(
        np.random.default_rng(7), np.uint8, 4, 6, 5, trans_b=1, bias_shape=(5,), quantized=quantized,
        per_column_scale=True,
    )  # fmt: skip
    _check_exact(model, feeds, device, on_device=True)
    _check_exact(per_column, feeds, device, on_device=True)


def test_qgemm_runtime_scales_run_on_the_cpu(device: Any) -> None:
    """Scales fed at run time leave the multipliers unknown when planning: the node runs on the CPU, still exact."""
    model, feeds = _qgemm(np.random.default_rng(9), np.uint8, 3, 4, 5, bias_shape=(5,), scales_as_inputs=True)
    plan = _check_exact(model, feeds, device, on_device=False)
    assert [step.placement for step in plan.steps if step.op_type == "QGemm"] == ["cpu"]


def test_qgemm_bad_inputs(device: Any) -> None:
    rng = np.random.default_rng(3)
    model, feeds = _qgemm(rng, np.uint8, 3, 4, 5, trans_b=1)
    node = model.graph.node[0]
    del node.attribute[:]
    node.attribute.append(helper.make_attribute("transB", 0))  # B stored (N, K), read as (K, N): K 4 against 5
    # found when the model is loaded (its output shape): a ModelError naming the node and the fix
    with pytest.raises(ModelError, match="QGemm.*check the transpose attributes"):
        run_model(model.SerializeToString(), feeds, device)
    bad_bias, bias_feeds = _qgemm(rng, np.uint8, 3, 4, 5, bias_shape=(3,))
    with pytest.raises(ModelError, match="QGemm: bias C of shape"):
        run_model(bad_bias.SerializeToString(), bias_feeds, device)
    half, half_feeds = _qgemm(rng, np.uint8, 2, 2, 2, scales_as_inputs=True)
    half_feeds["sa"] = half_feeds["sa"].astype(np.float16)
    half.graph.input[2].type.tensor_type.elem_type = TensorProto.FLOAT16
    with pytest.raises(UnsupportedOpError, match="QGemm: a_scale of dtype float16"):
        run_model(half.SerializeToString(), half_feeds, device)


# ---------------------------------------------------------------------------------------------------------------------
# QLinearSoftmax


def _softmax(
    rng: np.random.Generator, dtype: Any, shape: tuple[int, ...], opset: int, axis: int | None, y_scale: float
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    info = np.iinfo(dtype)
    x = rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)
    constants = {
        "sx": np.array(rng.uniform(0.01, 0.3), np.float32),
        "zx": np.array(0, dtype),
        "sy": np.array(y_scale, np.float32),
        "zy": np.array(0 if dtype == np.uint8 else -128, dtype),
    }
    attrs: dict[str, Any] = {"opset": opset}
    if axis is not None:
        attrs["axis"] = axis
    node = helper.make_node("QLinearSoftmax", ["x", "sx", "zx", "sy", "zy"], ["y"], domain=MS, **attrs)
    return _model(node, {"x": x}, ("y", dtype), constants), {"x": x}


SOFTMAX_CASES = [
    # (shape, opset attribute, axis or None for the default, y_scale)
    ((3, 10), 13, None, 1 / 256),  # quantize_static's form
    ((2, 3, 5), 13, 1, 1 / 255),  # an inner axis: the rows are strided
    ((2, 3, 5), 12, None, 1 / 256),  # the schema's default axis -1, even before opset 13
    ((2, 3, 5), 12, 1, 1 / 256),  # before opset 13: rows from axis 1 on, 15 terms each
    ((4, 1), 13, -1, 1 / 255),  # one-term rows: every output is the largest step
    ((2, 2, 3, 7), 11, 2, 0.01),
]


@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["u8", "s8"])
@pytest.mark.parametrize("case", SOFTMAX_CASES, ids=str)
def test_qlinear_softmax_matches_onnxruntime(case: Any, dtype: Any, device: Any) -> None:
    """On the device, within one step of onnxruntime, and one step away in at most 1% of the elements."""
    shape, opset, axis, y_scale = case
    model, feeds = _softmax(np.random.default_rng(len(shape) * 10 + opset), dtype, shape, opset, axis, y_scale)
    [got], plan = run_model(model.SerializeToString(), feeds, device, allow_cpu=False)
    assert [step.placement for step in plan.steps if step.op_type == "QLinearSoftmax"] == ["webgpu"]
    want = _onnxruntime(model, feeds)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, want.shape)
    gap = np.abs(got.astype(np.int64) - want.astype(np.int64))
    assert gap.max() <= 1, f"{int(np.count_nonzero(gap > 1))} values differ from onnxruntime by more than one step"
    one_step = int(np.count_nonzero(gap))
    assert one_step <= max(1, want.size // 100), f"{one_step} of {want.size} values are one step from onnxruntime's"


def test_qlinear_softmax_bad_attributes(device: Any) -> None:
    model, feeds = _softmax(np.random.default_rng(1), np.uint8, (2, 3), 13, 2, 1 / 256)
    with pytest.raises(ModelError, match="QLinearSoftmax: axis 2 out of range"):
        run_model(model.SerializeToString(), feeds, device)
    missing, feeds = _softmax(np.random.default_rng(1), np.uint8, (2, 3), 13, None, 1 / 256)
    del missing.graph.node[0].attribute[:]
    with pytest.raises(InvalidModelError, match="'opset' attribute is required"):
        run_model(missing.SerializeToString(), feeds, device)
