"""onnxruntime's Python API as ortgpu answers it (issue 16): the module surface, ``SessionOptions``,
``InferenceSession(path, sess_options, providers, provider_options)``, ``RunOptions`` fields, the new ``OrtValue``
methods and ``onnxruntime.capi``'s names, each compared with onnxruntime's behaviour, on both backends.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime
import pytest

import ortgpu
from ortgpu import Env, InferenceSession

W = np.array([[2.0, 1.0], [4.0, 3.0], [6.0, 5.0]], np.float32)
X = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)


def mul_model(ir_version: int = 8, initializer_as_input: bool = False) -> bytes:
    """Y = X * W (W an initializer); X's first dim symbolic "batch" with denotation DATA_BATCH."""
    x = oh.make_tensor_value_info("X", onnx.TensorProto.FLOAT, ["batch", 2])
    x.type.tensor_type.shape.dim[0].denotation = "DATA_BATCH"
    y = oh.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["batch", 2])
    w = onnx.numpy_helper.from_array(W, "W")
    inputs = [x] + ([oh.make_tensor_value_info("W", onnx.TensorProto.FLOAT, [3, 2])] if initializer_as_input else [])
    graph = oh.make_graph([oh.make_node("Mul", ["X", "W"], ["Y"])], "mul graph", inputs, [y], [w])
    graph.doc_string = "graph doc"
    opset = 7 if ir_version < 4 else 13
    model = oh.make_model(graph, producer_name="ortgpu-tests", opset_imports=[oh.make_opsetid("", opset)])
    model.ir_version = ir_version
    model.model_version = 3
    model.doc_string = "model doc"
    oh.set_model_props(model, {"author": "tests"})
    return bytes(model.SerializeToString())


MODEL = mul_model()
ORT_CPU = ["CPUExecutionProvider"]


def test_module_surface_matches_onnxruntime() -> None:
    assert ortgpu.get_available_providers() == ["WebGpuExecutionProvider", "CPUExecutionProvider"]
    assert "CPUExecutionProvider" in onnxruntime.get_available_providers()
    assert ortgpu.get_all_providers()[-1] == onnxruntime.get_all_providers()[-1] == "CPUExecutionProvider"
    assert isinstance(ortgpu.get_device(), str) and isinstance(onnxruntime.get_device(), str)
    assert ortgpu.get_version_string() == ortgpu.__version__
    assert "Build Info" in ortgpu.get_build_info() and "Build Info" in onnxruntime.get_build_info()
    for name in ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL"):
        assert int(getattr(ortgpu.GraphOptimizationLevel, name)) == int(
            getattr(onnxruntime.GraphOptimizationLevel, name)
        )
    for name in ("ORT_SEQUENTIAL", "ORT_PARALLEL"):
        assert int(getattr(ortgpu.ExecutionMode, name)) == int(getattr(onnxruntime.ExecutionMode, name))
    ortgpu.enable_telemetry_events()
    ortgpu.disable_telemetry_events()
    ortgpu.set_default_logger_severity(3)
    with pytest.raises(ortgpu.InvalidArgumentError):
        ortgpu.set_default_logger_severity(7)


def test_ort_device_and_memory_info_match_onnxruntime() -> None:
    ours = ortgpu.OrtDevice(ortgpu.OrtDevice.cpu(), ortgpu.OrtDevice.default_memory(), 0)
    from onnxruntime.capi import _pybind_state as C

    theirs = C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)
    assert ours.device_type() == theirs.device_type()
    assert ours.device_id() == theirs.device_id()
    assert ours.device_mem_type() == 0
    assert ours == ortgpu.OrtDevice(0, 0, 0) and ours != ortgpu.OrtDevice(ortgpu.OrtDevice.gpu(), 0, 0)
    info = ortgpu.OrtMemoryInfo("Cpu", ortgpu.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ortgpu.OrtMemType.DEFAULT)
    assert info.name == "Cpu" and info.id == 0


def test_session_options_defaults_and_config_entries_match_onnxruntime() -> None:
    ours, theirs = ortgpu.SessionOptions(), onnxruntime.SessionOptions()
    for field in (
        "intra_op_num_threads",
        "inter_op_num_threads",
        "enable_profiling",
        "optimized_model_filepath",
        "log_severity_level",
        "log_verbosity_level",
        "logid",
        "enable_mem_pattern",
        "enable_mem_reuse",
        "enable_cpu_mem_arena",
        "use_deterministic_compute",
        "profile_file_prefix",
    ):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert int(ours.graph_optimization_level) == int(theirs.graph_optimization_level)
    assert int(ours.execution_mode) == int(theirs.execution_mode)
    for options in (ours, theirs):
        options.add_session_config_entry("CONFIG_KEY", "CONFIG_VAL")
        assert options.get_session_config_entry("CONFIG_KEY") == "CONFIG_VAL"
    with pytest.raises(RuntimeError, match="does not have configuration with key: NOPE") as ours_error:
        ours.get_session_config_entry("NOPE")
    with pytest.raises(RuntimeError, match="does not have configuration with key: NOPE"):
        theirs.get_session_config_entry("NOPE")
    assert isinstance(ours_error.value, ortgpu.Fail) and isinstance(ours_error.value, ortgpu.OrtGpuError)
    with pytest.raises(ortgpu.UnsupportedOpError, match="custom-op libraries"):
        ours.register_custom_ops_library("./libcustom_op_library.so")


def test_constructor_positional_options_and_providers(env: Env) -> None:
    so = ortgpu.SessionOptions()
    so.intra_op_num_threads = 2  # no effect, accepted
    sess = InferenceSession(MODEL, so, ["WebGpuExecutionProvider", "CPUExecutionProvider"], env=env)
    ort = onnxruntime.InferenceSession(MODEL, onnxruntime.SessionOptions(), ORT_CPU)
    np.testing.assert_allclose(sess.run(None, {"X": X})[0], ort.run(None, {"X": X})[0], rtol=1e-6)
    assert sess.get_providers() == ["WebGpuExecutionProvider", "CPUExecutionProvider"]
    assert sess.get_session_options() is so
    assert sess.get_provider_options()["WebGpuExecutionProvider"] == {"deviceId": str(sess.device.index)}
    assert sess.get_provider_options()["CPUExecutionProvider"] == {}
    # onnxruntime appends its CPU provider as the fallback to any list: so does ortgpu.
    only_gpu = InferenceSession(MODEL, providers=["WebGpuExecutionProvider"], env=env)
    assert only_gpu.get_providers() == ["WebGpuExecutionProvider", "CPUExecutionProvider"]
    assert only_gpu.allow_cpu_fallback
    strict = InferenceSession(MODEL, providers=["WebGpuExecutionProvider"], env=env, allow_cpu_fallback=False)
    assert strict.get_providers() == ["WebGpuExecutionProvider"]
    strict.close()
    with_options = InferenceSession(
        MODEL, providers=[("WebGpuExecutionProvider", {"deviceId": 0}), "CPUExecutionProvider"], env=env
    )
    assert with_options.device is env.devices[0]
    with pytest.raises(ortgpu.InvalidArgumentError, match="not supported by ortgpu"):
        InferenceSession(MODEL, providers=[("WebGpuExecutionProvider", {"bogus": 1})], env=env)
    for s in (sess, only_gpu, with_options):
        s.close()


def test_set_providers_refuses_an_unknown_provider_with_the_list(env: Env) -> None:
    sess = InferenceSession(MODEL, providers=["WebGpuExecutionProvider"], env=env)
    with pytest.raises(RuntimeError, match="Unknown Provider Type"):
        sess.set_providers(["InvalidProvider"])
    assert not sess.closed  # refused before anything was closed
    sess.close()


def test_cpu_provider_alone_runs_on_the_host() -> None:
    sess = InferenceSession(MODEL, providers=["CPUExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert sess.env.backend_name == "fake"  # the numpy twins of the kernels
    ort = onnxruntime.InferenceSession(MODEL, providers=ORT_CPU)
    np.testing.assert_array_equal(sess.run(["Y"], {"X": X})[0], ort.run(["Y"], {"X": X})[0])
    sess.close()


def test_set_providers_recreates_the_session(env: Env) -> None:
    sess = InferenceSession(MODEL, providers=["WebGpuExecutionProvider"], env=env)
    sess.set_providers(["WebGpuExecutionProvider", "CPUExecutionProvider"])
    assert sess.get_providers() == ["WebGpuExecutionProvider", "CPUExecutionProvider"]
    np.testing.assert_allclose(sess.run(None, {"X": X})[0], X * W)
    sess.close()


def test_add_initializer_and_free_dimensions_as_onnxruntime(env: Env) -> None:
    replacement = np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]], np.float32)
    results, kept = [], []
    for module, kwargs in ((ortgpu, {"env": env}), (onnxruntime, {"providers": ORT_CPU})):
        so = module.SessionOptions()
        kept.append(module.OrtValue.ortvalue_from_numpy(replacement))  # onnxruntime keeps only a pointer to it
        so.add_initializer("W", kept[-1])
        so.add_free_dimension_override_by_name("batch", 3)
        sess = module.InferenceSession(MODEL, sess_options=so, **kwargs)
        assert sess.get_inputs()[0].shape == [3, 2]
        results.append(sess.run(None, {"X": X})[0])
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], X * replacement)
    for module, kwargs in ((ortgpu, {"env": env}), (onnxruntime, {"providers": ORT_CPU})):
        so = module.SessionOptions()
        so.add_free_dimension_override_by_denotation("DATA_BATCH", 3)
        sess = module.InferenceSession(MODEL, sess_options=so, **kwargs)
        assert sess.get_inputs()[0].shape == [3, 2]
    wrong = ortgpu.SessionOptions()
    wrong.add_initializer("W", np.zeros((2, 2), np.float32))
    with pytest.raises(ortgpu.InvalidModelError, match="initializer override 'W'"):
        InferenceSession(MODEL, sess_options=wrong, env=env)


def test_options_that_change_planning(env: Env) -> None:
    so = ortgpu.SessionOptions()
    so.graph_optimization_level = ortgpu.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    sess = InferenceSession(MODEL, so, env=env)
    assert not sess.allow_cpu_fallback and sess._runner.fuse is False
    assert sess.get_providers() == ["WebGpuExecutionProvider"]
    sess.close()


def test_profiling_and_optimized_model_from_options(env: Env, tmp_path: pathlib.Path) -> None:
    so = ortgpu.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "trace")
    so.optimized_model_filepath = str(tmp_path / "saved.onnx")
    sess = InferenceSession(MODEL, so, env=env)
    assert sess.profiling_active
    sess.run(None, {"X": X})
    path = sess.end_profiling()
    assert os.path.isfile(path) and os.path.basename(path).startswith("trace")
    saved = onnxruntime.InferenceSession(so.optimized_model_filepath, providers=ORT_CPU)
    np.testing.assert_array_equal(saved.run(None, {"X": X})[0], X * W)
    sess.close()


def test_model_metadata_matches_onnxruntime(env: Env) -> None:
    ours = InferenceSession(MODEL, env=env).get_modelmeta()
    theirs = onnxruntime.InferenceSession(MODEL, providers=ORT_CPU).get_modelmeta()
    for field in ("producer_name", "graph_name", "domain", "description", "graph_description", "version"):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.custom_metadata_map == theirs.custom_metadata_map == {"author": "tests"}


def test_ir3_model_with_initializers_outside_the_inputs_loads(env: Env) -> None:
    model = mul_model(ir_version=3)
    ort = onnxruntime.InferenceSession(model, providers=ORT_CPU)
    sess = InferenceSession(model, env=env)
    assert [i.name for i in sess.get_inputs()] == [i.name for i in ort.get_inputs()] == ["X"]
    np.testing.assert_array_equal(sess.run(None, {"X": X})[0], ort.run(None, {"X": X})[0])
    assert sess.get_overridable_initializers() == []
    sess.close()


def test_lists_as_inputs_and_empty_output_names(env: Env) -> None:
    sess = InferenceSession(MODEL, env=env)
    ort = onnxruntime.InferenceSession(MODEL, providers=ORT_CPU)
    np.testing.assert_array_equal(sess.run([], {"X": X.tolist()})[0], ort.run([], {"X": X.tolist()})[0])
    sess.close()


def test_missing_input_message_has_onnxruntimes_wording(env: Env) -> None:
    sess = InferenceSession(MODEL, env=env)
    with pytest.raises(ValueError, match=r"Required inputs \(\['X'\]\) are missing from input feed \(\[\]\)"):
        sess.run(None, {})
    sess.close()


def test_run_options_fields_match_onnxruntime(env: Env) -> None:
    ours, theirs = ortgpu.RunOptions(), onnxruntime.RunOptions()
    for field in ("logid", "log_severity_level", "log_verbosity_level", "terminate", "only_execute_path_to_fetches"):
        assert getattr(ours, field) == getattr(theirs, field), field
    ours.add_run_config_entry("some.key", "1")
    assert ours.get_run_config_entry("some.key") == "1"
    sess = InferenceSession(MODEL, env=env)
    ours.terminate = True
    theirs.terminate = True
    with pytest.raises(RuntimeError, match="terminate flag"):
        sess.run(None, {"X": X}, ours)
    with pytest.raises(Exception, match="terminate flag"):
        onnxruntime.InferenceSession(MODEL, providers=ORT_CPU).run(None, {"X": X}, theirs)
    sess.close()


def test_run_with_ortvaluevector(env: Env) -> None:
    from ortgpu.capi.onnxruntime_pybind11_state import OrtValueVector

    sess = InferenceSession(MODEL, env=env)
    fetches = OrtValueVector()
    value = sess.allocator.from_numpy(X)
    sess.run_with_ortvaluevector(None, ["X"], [value], ["Y"], fetches)
    assert len(fetches) == 1
    np.testing.assert_array_equal(fetches[0].to_numpy(), X * W)
    sess.close()


def test_ortvalue_methods_match_onnxruntime() -> None:
    ours = ortgpu.OrtValue.ortvalue_from_numpy_with_onnx_type(X, 1)
    theirs = onnxruntime.OrtValue.ortvalue_from_numpy_with_onnx_type(X, 1)
    assert ours.tensor_size_in_bytes() == theirs.tensor_size_in_bytes() == 24
    assert ours.is_tensor_sequence() is theirs.is_tensor_sequence() is False
    assert ours.data_type() == theirs.data_type() == "tensor(float)"
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    bits = np.array([1, 2], np.int32)
    np.testing.assert_array_equal(
        ortgpu.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, 1).numpy(), bits.view(np.float32)
    )
    with pytest.raises(ortgpu.DtypeError):
        ortgpu.OrtValue.ortvalue_from_numpy_with_onnx_type(np.ones(2, np.float64), 1)


def test_capi_names_for_programs_that_import_them() -> None:
    from ortgpu.capi import _pybind_state as C
    from ortgpu.capi.onnxruntime_inference_collection import check_and_normalize_provider_args
    from ortgpu.capi.onnxruntime_pybind11_state import Fail, InvalidArgument

    assert Fail is ortgpu.Fail and InvalidArgument is ortgpu.InvalidArgumentError
    assert isinstance(C.get_default_session_options(), ortgpu.SessionOptions)
    from onnxruntime.capi.onnxruntime_inference_collection import (
        check_and_normalize_provider_args as ort_check,
    )

    cases: list[tuple[Any, Any]] = [(["a", ("b", {1: 2})], None), (["a", "b"], [{"x": 1}, {}]), (None, None)]
    for providers, options in cases:
        assert check_and_normalize_provider_args(providers, options, ["a", "b"]) == ort_check(
            providers, options, ["a", "b"]
        )
    with pytest.warns(UserWarning):
        assert check_and_normalize_provider_args(["a", "a"], None, ["a"]) == (["a"], [{}])
    with pytest.raises(ValueError):
        check_and_normalize_provider_args(3, None, ["a"])  # type: ignore[arg-type]


def test_string_inputs_as_lists_and_void_arrays(env: Env) -> None:
    x = oh.make_tensor_value_info("S", onnx.TensorProto.STRING, [2, 2])
    y = oh.make_tensor_value_info("T", onnx.TensorProto.STRING, [2, 2])
    graph = oh.make_graph([oh.make_node("Identity", ["S"], ["T"])], "strings", [x], [y])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)]).SerializeToString()
    sess = InferenceSession(model, env=env)
    ort = onnxruntime.InferenceSession(model, providers=ORT_CPU)
    words = np.array([b"must", b"have", b"same", b"size"], dtype=np.void).reshape((2, 2))
    for feed in (words, [["must", "have"], ["same", "size"]]):
        np.testing.assert_array_equal(sess.run(None, {"S": feed})[0], ort.run(None, {"S": feed})[0])
    sess.close()


def test_graph_capture_through_the_webgpu_provider_option(env: Env) -> None:
    """onnxruntime's spelling: providers=[("WebGpuExecutionProvider", {"enableGraphCapture": "1"})], then
    run_with_iobinding captures graph 0 and replays it."""
    providers: list[Any] = [("WebGpuExecutionProvider", {"enableGraphCapture": "1"}), "CPUExecutionProvider"]
    sess = InferenceSession(MODEL, ortgpu.SessionOptions(), providers, env=env)
    assert sess.graph_capture
    x = sess.allocator.from_numpy(X)
    y = sess.allocator.empty((3, 2), np.float32)
    binding = sess.io_binding()
    binding.bind_ortvalue_input("X", x)
    binding.bind_ortvalue_output("Y", y)
    for _ in range(2):
        sess.run_with_iobinding(binding)
    np.testing.assert_array_equal(y.to_numpy(), X * W)
    assert sess.captured_graph_ids == [0]
    sess.close()


def test_the_common_cuda_provider_list_warns_and_falls_back_as_onnxruntime(env: Env) -> None:
    """``["CUDAExecutionProvider", "CPUExecutionProvider"]``: onnxruntime (without CUDA) warns, skips CUDA and runs
    on its CPU provider; ortgpu does the same, and its warning names the provider that runs on the GPU."""
    with pytest.warns(UserWarning, match="CUDAExecutionProvider"):
        ort = onnxruntime.InferenceSession(MODEL, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert ort.get_providers() == ["CPUExecutionProvider"]
    with pytest.warns(RuntimeWarning, match="CUDAExecutionProvider.*skipped.*WebGpuExecutionProvider"):
        sess = InferenceSession(MODEL, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    np.testing.assert_array_equal(sess.run(None, {"X": X})[0], ort.run(None, {"X": X})[0])
    sess.close()
    with pytest.warns(RuntimeWarning, match="CUDAExecutionProvider") as caught:
        gpu = InferenceSession(
            MODEL, providers=["CUDAExecutionProvider", "WebGpuExecutionProvider", "CPUExecutionProvider"], env=env
        )
    assert len(caught) == 1 and gpu.get_providers() == ["WebGpuExecutionProvider", "CPUExecutionProvider"]
    np.testing.assert_allclose(gpu.run(None, {"X": X})[0], ort.run(None, {"X": X})[0], rtol=1e-6)
    gpu.close()
    with pytest.warns(RuntimeWarning) as caught:
        alone = InferenceSession(MODEL, providers=["CUDAExecutionProvider"])
    assert ["skipped" in str(w.message) for w in caught] == [True, False] and "falling back" in str(caught[1].message)
    assert all(w.filename == __file__ for w in caught)  # the warning points at the caller's line
    assert alone.get_providers() == ["CPUExecutionProvider"]
    alone.close()
    with pytest.warns(RuntimeWarning, match="Duplicate provider 'WebGpuExecutionProvider'"):
        twice = InferenceSession(MODEL, providers=["WebGpuExecutionProvider", "WebGpuExecutionProvider"], env=env)
    assert twice.get_providers() == ["WebGpuExecutionProvider", "CPUExecutionProvider"]
    twice.close()


def test_webgpu_provider_options_onnxruntime_takes_are_accepted_and_reported(env: Env) -> None:
    options = {"preferredLayout": "NHWC", "storageBufferCacheMode": "bucket", "validationMode": "disabled"}
    options["ep.webgpuexecutionprovider.enableGraphCapture"] = "1"
    sess = InferenceSession(MODEL, providers=[("WebGpuExecutionProvider", options)], env=env)
    assert sess.graph_capture
    reported = sess.get_provider_options()["WebGpuExecutionProvider"]
    assert {key: reported[key] for key in options} == options
    np.testing.assert_allclose(sess.run(None, {"X": X})[0], X * W, rtol=1e-6)
    sess.close()
    with pytest.raises(ortgpu.InvalidArgumentError, match="preferredLayout='NWHC'.*NCHW"):
        InferenceSession(MODEL, providers=[("WebGpuExecutionProvider", {"preferredLayout": "NWHC"})], env=env)
    with pytest.raises(ortgpu.UnsafeAccessError, match="webgpuDevice.*device="):
        InferenceSession(MODEL, providers=[("WebGpuExecutionProvider", {"webgpuDevice": "140000"})], env=env)


def _custom_op_model() -> bytes:
    x = oh.make_tensor_value_info("X", onnx.TensorProto.FLOAT, [2])
    y = oh.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [2])
    graph = oh.make_graph([oh.make_node("Foo", ["X"], ["Y"], domain="my.domain")], "custom", [x], [y])
    opsets = [oh.make_opsetid("", 13), oh.make_opsetid("my.domain", 1)]
    return bytes(oh.make_model(graph, opset_imports=opsets).SerializeToString())


@pytest.mark.parametrize(
    ("fault", "alias"),
    [
        ("wrong dtype", "InvalidArgument"),
        ("wrong shape", "InvalidArgument"),
        ("unknown output", "InvalidArgument"),
        ("unknown input", "InvalidArgument"),
        ("custom operator", "Fail"),
        ("not a model", "InvalidProtobuf"),
        ("no such file", "NoSuchFile"),
    ],
)
def test_capi_exception_aliases_catch_what_onnxruntimes_catch(env: Env, fault: str, alias: str) -> None:
    """Each fault raised by onnxruntime CPU and by ortgpu, caught by the same ``capi`` name in both."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    from ortgpu.capi import onnxruntime_pybind11_state as ortgpu_state

    def provoke(module: Any, caught: type[BaseException]) -> None:
        extra: dict[str, Any] = {"providers": ORT_CPU} if module is onnxruntime else {"env": env}
        with pytest.raises(caught):
            if fault == "custom operator":
                module.InferenceSession(_custom_op_model(), **extra)
            elif fault == "not a model":
                module.InferenceSession(b"not a model", **extra)
            elif fault == "no such file":
                module.InferenceSession("/nonexistent/model.onnx", **extra)
            else:
                session = module.InferenceSession(MODEL, **extra)
                feeds = {
                    "wrong dtype": {"X": X.astype(np.float64)},
                    "wrong shape": {"X": np.zeros((3, 5), np.float32)},
                    "unknown input": {"X": X, "Q": X},
                }.get(fault, {"X": X})
                session.run(["nope"] if fault == "unknown output" else None, feeds)

    provoke(onnxruntime, getattr(ort_state, alias))
    provoke(ortgpu, getattr(ortgpu_state, alias))


def test_arena_configuration_is_accepted_as_onnxruntime_takes_it(env: Env) -> None:
    """``OrtArenaCfg`` (positional or a dict) and ``create_and_register_allocator``: kept as onnxruntime keeps them;
    ortgpu's allocators are not arenas, so a session that asks for the env's allocators runs as any other."""
    for args in ((8, 0, 4, 2), ({"max_mem": 16, "initial_growth_chunk_size_bytes": 2},)):
        ours, theirs = ortgpu.OrtArenaCfg(*args), onnxruntime.OrtArenaCfg(*args)
        for name in ("max_mem", "arena_extend_strategy", "initial_chunk_size_bytes", "max_dead_bytes_per_chunk"):
            assert getattr(ours, name) == getattr(theirs, name), name
    with pytest.raises(ortgpu.InvalidArgumentError, match="unknown keys"):
        ortgpu.OrtArenaCfg({"max_memory": 1})
    with pytest.raises(ortgpu.InvalidArgumentError, match="OrtArenaCfg takes"):
        ortgpu.OrtArenaCfg(1, 2)
    info = ortgpu.OrtMemoryInfo("Cpu", ortgpu.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ortgpu.OrtMemType.DEFAULT)
    ortgpu.create_and_register_allocator(info, ortgpu.OrtArenaCfg(0, -1, -1, -1))
    with pytest.raises(ortgpu.InvalidArgumentError, match="OrtMemoryInfo"):
        ortgpu.create_and_register_allocator("Cpu")  # type: ignore[arg-type]
    so = ortgpu.SessionOptions()
    so.add_session_config_entry("session.use_env_allocators", "1")
    with InferenceSession(MODEL, so, env=env) as sess:
        np.testing.assert_allclose(sess.run(None, {"X": X})[0], X * W, rtol=1e-6)
