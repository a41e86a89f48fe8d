"""InferenceSession end to end, on both backends: real models against onnxruntime's CPU provider, bad input."""

from __future__ import annotations

import gc

import numpy as np
import onnx
import onnxruntime
import pytest
from conftest import owned_handles
from onnx import TensorProto, helper, numpy_helper

import ortgpu
from bench.models import depthwise_separable, mlp, random_feeds, resnet, transformer_encoder
from ortgpu import _device_caches

MODELS = {
    "mlp": (lambda: mlp(layers=3, width=32, batch=2), {"X": (2, 32)}),
    "resnet": (lambda: resnet(batch=1, channels=8, size=16, blocks=2), {"X": (1, 3, 16, 16)}),
    "depthwise": (lambda: depthwise_separable(batch=1, channels=8, out_channels=16, size=12), {"X": (1, 8, 12, 12)}),
    "encoder": (lambda: transformer_encoder(batch=2, seq=8, vocab=50, d_model=32, heads=4, ffn=64), {"ids": (2, 8)}),
}


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.linalg.norm(actual - expected) / max(float(np.linalg.norm(expected)), 1e-30))


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(session.run(None, feeds))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_match_onnxruntime(env: ortgpu.Env, name: str) -> None:
    build, shapes = MODELS[name]
    model = build()
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as sess:
        for _ in range(2):  # fresh random inputs each time (unseeded), through the same cached plan
            feeds = random_feeds(model, shapes, seed=None)
            expected = onnxruntime_outputs(model, feeds)
            actual = sess.run(None, feeds)
            assert len(actual) == len(expected)
            for a, e in zip(actual, expected):
                assert a.dtype == e.dtype and a.shape == e.shape
                assert relative_error(a, e) < 1e-4
        placements = sess.get_node_placement(shapes)
        assert placements and all(p.placement == "webgpu" for p in placements)


def test_run_with_ort_values_returns_session_values(env: ortgpu.Env) -> None:
    model = mlp(layers=2, width=16, batch=3)
    feeds = random_feeds(model, {"X": (3, 16)})
    expected = onnxruntime_outputs(model, feeds)
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as sess:
        x = env.shared_allocator(sess.device).from_numpy(feeds["X"])
        (y,) = sess.run_with_ort_values(None, {"X": x})
        assert y.provenance.session_id == sess.session_id and y.provenance.allocator_kind == "session"
        assert relative_error(y.to_numpy(), expected[0]) < 1e-4
        (y_cpu_in,) = sess.run_with_ort_values(["Y"], {"X": ortgpu.OrtValue.ortvalue_from_numpy(feeds["X"])})
        assert relative_error(y_cpu_in.to_numpy(), expected[0]) < 1e-4
        del y, y_cpu_in, x


def test_dynamic_batch_gets_a_plan_per_shape(env: ortgpu.Env) -> None:
    model = mlp(layers=2, width=16, batch=1)  # the batch dim is symbolic in the builder
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as sess:
        assert sess.get_inputs()[0].shape[0] == "batch"
        for batch in (1, 4, 1):
            feeds = random_feeds(model, {"X": (batch, 16)}, seed=batch)
            (out,) = sess.run(None, feeds)
            assert relative_error(out, onnxruntime_outputs(model, feeds)[0]) < 1e-4
        assert len(sess._runner.plans) == 2


def test_metadata_follows_onnxruntime(env: ortgpu.Env) -> None:
    model = mlp(layers=1, width=8, batch=2)
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as sess:
        (inp,) = sess.get_inputs()
        (out,) = sess.get_outputs()
        assert (inp.name, inp.type, out.name, out.type) == ("X", "tensor(float)", "Y", "tensor(float)")
        assert inp.shape == ["batch", 8]
        assert "WebGpuExecutionProvider" in sess.get_providers()


def test_bad_feeds_are_refused_and_nothing_runs(env: ortgpu.Env) -> None:
    model = mlp(layers=1, width=8, batch=2)
    good = np.ones((2, 8), np.float32)
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as sess:
        sess.run(None, {"X": good})
        backend_device = sess.device._native_device()
        stats_before = getattr(backend_device, "stats", None)
        with pytest.raises(ortgpu.InvalidArgumentError, match=r"missing inputs \['X'\]"):
            sess.run(None, {})
        with pytest.raises(ortgpu.InvalidArgumentError, match=r"unknown inputs \['Z'\]"):
            sess.run(None, {"X": good, "Z": good})
        with pytest.raises(ortgpu.DtypeError, match="never casts silently"):
            sess.run(None, {"X": good.astype(np.float64)})
        with pytest.raises(ortgpu.ShapeError, match=r"has shape \['batch', 8\] in the model, got \[2, 9\]"):
            sess.run(None, {"X": np.ones((2, 9), np.float32)})
        with pytest.raises(TypeError, match="numpy array"):
            sess.run(None, {"X": "not an array"})  # type: ignore[dict-item]
        # Nested lists are taken where they convert exactly, as onnxruntime takes them; others are refused.
        with pytest.raises(ortgpu.DtypeError, match="does not convert to float32"):
            sess.run(None, {"X": [["a"] * 8] * 2})
        with pytest.raises(ortgpu.InvalidArgumentError, match=r"unknown outputs \['nope'\]"):
            sess.run(["nope"], {"X": good})
        with pytest.raises(ortgpu.CaptureStateError, match="run_with_iobinding"):
            sess.run(None, {"X": good}, ortgpu.RunOptions(gpu_graph_id=0))
        if stats_before is not None:  # the fake backend counts submits: none of the refused runs submitted
            assert backend_device.stats.submits == stats_before.submits


def test_truncated_model_file(tmp_path: object, env: ortgpu.Env) -> None:
    data = mlp(layers=1, width=8).SerializeToString()
    with pytest.raises(ortgpu.InvalidModelError):
        ortgpu.InferenceSession(data[: len(data) // 2], env=env)


def test_unsupported_operator_names_op_node_and_opset(env: ortgpu.Env) -> None:
    node = helper.make_node("ImageDecoder", ["X"], ["Y"], name="my_decoder")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.UINT8, [16])],
        [helper.make_tensor_value_info("Y", TensorProto.UINT8, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    with pytest.raises(ortgpu.UnsupportedOpError) as raised:
        ortgpu.InferenceSession(model.SerializeToString(), env=env)
    message = str(raised.value)
    assert "ImageDecoder" in message and "my_decoder" in message and "20" in message


def float64_model() -> bytes:
    nodes = [
        helper.make_node("Cast", ["X"], ["x64"], to=TensorProto.DOUBLE, name="widen"),
        helper.make_node("Add", ["x64", "x64"], ["s64"], name="add_in_float64"),
        helper.make_node("Cast", ["s64"], ["Y"], to=TensorProto.FLOAT, name="narrow"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_cpu_placement_is_reported_or_forbidden(env: ortgpu.Env) -> None:
    with ortgpu.InferenceSession(float64_model(), env=env) as sess:
        placement = {p.node: p.placement for p in sess.get_node_placement()}
        assert placement["add_in_float64"] == "cpu"
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        np.testing.assert_array_equal(sess.run(None, {"X": x})[0], 2 * x)
    with pytest.raises(ortgpu.UnsupportedOpError, match="add_in_float64"):
        ortgpu.InferenceSession(float64_model(), env=env, allow_cpu_fallback=False)


def test_model_strings_never_reach_wgsl(env: ortgpu.Env) -> None:
    evil = "x}; fn evil() { loop {} } //"
    w = np.eye(4, dtype=np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", [evil, "W"], ["Y"], name=evil + "node"),
        ],
        "g",
        [helper.make_tensor_value_info(evil, TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as sess:
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        np.testing.assert_array_equal(sess.run(None, {evil: x})[0], x)
        cache = _device_caches._pipeline_caches[sess.device._native_device()]
        texts = [key if isinstance(key, str) else key[0] for key in cache._pipelines]
        assert texts and not any("evil" in text for text in texts)


def test_closed_session(env: ortgpu.Env) -> None:
    sess = ortgpu.InferenceSession(mlp(layers=1, width=8, batch=1).SerializeToString(), env=env)
    value = sess.allocator.empty((1, 8), "float32")
    sess.close()
    sess.close()  # idempotent
    with pytest.raises(ortgpu.ReleasedValueError, match="closed"):
        sess.run(None, {"X": np.ones((1, 8), np.float32)})
    with pytest.raises(ortgpu.ReleasedValueError, match=f"session {sess.session_id}"):
        value.to_numpy()


def _batch_mlp() -> onnx.ModelProto:
    """MatMul + bias + Relu over a symbolic batch: every new batch size is a new plan."""
    rng = np.random.default_rng(3)
    weight = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "W")
    bias = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "B")
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["H"]),
        helper.make_node("Add", ["H", "B"], ["A"]),
        helper.make_node("Relu", ["A"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "batch_mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[weight, bias],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_plan_cache_is_bounded_when_every_call_has_a_new_shape(
    env: ortgpu.Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ORTGPU_MAX_CACHED_PLANS bounds the plans (and their programs and buffers) a session keeps: new shapes on
    every call hold the native objects flat; an evicted shape plans again and is still right; a captured graph
    outlives its plan's eviction."""
    monkeypatch.setenv("ORTGPU_MAX_CACHED_PLANS", "3")
    model = _batch_mlp()
    reference = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    with ortgpu.InferenceSession(model.SerializeToString(), env=env, graph_capture=True) as sess:
        runner = sess._runner
        x_value = sess.allocator.from_numpy(rng.standard_normal((2, 8)).astype(np.float32))
        y_value = sess.allocator.empty((2, 4), "float32")
        binding = sess.io_binding()
        binding.bind_input("X", x_value)
        binding.bind_output("Y", y_value)
        graph = sess.capture(binding, graph_id=0)
        handles = []
        for batch in range(3, 15):
            x = rng.standard_normal((batch, 8)).astype(np.float32)
            (y,) = sess.run(None, {"X": x})
            np.testing.assert_allclose(y, reference.run(None, {"X": x})[0], rtol=1e-5, atol=1e-6)
            (value,) = sess.run_with_ort_values(None, {"X": ortgpu.OrtValue.ortvalue_from_numpy(x)})
            np.testing.assert_allclose(value.to_numpy(), y, rtol=1e-6)
            value.release()
            assert len(runner.plans) <= 3 and len(runner.staged) <= 3 and len(runner.programs) <= 3
            gc.collect()
            handles.append(owned_handles(env))
        assert handles[-1] == handles[3], f"native objects grew with new shapes: {handles}"
        x = rng.standard_normal((2, 8)).astype(np.float32)
        x_value.update_inplace(x)
        graph.replay()  # its batch-2 plan was evicted long ago; the graph owns its program
        np.testing.assert_allclose(y_value.to_numpy(), reference.run(None, {"X": x})[0], rtol=1e-5, atol=1e-6)
        (y,) = sess.run(None, {"X": x})  # and the evicted shape plans again
        np.testing.assert_allclose(y, reference.run(None, {"X": x})[0], rtol=1e-5, atol=1e-6)
        graph.release()


def test_max_cached_plans_must_be_positive(env: ortgpu.Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORTGPU_MAX_CACHED_PLANS", "0")
    with pytest.raises(ortgpu.InvalidArgumentError, match="ORTGPU_MAX_CACHED_PLANS"):
        ortgpu.InferenceSession(_batch_mlp().SerializeToString(), env=env)
