"""The executor on both backends: test models against onnxruntime, recording, CPU fallback, memory plan, release."""

from __future__ import annotations

import gc
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import models
import numpy as np
import onnx
import pytest
from helpers import run_model
from onnx import TensorProto, helper

from ortgpu._executor import DeviceProgram, WeightStore, device_caps, padded_bytes
from ortgpu._pipeline_cache import PipelineCache
from ortgpu._planner import plan_model
from ortgpu.loader._model import load_model
from ortgpu.ops import registered_op_types
from ortgpu.ops._runner import padded_size
from ortgpu_core._errors import ModelError, UnsupportedOpError

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
    assert dev.live_handles() == before, "the executor leaked device objects"


def _require(model: onnx.ModelProto) -> None:
    missing = {n.op_type for n in model.graph.node} - set(registered_op_types())
    assert not missing, f"operators not implemented: {sorted(missing)}"


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(session.run(None, feeds))


def _rel_err(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(actual.astype(np.float64) - expected).max() / max(np.abs(expected).max(), 1e-30))


_CASES = {
    "mlp": (lambda: models.mlp(layers=4, width=256), {"X": (2, 256)}),
    "mlp_batch1": (lambda: models.mlp(layers=3, width=128), {"X": (1, 128)}),
    "resnet": (lambda: models.resnet(channels=8, size=16, blocks=2), {"X": (2, 3, 16, 16)}),
    "depthwise": (lambda: models.depthwise_separable(channels=8, out_channels=16, size=12), {"X": (1, 8, 12, 12)}),
    "transformer": (
        lambda: models.transformer_encoder(seq=12, vocab=50, d_model=32, heads=4, ffn=64),
        {"ids": (2, 12)},
    ),
}


@pytest.mark.parametrize("case", sorted(_CASES))
def test_models_match_onnxruntime(case: str, device: Any) -> None:
    build, shapes = _CASES[case]
    model = build()
    _require(model)
    feeds = models.random_feeds(model, shapes, high=50)
    expected = _ort(model, feeds)
    outputs, plan = run_model(model.SerializeToString(), feeds, device)
    for got, want in zip(outputs, expected):
        assert got.shape == want.shape and got.dtype == want.dtype
        assert _rel_err(got, want) < 1e-4, plan.describe()


def test_mlp_fuses_epilogues_and_reuses_buffers(device: Any) -> None:
    model = load_model(models.mlp(layers=8, width=64))
    plan = plan_model(model, {"X": (1, 64)}, device_caps(device))
    assert len(plan.steps) == 8
    assert [s.op_types for s in plan.steps[:-1]] == [("MatMul", "Add", "Relu")] * 7
    assert plan.steps[-1].op_types == ("MatMul", "Add")
    assert len(plan.slot_sizes) == 2  # ping-pong between two buffers
    assert plan.capturable and plan.cpu_nodes == []
    assert {p[2] for p in plan.placement} == {"webgpu"}
    unfused = plan_model(model, {"X": (1, 64)}, device_caps(device), fuse=False)
    assert len(unfused.steps) == 8 * 3 - 1


_generations = itertools.count(1)


@dataclass(eq=False)
class Raw:
    """A buffer made directly on a backend device, as programs take buffers (handle and generation)."""

    handle: int
    generation: int = field(default_factory=lambda: next(_generations))
    released: bool = False


def _raw_allocator(
    device: Any, allocated: list[Raw] | None = None
) -> tuple[Callable[[int], Raw], Callable[[Raw], None]]:
    """``allocate`` and ``free`` for a program's intermediates, straight on ``device``."""

    def allocate(nbytes: int) -> Raw:
        buffer = Raw(device.create_buffer(nbytes))
        if allocated is not None:
            allocated.append(buffer)
        return buffer

    def free(buffer: Raw) -> None:
        buffer.released = True
        device.destroy_buffer(buffer.handle)

    return allocate, free


def _buffers(
    device: Any, arrays: dict[str, np.ndarray], infos: dict[str, Any]
) -> tuple[dict[str, Raw], dict[str, Raw]]:
    inputs = {}
    for name, array in arrays.items():
        inputs[name] = Raw(device.create_buffer(padded_size(array.nbytes)))
        if array.nbytes:
            device.write_buffer(inputs[name].handle, 0, padded_bytes(array))
    outputs = {name: Raw(device.create_buffer(padded_size(info.nbytes))) for name, info in infos.items()}
    return inputs, outputs


def _read(device: Any, buffer: Raw, info: Any) -> np.ndarray:
    raw = device.read_buffer(buffer.handle, 0, padded_size(info.nbytes))
    return np.frombuffer(raw, np.uint8, count=info.nbytes).view(info.dtype).reshape(info.shape)


def test_record_replays_with_new_input_data(device: Any) -> None:
    proto = models.mlp(layers=3, width=32)
    model = load_model(proto)
    plan = plan_model(model, {"X": (2, 32)}, device_caps(device))
    cache = PipelineCache(device)
    weights = WeightStore(device)
    allocated: list[Raw] = []
    allocate, free = _raw_allocator(device, allocated)

    program = DeviceProgram(plan, device, cache, allocate, free, weights)
    x = np.random.default_rng(0).standard_normal((2, 32)).astype(np.float32)
    inputs, outputs = _buffers(device, {"X": x}, plan.output_infos)
    try:
        commands = program.record(inputs, outputs)
        again = program.record(inputs, outputs)
        assert len(program._bind_groups) == 1  # cached by buffer identity
        assert len(commands) == len(again) == 3
        for seed in range(2):
            x = np.random.default_rng(seed).standard_normal((2, 32)).astype(np.float32)
            device.write_buffer(inputs["X"].handle, 0, padded_bytes(x))
            device.submit(commands)
            got = _read(device, outputs["Y"], plan.output_infos["Y"])
            np.testing.assert_allclose(got, _ort(proto, {"X": x})[0], rtol=1e-4, atol=1e-5)
        # A second plan (another batch) shares the weights already uploaded.
        count = len(weights)
        plan4 = plan_model(model, {"X": (4, 32)}, device_caps(device))
        program4 = DeviceProgram(plan4, device, cache, allocate, free, weights)
        assert len(weights) == count
        program4.release()
    finally:
        program.release()
        program.release()  # idempotent
        weights.release()
        cache.release()
        for buffer in list(inputs.values()) + list(outputs.values()):
            device.destroy_buffer(buffer.handle)
    assert len(allocated) == len(plan.slot_sizes) + len(plan4.slot_sizes)


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    inits: list[onnx.TensorProto] | None = None,
    opset: int = 17,
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 10)  # readable by older onnxruntime too (1.31 stops at IR 13)
    return model


def test_cpu_fallback_is_reported_and_runs(device: Any) -> None:
    # float64 arithmetic has no WGSL kernel: the Add runs on the CPU between device nodes.
    proto = _model(
        [
            helper.make_node("Cast", ["X"], ["x64"], name="to_float64", to=TensorProto.DOUBLE),
            helper.make_node("Add", ["x64", "x64"], ["s64"], name="add_float64"),
            helper.make_node("Cast", ["s64"], ["s"], name="to_float", to=TensorProto.FLOAT),
            helper.make_node("Relu", ["s"], ["Y"], name="relu"),
        ],
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 4])],
    )
    _require(proto)
    model = load_model(proto)
    plan = plan_model(model, {"X": (3, 4)}, device_caps(device))
    assert plan.cpu_nodes == ["add_float64"] and not plan.capturable
    assert ("add_float64", "Add", "cpu") == plan.placement[1][:3]
    with pytest.raises(UnsupportedOpError, match="add_float64"):
        plan_model(model, {"X": (3, 4)}, device_caps(device), allow_cpu=False)
    x = np.arange(-6, 6, dtype=np.float32).reshape(3, 4)
    outputs, _ = run_model(model, {"X": x}, device)
    np.testing.assert_array_equal(outputs[0], np.maximum(2 * x, 0))
    cache = PipelineCache(device)
    program = DeviceProgram(plan, device, cache, *_raw_allocator(device))
    try:
        with pytest.raises(ModelError, match="add_float64"):
            program.record({"X": Raw(0)}, {"Y": Raw(0)})
    finally:
        program.release()
        cache.release()


def test_outputs_that_alias_inputs_or_each_other_get_copies(device: Any) -> None:
    proto = _model(
        [
            helper.make_node("Relu", ["X"], ["Y"], name="relu"),
            helper.make_node("Reshape", ["Y", "shape"], ["Z"], name="reshape"),
            helper.make_node("Reshape", ["X", "shape"], ["W"], name="reshape_input"),
        ],
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("Z", TensorProto.FLOAT, [6]),
            helper.make_tensor_value_info("W", TensorProto.FLOAT, [6]),
            helper.make_tensor_value_info("C", TensorProto.FLOAT, [2]),
        ],
        [
            onnx.numpy_helper.from_array(np.array([6], np.int64), "shape"),
            onnx.numpy_helper.from_array(np.array([1.5, -2.0], np.float32), "C"),
        ],
    )
    _require(proto)
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    outputs, plan = run_model(proto, {"X": x}, device)
    assert {name for _, name, _ in plan.output_copies} == {"Z", "W", "C"}
    np.testing.assert_array_equal(outputs[0], np.maximum(x, 0))
    np.testing.assert_array_equal(outputs[1], np.maximum(x, 0).reshape(6))
    np.testing.assert_array_equal(outputs[2], x.reshape(6))
    np.testing.assert_array_equal(outputs[3], [1.5, -2.0])


def test_empty_tensors(device: Any) -> None:
    proto = _model(
        [helper.make_node("Relu", ["X"], ["R"]), helper.make_node("Add", ["R", "X"], ["Y"])],
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", 4])],
    )
    outputs, plan = run_model(proto, {"X": np.zeros((0, 4), np.float32)}, device)
    assert outputs[0].shape == (0, 4)
    assert all(size >= 4 for size in plan.slot_sizes)


def test_pipeline_cache_is_shared_across_plans(device: Any) -> None:
    cache = PipelineCache(device)
    try:
        model = load_model(models.mlp(layers=2, width=32))
        x = np.ones((2, 32), np.float32)
        run_model(model, {"X": x}, device, pipeline_cache=cache)
        misses = cache.misses
        run_model(model, {"X": x}, device, pipeline_cache=cache)
        if device.info.backend_type != "Fake":  # the fake keys pipelines by twin too
            assert cache.misses == misses and cache.hits > 0
    finally:
        cache.release()


def test_release_frees_everything(device: Any) -> None:
    before = device.live_handles()
    model = load_model(models.mlp(layers=2, width=16))
    plan = plan_model(model, {"X": (1, 16)}, device_caps(device))
    cache = PipelineCache(device)
    program = DeviceProgram(plan, device, cache, *_raw_allocator(device))
    inputs, outputs = _buffers(device, {"X": np.ones((1, 16), np.float32)}, plan.output_infos)
    program.run(inputs, outputs, device.submit)
    program.forget_buffers([inputs["X"]])
    assert program._bind_groups == {}
    program.release()
    cache.release()
    for buffer in list(inputs.values()) + list(outputs.values()):
        device.destroy_buffer(buffer.handle)
    assert device.live_handles() == before


def test_resnet_folds_batchnorm_and_fuses_residuals(device: Any) -> None:
    proto = models.resnet(channels=8, size=16, blocks=2)
    _require(proto)
    model = load_model(proto)
    plan = plan_model(model, {"X": (1, 3, 16, 16)}, device_caps(device))
    kinds = [s.op_types for s in plan.steps]
    assert not any("BatchNormalization" in kind for kind in kinds)  # folded into the Conv weights
    assert ("Conv", "Relu") in kinds
    assert ("Conv", "Add", "Relu") in kinds  # the residual Add and its Relu ride on a Conv
    assert plan.capturable


def test_transformer_fuses_attention_scale_and_gelu(device: Any) -> None:
    """The encoder's attention (Q K^T, its scale, Softmax, probs V, reading Q, K and V through their head-split
    Reshapes and Transposes, writing through the heads' merge) is one fused step per layer, and its exported erf GELU
    rides on its MatMul."""
    proto = models.transformer_encoder(seq=12, vocab=50, d_model=32, heads=4, ffn=64, layers=2)
    _require(proto)
    model = load_model(proto)
    plan = plan_model(model, {"ids": (2, 12)}, device_caps(device))
    kinds = [s.op_types for s in plan.steps]
    heads = ("Reshape", "Transpose")
    attention = heads * 2 + ("MatMul", "Mul", "Softmax") + heads + ("MatMul", "Transpose")
    assert kinds.count(attention) == 2, plan.describe()
    assert not any("Softmax" in kind for kind in kinds if kind != attention)
    # the heads' merge after probs V is written by the attention in its new layout: its Reshape is a view
    assert not any("Transpose" in kind for kind in kinds if kind != attention)
    merges = [s for s in plan.steps if s.op_types == ("Reshape",)]
    assert len(merges) == 2 and all("no kernel" in s.reason for s in merges), plan.describe()
    gelu = ("MatMul", "Add", "Div", "Erf", "Add", "Mul", "Mul")
    assert kinds.count(gelu) == 2, plan.describe()
    assert not any(op in ("Erf", "Div") for kind in kinds for op in kind[:1])
    fused = next(s for s in plan.steps if s.op_types == gelu)
    assert fused.attrs["_epilogue"] == (("add", 2), ("gelu",))
    feeds = models.random_feeds(proto, {"ids": (2, 12)}, high=50)
    outputs, _ = run_model(model, feeds, device)
    assert _rel_err(outputs[0], _ort(proto, feeds)[0]) < 1e-4


def _gelu_model(form: str, extra_consumer: bool = False) -> onnx.ModelProto:
    """MatMul -> Add bias -> an erf GELU written as ``form`` (-> Add residual), float32 [4, 8] x [8, 16]."""
    rng = np.random.default_rng(3)
    inits = [
        onnx.numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "W"),
        onnx.numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "B"),
        onnx.numpy_helper.from_array(np.array(np.sqrt(2.0), np.float32), "sqrt2"),
        onnx.numpy_helper.from_array(np.array(1 / np.sqrt(2.0), np.float32), "rsqrt2"),
        onnx.numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        onnx.numpy_helper.from_array(np.array(0.5, np.float32), "half"),
        onnx.numpy_helper.from_array(np.array(3.0, np.float32), "three"),
    ]
    nodes = [helper.make_node("MatMul", ["X", "W"], ["mm"]), helper.make_node("Add", ["mm", "B"], ["x"])]
    if form == "div":  # torch: x * (1 + erf(x / sqrt2)) * 0.5
        nodes += [
            helper.make_node("Div", ["x", "sqrt2"], ["u"]),
            helper.make_node("Erf", ["u"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["a"]),
            helper.make_node("Mul", ["x", "a"], ["p"]),
            helper.make_node("Mul", ["p", "half"], ["g"]),
        ]
    elif form == "half_first":  # bench.models: (x * 0.5) * (1 + erf(x / sqrt2))
        nodes += [
            helper.make_node("Div", ["x", "sqrt2"], ["u"]),
            helper.make_node("Erf", ["u"], ["e"]),
            helper.make_node("Add", ["one", "e"], ["a"]),
            helper.make_node("Mul", ["half", "x"], ["p"]),
            helper.make_node("Mul", ["a", "p"], ["g"]),
        ]
    else:  # ((1 + erf(x * rsqrt2)) * 0.5) * x
        nodes += [
            helper.make_node("Mul", ["rsqrt2", "x"], ["u"]),
            helper.make_node("Erf", ["u"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["a"]),
            helper.make_node("Mul", ["a", "half"], ["p"]),
            helper.make_node("Mul", ["x", "p"], ["g"]),
        ]
    nodes.append(helper.make_node("Mul", ["g", "three"], ["s"]))
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 16])]
    if extra_consumer:  # the Erf's result is also a graph output: no fusion of the GELU
        outputs.append(helper.make_tensor_value_info("e", TensorProto.FLOAT, [4, 16]))
    nodes.append(helper.make_node("Add", ["s", "X2"], ["Y"]))
    inputs = [
        helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 8]),
        helper.make_tensor_value_info("X2", TensorProto.FLOAT, [4, 16]),
    ]
    return _model(nodes, inputs, outputs, inits)


@pytest.mark.parametrize("form", ["div", "half_first", "mul_rsqrt2"])
@pytest.mark.parametrize("extra_consumer", [False, True])
def test_gelu_patterns_fuse_into_the_matmul(device: Any, form: str, extra_consumer: bool) -> None:
    proto = _gelu_model(form, extra_consumer)
    _require(proto)
    model = load_model(proto)
    plan = plan_model(model, {"X": (4, 8), "X2": (4, 16)}, device_caps(device))
    if extra_consumer:
        assert plan.steps[0].op_types == ("MatMul", "Add")
        # the GELU is not the MatMul's epilogue: its nodes run after it (fused with each other)
        assert any("Erf" in s.op_types for s in plan.steps[1:])
    else:
        assert len(plan.steps) == 1, plan.describe()
        assert plan.steps[0].attrs["_epilogue"] == (("add", 2), ("gelu",), ("scale", 3.0), ("add", 3))
    rng = np.random.default_rng(4)
    feeds = {"X": rng.standard_normal((4, 8)).astype(np.float32), "X2": rng.standard_normal((4, 16)).astype(np.float32)}
    outputs, _ = run_model(model, feeds, device)
    for got, want in zip(outputs, _ort(proto, feeds)):
        assert _rel_err(got, want) < 1e-4


@pytest.mark.parametrize("op,scalar,fused", [("Div", 4.0, True), ("Mul", 0.125, True), ("Div", 0.0, False)])
def test_scalar_scale_fuses_into_the_matmul(device: Any, op: str, scalar: float, fused: bool) -> None:
    rng = np.random.default_rng(5)
    inits = [
        onnx.numpy_helper.from_array(rng.standard_normal((3, 5, 6)).astype(np.float32), "K"),
        onnx.numpy_helper.from_array(np.array([scalar], np.float32), "c"),
    ]
    nodes = [helper.make_node("MatMul", ["X", "K"], ["s"]), helper.make_node(op, ["s", "c"], ["Y"])]
    proto = _model(
        nodes,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, 4, 5])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 4, 6])],
        inits,
    )
    model = load_model(proto)
    plan = plan_model(model, {"X": (3, 4, 5)}, device_caps(device))
    assert (plan.steps[0].op_types == ("MatMul", op)) == fused
    feeds = {"X": rng.standard_normal((3, 4, 5)).astype(np.float32)}
    outputs, _ = run_model(model, feeds, device)
    want = _ort(proto, feeds)[0]
    if fused:
        assert _rel_err(outputs[0], want) < 1e-4
    else:
        np.testing.assert_array_equal(np.isinf(outputs[0]), np.isinf(want))


@pytest.mark.parametrize("case", ["transformer", "resnet"])
def test_models_with_split_k_match_onnxruntime(case: str, device: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Forced split-K (scratch buffers from the memory plan, two kernels per GEMM step) gives the same results."""
    from ortgpu.ops import _gemm

    monkeypatch.setattr(_gemm, "GEMM_TARGET_WORKGROUPS", 100_000)
    monkeypatch.setattr(_gemm, "GEMM_SPLIT_MIN_K", 16)
    build, shapes = _CASES[case]
    model = build()
    feeds = models.random_feeds(model, shapes, high=50)
    outputs, plan = run_model(model.SerializeToString(), feeds, device)
    split_steps = [s for s in plan.steps if s.op_plan is not None and s.op_plan.scratch_sizes]
    assert split_steps and all(len(s.scratch_slots) == 1 for s in split_steps)
    for got, want in zip(outputs, _ort(model, feeds)):
        assert _rel_err(got, want) < 1e-4, plan.describe()


@pytest.mark.parametrize("layers", [3, 10])
def test_long_recordings_submit_their_first_dispatches_early(device: Any, layers: int) -> None:
    """A recording of at least 2 * EARLY_SUBMIT_DISPATCHES dispatches starts the GPU on the first ones while the rest
    is encoded (CommandList.early_submit); the results are those of one command buffer."""
    from ortgpu import _executor

    proto = models.mlp(layers=layers, width=32)
    model = load_model(proto)
    plan = plan_model(model, {"X": (1, 32)}, device_caps(device))
    allocated: list[Raw] = []
    allocate, free = _raw_allocator(device, allocated)

    cache, weights = PipelineCache(device), WeightStore(device)
    program = DeviceProgram(plan, device, cache, allocate, free, weights)
    x = np.random.default_rng(7).standard_normal((1, 32)).astype(np.float32)
    inputs, outputs = _buffers(device, {"X": x}, plan.output_infos)
    try:
        commands = program.record(inputs, outputs)
        assert commands.dispatch_count == layers
        split = _executor.EARLY_SUBMIT_DISPATCHES
        assert commands.early_submit == (split if layers >= 2 * split else 0)
        device.submit(commands)
        got = _read(device, outputs["Y"], plan.output_infos["Y"])
        np.testing.assert_allclose(got, _ort(proto, {"X": x})[0], rtol=1e-4, atol=1e-5)
    finally:
        program.release()
        weights.release()
        cache.release()
        for buffer in [*inputs.values(), *outputs.values()]:
            device.destroy_buffer(buffer.handle)


# -- Transposes folded into the MatMul that reads them ---------------------------------------------------------


def _transpose_matmul_model(
    a_shape: tuple[int, ...],
    a_perm: list[int] | None,
    b_shape: tuple[int, ...],
    b_perm: list[int] | None,
    *,
    bias: int | None = None,
    also_output: bool = False,
    default_perm: bool = False,
) -> onnx.ModelProto:
    """Y = MatMul(Transpose(A, a_perm) or A, Transpose(B, b_perm) or B) [+ bias]; A and B are graph inputs."""
    nodes = []
    operands = []
    for name, perm in (("A", a_perm), ("B", b_perm)):
        if perm is None:
            operands.append(name)
            continue
        attrs = {} if default_perm else {"perm": perm}
        nodes.append(helper.make_node("Transpose", [name], [f"{name}t"], name=f"t{name}", **attrs))
        operands.append(f"{name}t")
    nodes.append(helper.make_node("MatMul", operands, ["P" if bias else "Y"], name="mm"))
    inits = []
    if bias:
        inits.append(onnx.numpy_helper.from_array(np.linspace(-1, 1, bias, dtype=np.float32), "bias"))
        nodes.append(helper.make_node("Add", ["P", "bias"], ["Y"], name="add"))
    a_op = a_shape if a_perm is None else tuple(a_shape[p] for p in a_perm)
    b_op = b_shape if b_perm is None else tuple(b_shape[p] for p in b_perm)
    y_shape = np.matmul(np.zeros(a_op, np.float32), np.zeros(b_op, np.float32)).shape
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, list(y_shape))]
    if also_output:
        outputs.append(helper.make_tensor_value_info("At", TensorProto.FLOAT, list(a_op)))
    inputs = [
        helper.make_tensor_value_info("A", TensorProto.FLOAT, list(a_shape)),
        helper.make_tensor_value_info("B", TensorProto.FLOAT, list(b_shape)),
    ]
    return _model(nodes, inputs, outputs, inits)


_FOLD_CASES = {
    # name: (A shape, A perm, B shape, B perm, bias, folded transposes)
    "attention_scores": ((2, 6, 3, 4), [0, 2, 1, 3], (2, 6, 3, 4), [0, 2, 3, 1], None, 2),
    "attention_values": ((2, 3, 6, 6), None, (2, 6, 3, 5), [0, 2, 1, 3], None, 1),
    "scores_with_bias": ((1, 8, 2, 4), [0, 2, 1, 3], (1, 8, 2, 4), [0, 2, 3, 1], 8, 2),
    "weight_transposed": ((7, 8), None, (5, 8), [1, 0], None, 1),
    "rows_not_one_run": ((4, 3, 8), [1, 0, 2], (8, 6), None, None, 1),  # 12 rows, found through an index function
    "odd_sizes": ((3, 5, 7), [0, 2, 1], (5, 3), None, None, 1),
    "broadcast_batch": ((1, 5, 6), [0, 2, 1], (3, 5, 4), None, None, 1),  # A's batch of 1 broadcast to B's 3
    "activations_times_weight_t": ((2, 3, 8), None, (12, 8), [1, 0], 12, 1),  # A's batch folds into its rows
    "size_1_axis_moved": ((1, 7, 8), [1, 0, 2], (8, 12), None, 12, 1),  # ViT's [1, S, D] -> [S, 1, D]: S rows
    # one row: the GEMV reads A's K contiguous values whatever the perm, and B's [N, K] source as its "nk" layout
    "one_row": ((4, 1), [1, 0], (4, 5), None, None, 1),
    "one_row_weight_transposed": ((1, 8), None, (5, 8), [1, 0], 5, 1),
}


@pytest.mark.parametrize("case", sorted(_FOLD_CASES))
def test_transposes_fold_into_the_matmul(device: Any, case: str) -> None:
    a_shape, a_perm, b_shape, b_perm, bias, folded = _FOLD_CASES[case]
    proto = _transpose_matmul_model(a_shape, a_perm, b_shape, b_perm, bias=bias)
    model = load_model(proto)
    plan = plan_model(model, {"A": a_shape, "B": b_shape}, device_caps(device))
    kinds = [s.op_types for s in plan.steps]
    assert kinds == [("MatMul",) + ("Transpose",) * folded + (("Add",) if bias else ())], plan.describe()
    step = plan.steps[0]
    assert step.attrs["_input_perms"] == (
        None if a_perm is None else tuple(a_perm),
        None if b_perm is None else tuple(b_perm),
    )
    assert "folded input transpose" in step.reason
    assert "At" not in plan.tensors and "Bt" not in plan.tensors  # no buffer for the transposed copies
    rng = np.random.default_rng(7)
    feeds = {"A": rng.standard_normal(a_shape).astype(np.float32), "B": rng.standard_normal(b_shape).astype(np.float32)}
    outputs, _ = run_model(model, feeds, device)
    a = np.transpose(feeds["A"], a_perm) if a_perm is not None else feeds["A"]
    b = np.transpose(feeds["B"], b_perm) if b_perm is not None else feeds["B"]
    want = np.matmul(a.astype(np.float64), b.astype(np.float64)) + (np.linspace(-1, 1, bias) if bias else 0.0)
    assert outputs[0].shape == want.shape
    assert _rel_err(outputs[0], want) < 1e-5


@pytest.mark.parametrize("case", ["graph_output", "same_operand_twice", "default_perm"])
def test_transposes_that_stay_steps(device: Any, case: str) -> None:
    """A Transpose is folded only where the MatMul is its one reader and can take it; else it stays a step (and
    the default perm, reversing the axes, folds like any other)."""
    shapes = {"A": (4, 6), "B": (4, 5)}
    if case == "graph_output":  # the transposed tensor is also a model output: it must be written
        proto = _transpose_matmul_model((4, 6), [1, 0], (4, 5), None, also_output=True)
        # Y = At @ B ([6, 4] x [4, 5]); At is an output too
        expect_steps = [("Transpose",), ("MatMul",)]
    elif case == "same_operand_twice":  # At @ At: the transposed tensor feeds both operands
        nodes = [
            helper.make_node("Transpose", ["A"], ["At"], perm=[1, 0], name="t"),
            helper.make_node("MatMul", ["At", "At"], ["Y"], name="mm"),
        ]
        proto = _model(
            nodes,
            [helper.make_tensor_value_info("A", TensorProto.FLOAT, [4, 4])],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 4])],
        )
        shapes = {"A": (4, 4)}
        expect_steps = [("Transpose",), ("MatMul",)]
    else:  # no perm attribute: the axes reversed
        proto = _transpose_matmul_model((4, 6), [1, 0], (4, 5), None, default_perm=True)
        expect_steps = [("MatMul", "Transpose")]
    model = load_model(proto)
    plan = plan_model(model, shapes, device_caps(device))
    assert [s.op_types for s in plan.steps] == expect_steps, plan.describe()
    rng = np.random.default_rng(8)
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    outputs, _ = run_model(model, feeds, device)
    for got, want in zip(outputs, _ort(proto, feeds)):
        assert got.shape == want.shape and _rel_err(got, want) < 1e-5


def test_a_reused_native_address_never_picks_up_a_stale_bind_group(device: Any) -> None:
    """Bind groups are cached by (handle, generation): a new buffer at a freed buffer's native address (wgpu-native
    reuses them) gets its own bind group, and the freed buffer's is released at the next use of the program."""
    proto = models.mlp(layers=1, width=8)
    model = load_model(proto)
    plan = plan_model(model, {"X": (1, 8)}, device_caps(device))
    cache = PipelineCache(device)
    program = DeviceProgram(plan, device, cache, *_raw_allocator(device))
    x = np.arange(8, dtype=np.float32).reshape(1, 8)
    inputs, outputs = _buffers(device, {"X": x}, plan.output_infos)
    try:
        program.run(inputs, outputs, device.submit)
        first = next(iter(program._bind_groups.values()))[0]
        old = inputs["X"]
        old.released = True
        device.destroy_buffer(old.handle)
        # A new buffer that the allocator placed at the same address: same handle, new generation.
        reused = Raw(device.create_buffer(padded_size(x.nbytes)))
        twin = Raw(reused.handle)
        assert twin.handle == reused.handle and twin.generation != old.generation
        device.write_buffer(reused.handle, 0, padded_bytes(2 * x))
        program.run({"X": twin}, outputs, device.submit)
        assert len(program._bind_groups) == 1, "the released buffer's bind groups were not released"
        assert next(iter(program._bind_groups.values()))[0] is not first
        np.testing.assert_allclose(
            _read(device, outputs["Y"], plan.output_infos["Y"]), _ort(proto, {"X": 2 * x})[0], rtol=1e-5, atol=1e-5
        )
        device.destroy_buffer(reused.handle)
    finally:
        program.release()
        cache.release()
        for buffer in outputs.values():
            device.destroy_buffer(buffer.handle)


def test_pipelines_no_plan_uses_are_bounded(device: Any) -> None:
    """Plans for ever new shapes (WGSL carries shapes) leave at most ``max_idle`` unused pipelines behind on
    devices that compile WGSL; twin devices release them at once.  A pipeline still used by a live plan is never
    released, and an idle one is reused."""
    model = load_model(models.mlp(layers=2, width=16))
    cache = PipelineCache(device, max_idle=2)
    try:
        kept = plan_model(model, {"X": (1, 16)}, device_caps(device))
        kept_pipelines = {cache.get(kernel) for kernel in _kernels(kept)}
        for batch in range(2, 9):
            plan = plan_model(model, {"X": (batch, 16)}, device_caps(device))
            for kernel in _kernels(plan):
                cache.get(kernel)
            del plan, kernel
            gc.collect()
            cache.collect()
        twins = device.runs_numpy_twins
        assert cache.idle == (0 if twins else 2)
        assert len(cache) == len(kept_pipelines) + cache.idle
        again = plan_model(model, {"X": (1, 16)}, device_caps(device))
        hits = cache.hits
        assert {cache.get(kernel) for kernel in _kernels(again)} == kept_pipelines or twins
        assert twins or cache.hits == hits + len(kept_pipelines)
        del kept
    finally:
        cache.release()


def _kernels(plan: Any) -> list[Any]:
    return [kernel for step in plan.steps if step.op_plan is not None for kernel in step.op_plan.kernels]
