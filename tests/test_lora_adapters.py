"""LoRA adapters (``AdapterFormat``, ``LoraAdapter``, ``RunOptions.add_active_adapter``), compared with onnxruntime:
adapter files written by either runtime read on the other, runs with adapters give onnxruntime's outputs, and bad
files and bad arguments are typed errors that change nothing (where onnxruntime silently drops a value, ortgpu
refuses: see ``ortgpu._adapter_runs``)."""

from __future__ import annotations

import pathlib
import random
import struct
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime
import pytest

import ortgpu
from ortgpu import (
    AdapterFileError,
    AdapterFormat,
    ArgumentTypeError,
    CaptureStateError,
    DtypeError,
    Env,
    InferenceSession,
    InvalidArgumentError,
    LoraAdapter,
    OrtValue,
    ReleasedValueError,
    RunOptions,
)
from ortgpu._adapter_format import AdapterParameter, decode_adapter, encode_adapter

ORT_CPU = ["CPUExecutionProvider"]
X = np.arange(16, dtype=np.float32).reshape(4, 4) / 8
W = np.arange(16, dtype=np.float32).reshape(4, 4)[::-1].copy() / 4
A_DEFAULT = np.full((4, 2), 0.5, np.float32)
B_DEFAULT = np.full((2, 4), 0.25, np.float32)


def lora_model(ir_version: int = 8) -> bytes:
    """output = X @ W + (X @ lora_a) @ lora_b; lora_a, lora_b initializers also listed as inputs (overridable, with
    a symbolic rank), W a plain initializer."""
    f = onnx.TensorProto.FLOAT
    inputs = [
        oh.make_tensor_value_info("input_x", f, [4, 4]),
        oh.make_tensor_value_info("lora_a", f, [4, "rank"]),
        oh.make_tensor_value_info("lora_b", f, ["rank", 4]),
    ]
    nodes = [
        oh.make_node("MatMul", ["input_x", "W"], ["base"]),
        oh.make_node("MatMul", ["input_x", "lora_a"], ["down"]),
        oh.make_node("MatMul", ["down", "lora_b"], ["up"]),
        oh.make_node("Add", ["base", "up"], ["output"]),
    ]
    initializers = [
        onnx.numpy_helper.from_array(W, "W"),
        onnx.numpy_helper.from_array(A_DEFAULT, "lora_a"),
        onnx.numpy_helper.from_array(B_DEFAULT, "lora_b"),
    ]
    output = oh.make_tensor_value_info("output", f, [4, 4])
    graph = oh.make_graph(nodes, "lora", inputs, [output], initializers)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13 if ir_version >= 4 else 7)])
    model.ir_version = ir_version
    return bytes(model.SerializeToString())


MODEL = lora_model()


def write_adapter(runtime: Any, path: pathlib.Path, params: dict[str, np.ndarray], versions: tuple[int, int] = (1, 1)):
    """Write ``params`` to ``path`` with ``runtime``'s (ortgpu's or onnxruntime's) AdapterFormat."""
    fmt = runtime.AdapterFormat()
    fmt.set_adapter_version(versions[0])
    fmt.set_model_version(versions[1])
    fmt.set_parameters({k: runtime.OrtValue.ortvalue_from_numpy(v) for k, v in params.items()})
    fmt.export_adapter(str(path))
    return path


def loaded(runtime: Any, path: pathlib.Path) -> Any:
    adapter = runtime.LoraAdapter()
    adapter.Load(str(path))
    return adapter


#: onnxruntime's RunOptions holds a bare pointer to each active adapter (the Python object is not kept alive, so a
#: collected adapter is silently not applied, or worse): the tests keep them here.  ortgpu's RunOptions holds them.
_ONNXRUNTIME_ADAPTERS: list[Any] = []


def options_with(runtime: Any, *adapters: Any) -> Any:
    if runtime is onnxruntime:
        _ONNXRUNTIME_ADAPTERS.extend(adapters)
    options = runtime.RunOptions()
    for adapter in adapters:
        options.add_active_adapter(adapter)
    return options


RANK3 = {"lora_a": np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), "lora_b": np.ones((3, 4), np.float32)}


# -- the file format, both ways -----------------------------------------------------------------------------------


PARAMS = {
    "f32": np.arange(10, dtype=np.float32).reshape(5, 2),
    "i64": np.arange(10, dtype=np.int64).reshape(2, 5) - 4,
    "f16": np.linspace(0, 1, 6, dtype=np.float16).reshape(3, 2),
    "u8": np.arange(7, dtype=np.uint8),
    "f64": np.array([[1.5, -2.25]]),
    "empty": np.zeros((0, 4), np.float32),
}


def test_ortgpu_files_read_on_onnxruntime(tmp_path: pathlib.Path) -> None:
    path = write_adapter(ortgpu, tmp_path / "a.onnx_adapter", PARAMS, versions=(7, -3))
    theirs = onnxruntime.AdapterFormat.read_adapter(str(path))
    assert (theirs.get_format_version(), theirs.get_adapter_version(), theirs.get_model_version()) == (1, 7, -3)
    got = theirs.get_parameters()
    assert sorted(got) == sorted(PARAMS)
    for name, array in PARAMS.items():
        assert got[name].element_type() == ortgpu.OrtValue.ortvalue_from_numpy(array).element_type()
        assert got[name].shape() == list(array.shape)
        np.testing.assert_array_equal(got[name].numpy(), array)
    loaded(onnxruntime, path)  # onnxruntime's LoraAdapter loads it too


def test_onnxruntime_files_read_on_ortgpu(tmp_path: pathlib.Path) -> None:
    path = write_adapter(onnxruntime, tmp_path / "a.onnx_adapter", PARAMS, versions=(2, 9))
    ours = AdapterFormat.read_adapter(path)  # os.PathLike too
    assert (ours.get_format_version(), ours.get_adapter_version(), ours.get_model_version()) == (1, 2, 9)
    got = ours.get_parameters()
    assert sorted(got) == sorted(PARAMS)
    for name, array in PARAMS.items():
        assert got[name].is_tensor() and got[name].device_name() == "cpu"
        assert got[name].dtype == array.dtype and got[name].shape() == list(array.shape)
        np.testing.assert_array_equal(got[name].numpy(), array)
    assert sorted(loaded(ortgpu, path).get_parameters()) == sorted(PARAMS)


def test_default_versions_and_empty_adapter_match_onnxruntime(tmp_path: pathlib.Path) -> None:
    ours, theirs = AdapterFormat(), onnxruntime.AdapterFormat()
    for getter in ("get_format_version", "get_adapter_version", "get_model_version"):
        assert getattr(ours, getter)() == getattr(theirs, getter)()
    assert ours.get_parameters() == {} == theirs.get_parameters()
    ours.export_adapter(tmp_path / "empty.onnx_adapter")
    assert onnxruntime.AdapterFormat.read_adapter(str(tmp_path / "empty.onnx_adapter")).get_parameters() == {}


def test_bfloat16_and_device_values_export(env: Env, tmp_path: pathlib.Path) -> None:
    bf16 = np.array([[1.5, -2.0, 3.25]], dtype=ml_dtypes.bfloat16)
    device_value = OrtValue.ortvalue_from_numpy(PARAMS["f32"], "webgpu")
    fmt = AdapterFormat()
    fmt.set_parameters({"bf16": OrtValue.ortvalue_from_numpy(bf16), "dev": device_value})
    fmt.export_adapter(tmp_path / "b.onnx_adapter")
    got = AdapterFormat.read_adapter(tmp_path / "b.onnx_adapter").get_parameters()
    assert got["bf16"].element_type() == 16
    np.testing.assert_array_equal(got["bf16"].numpy(), bf16)
    np.testing.assert_array_equal(got["dev"].numpy(), PARAMS["f32"])
    assert onnxruntime.AdapterFormat.read_adapter(str(tmp_path / "b.onnx_adapter")).get_parameters()[
        "bf16"
    ].shape() == [
        1,
        3,
    ]
    device_value.release()


def test_accepts_and_refuses_the_files_onnxruntime_does(tmp_path: pathlib.Path) -> None:
    """Every prefix of a file, and random corruptions of it: ortgpu reads exactly those onnxruntime's verifier accepts,
    with the same contents; the others are AdapterFileError, never another exception."""
    params = [
        AdapterParameter("p1", 1, (5, 2), np.arange(10, dtype=np.float32).tobytes()),
        AdapterParameter("p2", 7, (2, 5), np.arange(10, dtype=np.int64).tobytes()),
    ]
    good = encode_adapter(1, 1, params)
    target = tmp_path / "f.onnx_adapter"

    def theirs(data: bytes) -> dict[str, Any] | None:
        target.write_bytes(data)
        try:
            got = onnxruntime.AdapterFormat.read_adapter(str(target)).get_parameters()
        except (RuntimeError, UnicodeDecodeError):  # onnxruntime fails to decode a corrupt name as a str
            return None
        return {k: (v.element_type(), v.shape(), v.numpy().tobytes()) for k, v in got.items()}

    def ours(data: bytes) -> dict[str, Any] | None:
        try:
            contents = decode_adapter(data, "test bytes")
        except AdapterFileError:
            return None
        return {p.name: (p.element_type, list(p.dims), p.raw_data) for p in contents.parameters}

    rng = random.Random(38)
    cases = [good[:n] for n in range(len(good) + 1)]
    for _ in range(300):
        data = bytearray(good)
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(8, len(data))] = rng.randrange(256)
        cases.append(bytes(data))
    accepted = 0
    for data in cases:
        expected = theirs(data)
        assert ours(data) == expected, data.hex()
        accepted += expected is not None
    assert 0 < accepted < len(cases)


@pytest.mark.parametrize(
    "corrupt, match",
    [
        (lambda b: b"", "does not start with"),
        (lambda b: b[:4] + b"XXXX" + b[8:], "file identifier"),
        (lambda b: b[:60], "truncated or corrupt"),
        (lambda b: b[:28] + struct.pack("<i", 2) + b[32:], "format version 2"),
    ],
    ids=["empty", "identifier", "truncated", "format-version"],
)
def test_bad_files_are_typed_errors_as_onnxruntime_refuses_them(
    tmp_path: pathlib.Path, corrupt: Any, match: str
) -> None:
    good = encode_adapter(0, 0, [AdapterParameter("p", 1, (2,), np.ones(2, np.float32).tobytes())])
    assert decode_adapter(good, "x").format_version == 1 and struct.unpack_from("<i", good, 28)[0] == 1
    path = tmp_path / "bad.onnx_adapter"
    path.write_bytes(corrupt(good))
    with pytest.raises(RuntimeError):
        onnxruntime.AdapterFormat.read_adapter(str(path))
    with pytest.raises(AdapterFileError, match=match) as error:
        AdapterFormat.read_adapter(path)
    assert isinstance(error.value, RuntimeError)  # what onnxruntime raises, so `except RuntimeError` still works
    adapter = loaded(ortgpu, write_adapter(ortgpu, tmp_path / "ok.onnx_adapter", {"p": np.ones(2, np.float32)}))
    with pytest.raises(AdapterFileError, match=match):
        adapter.Load(path)
    assert sorted(adapter.get_parameters()) == ["p"]  # a failed Load keeps what the adapter had


def test_missing_files_and_bad_paths(tmp_path: pathlib.Path) -> None:
    with pytest.raises(RuntimeError):
        onnxruntime.LoraAdapter().Load(str(tmp_path / "missing"))
    with pytest.raises(AdapterFileError, match="does not exist"):
        LoraAdapter().Load(tmp_path / "missing")
    with pytest.raises(AdapterFileError, match="cannot read"):
        AdapterFormat.read_adapter(tmp_path)  # a directory
    with pytest.raises(ArgumentTypeError):
        AdapterFormat.read_adapter(b"/tmp/x.onnx_adapter")  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError):
        LoraAdapter().Load(3)  # type: ignore[arg-type]
    with pytest.raises(AdapterFileError, match="cannot write"):
        AdapterFormat().export_adapter(tmp_path / "no" / "such" / "dir.onnx_adapter")


def test_parameters_onnxruntime_cannot_read_are_refused(tmp_path: pathlib.Path) -> None:
    """onnxruntime writes bool and scalar parameters but cannot read them back: ortgpu refuses them when they are
    set, and refuses files holding them as onnxruntime does."""
    for name, array in (("flag", np.array([True, False])), ("scalar", np.array([3.0], np.float32).reshape(()))):
        path = write_adapter(onnxruntime, tmp_path / f"{name}.onnx_adapter", {name: array})
        with pytest.raises(RuntimeError):
            onnxruntime.AdapterFormat.read_adapter(str(path))
        with pytest.raises(AdapterFileError):
            AdapterFormat.read_adapter(path)
    fmt = AdapterFormat()
    fmt.set_parameters({"ok": OrtValue.ortvalue_from_numpy(np.ones(2, np.float32))})
    with pytest.raises(DtypeError, match="not a LoRA parameter type"):
        fmt.set_parameters({"flag": OrtValue.ortvalue_from_numpy(np.array([True]))})
    with pytest.raises(AdapterFileError, match="scalar"):
        fmt.set_parameters({"s": OrtValue.ortvalue_from_shape_and_type((), "float32")})
    with pytest.raises(ArgumentTypeError, match="ortvalue_from_numpy"):
        fmt.set_parameters({"np": np.ones(2, np.float32)})  # type: ignore[dict-item]
    with pytest.raises(ArgumentTypeError):
        fmt.set_parameters({"": OrtValue.ortvalue_from_numpy(np.ones(2, np.float32))})
    with pytest.raises(ArgumentTypeError):
        fmt.set_parameters([("a", 1)])  # type: ignore[arg-type]
    assert list(fmt.get_parameters()) == ["ok"]  # every refusal changed nothing
    with pytest.raises(ArgumentTypeError):
        fmt.set_adapter_version(1.5)  # type: ignore[arg-type]
    with pytest.raises(AdapterFileError, match="int32"):
        fmt.set_model_version(2**31)
    assert (fmt.get_adapter_version(), fmt.get_model_version()) == (0, 0)
    float8 = onnxruntime.OrtValue.ortvalue_from_numpy_with_onnx_type(np.ones((2, 2), np.uint8), 17)
    theirs = onnxruntime.AdapterFormat()
    theirs.set_parameters({"f8": float8})
    theirs.export_adapter(str(tmp_path / "f8.onnx_adapter"))
    with pytest.raises(DtypeError, match="float8"):
        LoraAdapter().Load(tmp_path / "f8.onnx_adapter")


# -- runs with adapters ---------------------------------------------------------------------------------------------


def test_runs_with_adapters_match_onnxruntime(env: Env, tmp_path: pathlib.Path) -> None:
    full = write_adapter(ortgpu, tmp_path / "full.onnx_adapter", RANK3)
    only_a = write_adapter(ortgpu, tmp_path / "a.onnx_adapter", {"lora_a": np.ones((4, 2), np.float32)})
    ort = onnxruntime.InferenceSession(MODEL, providers=ORT_CPU)
    sess = InferenceSession(MODEL, env=env)
    for path in (full, only_a):
        expected = ort.run(None, {"input_x": X}, options_with(onnxruntime, loaded(onnxruntime, path)))[0]
        ours = options_with(ortgpu, loaded(ortgpu, path))
        np.testing.assert_allclose(sess.run(None, {"input_x": X}, ours)[0], expected, rtol=1e-5)
        values = sess.run_with_ort_values(None, {"input_x": OrtValue.ortvalue_from_numpy(X)}, ours)
        np.testing.assert_allclose(values[0].to_numpy(), expected, rtol=1e-5)
        values[0].release()
    base = ort.run(None, {"input_x": X})[0]
    np.testing.assert_allclose(sess.run(None, {"input_x": X})[0], base, rtol=1e-5)  # the base run is unchanged
    np.testing.assert_allclose(sess.run(None, {"input_x": X}, RunOptions())[0], base, rtol=1e-5)
    assert not np.allclose(base, ort.run(None, {"input_x": X}, options_with(onnxruntime, loaded(onnxruntime, full)))[0])
    twice = options_with(ortgpu, *(2 * [loaded(ortgpu, full)]))  # one adapter added twice supplies its values once
    np.testing.assert_allclose(
        sess.run(None, {"input_x": X}, twice)[0],
        ort.run(None, {"input_x": X}, options_with(onnxruntime, loaded(onnxruntime, full)))[0],
        rtol=1e-5,
    )
    sess.close()


def test_adapter_names_must_be_model_inputs(env: Env, tmp_path: pathlib.Path) -> None:
    sess = InferenceSession(MODEL, env=env)
    ort = onnxruntime.InferenceSession(MODEL, providers=ORT_CPU)
    for name in ("nope", "W", "output", "down"):  # not an input, a plain initializer, an output, an intermediate
        path = write_adapter(ortgpu, tmp_path / f"{name}.onnx_adapter", {name: np.ones((4, 4), np.float32)})
        with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument, match="Invalid input name"):
            ort.run(None, {"input_x": X}, options_with(onnxruntime, loaded(onnxruntime, path)))
        with pytest.raises(InvalidArgumentError, match=f"Invalid input name: {name}"):
            sess.run(None, {"input_x": X}, options_with(ortgpu, loaded(ortgpu, path)))
    wrong_dtype = write_adapter(ortgpu, tmp_path / "i64.onnx_adapter", {"lora_a": np.ones((4, 2), np.int64)})
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument):
        ort.run(None, {"input_x": X}, options_with(onnxruntime, loaded(onnxruntime, wrong_dtype)))
    with pytest.raises(DtypeError):
        sess.run(None, {"input_x": X}, options_with(ortgpu, loaded(ortgpu, wrong_dtype)))
    wrong_rank = write_adapter(ortgpu, tmp_path / "r3.onnx_adapter", {"lora_a": np.ones((4, 2, 1), np.float32)})
    with pytest.raises(InvalidArgumentError):
        sess.run(None, {"input_x": X}, options_with(ortgpu, loaded(ortgpu, wrong_rank)))
    np.testing.assert_allclose(sess.run(None, {"input_x": X})[0], ort.run(None, {"input_x": X})[0], rtol=1e-5)
    sess.close()


def test_ir3_initializers_are_not_overridable(env: Env, tmp_path: pathlib.Path) -> None:
    model = lora_model(ir_version=3)
    path = write_adapter(ortgpu, tmp_path / "a.onnx_adapter", RANK3)
    sess = InferenceSession(model, env=env)
    with pytest.raises(InvalidArgumentError, match="Invalid input name"):
        sess.run(None, {"input_x": X}, options_with(ortgpu, loaded(ortgpu, path)))
    sess.close()


def test_conflicts_onnxruntime_resolves_silently_are_refused(env: Env, tmp_path: pathlib.Path) -> None:
    """onnxruntime drops the caller's explicit feed for an adapter's, and a later adapter's value for an earlier
    one's, without a word; ortgpu refuses both."""
    full = write_adapter(ortgpu, tmp_path / "full.onnx_adapter", RANK3)
    zeros = {"lora_a": np.zeros((4, 3), np.float32), "lora_b": np.zeros((3, 4), np.float32)}
    other = write_adapter(ortgpu, tmp_path / "zeros.onnx_adapter", zeros)
    ort = onnxruntime.InferenceSession(MODEL, providers=ORT_CPU)
    with_full = ort.run(None, {"input_x": X}, options_with(onnxruntime, loaded(onnxruntime, full)))[0]
    both = options_with(onnxruntime, loaded(onnxruntime, full), loaded(onnxruntime, other))
    np.testing.assert_allclose(ort.run(None, {"input_x": X}, both)[0], with_full)  # the second adapter is dropped
    sess = InferenceSession(MODEL, env=env)
    with pytest.raises(InvalidArgumentError, match="two active adapters supply parameter"):
        sess.run(None, {"input_x": X}, options_with(ortgpu, loaded(ortgpu, full), loaded(ortgpu, other)))
    # An adapter supplying an ordinary input, also fed by the caller: onnxruntime runs with the adapter's value.
    x2 = write_adapter(ortgpu, tmp_path / "x.onnx_adapter", {"input_x": 2 * X})
    expected = ort.run(None, {"input_x": 2 * X})[0]
    np.testing.assert_allclose(
        ort.run(None, {"input_x": X}, options_with(onnxruntime, loaded(onnxruntime, x2)))[0], expected
    )
    with pytest.raises(InvalidArgumentError, match="fed explicitly and also supplied by an active adapter"):
        sess.run(None, {"input_x": X}, options_with(ortgpu, loaded(ortgpu, x2)))
    # Not fed by the caller, the adapter's value is the input (onnxruntime's Python layer asks for the feed first).
    np.testing.assert_allclose(sess.run(None, {}, options_with(ortgpu, loaded(ortgpu, x2)))[0], expected, rtol=1e-5)
    sess.close()


def test_add_active_adapter_arguments() -> None:
    with pytest.raises(TypeError):
        onnxruntime.RunOptions().add_active_adapter("adapter.onnx_adapter")
    options = RunOptions()
    with pytest.raises(ArgumentTypeError):
        options.add_active_adapter("adapter.onnx_adapter")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="Load"):
        options.add_active_adapter(LoraAdapter())  # onnxruntime accepts an unloaded adapter and feeds nothing
    assert options.active_adapters == ()


@pytest.mark.parametrize("graph_capture", [False, True], ids=["ordinary", "capture"])
def test_bound_runs_refuse_adapters(env: Env, tmp_path: pathlib.Path, graph_capture: bool) -> None:
    """onnxruntime's run_with_iobinding ignores active adapters; ortgpu refuses them, so a captured graph can never
    replay with other values than the run suggests."""
    path = write_adapter(ortgpu, tmp_path / "full.onnx_adapter", RANK3)
    ort = onnxruntime.InferenceSession(MODEL, providers=ORT_CPU)
    binding = ort.io_binding()
    binding.bind_cpu_input("input_x", X)
    binding.bind_output("output")
    ort.run_with_iobinding(binding, options_with(onnxruntime, loaded(onnxruntime, path)))
    np.testing.assert_allclose(binding.copy_outputs_to_cpu()[0], ort.run(None, {"input_x": X})[0])  # ignored
    sess = InferenceSession(MODEL, env=env, graph_capture=graph_capture)
    ours = sess.io_binding()
    x = sess.create_ortvalue_from_shape_and_type((4, 4), "float32")
    x.update_inplace(X)
    y = sess.create_ortvalue_from_shape_and_type((4, 4), "float32")
    ours.bind_ortvalue_input("input_x", x)
    ours.bind_ortvalue_output("output", y)
    options = options_with(ortgpu, loaded(ortgpu, path))
    with pytest.raises(CaptureStateError, match="does not apply LoRA adapters"):
        sess.run_with_iobinding(ours, options)
    assert sess.captured_graph_ids == []  # nothing was captured
    options.gpu_graph_id = 0 if graph_capture else -1
    with pytest.raises(CaptureStateError):
        sess.run_with_iobinding(ours, options)
    sess.run_with_iobinding(ours, RunOptions(gpu_graph_id=0 if graph_capture else -1))
    np.testing.assert_allclose(y.to_numpy(), ort.run(None, {"input_x": X})[0], rtol=1e-5)
    sess.close()


def test_closing_the_session_closes_the_adapter_runner(env: Env, tmp_path: pathlib.Path) -> None:
    path = write_adapter(ortgpu, tmp_path / "full.onnx_adapter", RANK3)
    sess = InferenceSession(MODEL, env=env)
    options = options_with(ortgpu, loaded(ortgpu, path))
    sess.run(None, {"input_x": X}, options)
    adapter_runner = sess._runner.adapter_runner
    assert adapter_runner is not None and not adapter_runner.closed
    sess.run(None, {"input_x": X}, options)
    assert sess._runner.adapter_runner is adapter_runner  # made once
    sess.close()
    assert adapter_runner.closed  # the env fixture checks that nothing it held leaked
    with pytest.raises(ReleasedValueError):
        sess.run(None, {"input_x": X}, options)


def test_names_are_exported_where_onnxruntime_has_them() -> None:
    from ortgpu.capi import _pybind_state, onnxruntime_inference_collection, onnxruntime_pybind11_state

    assert _pybind_state.LoraAdapter is onnxruntime_pybind11_state.LoraAdapter is ortgpu.LoraAdapter
    assert onnxruntime_inference_collection.AdapterFormat is ortgpu.AdapterFormat
    assert {"AdapterFormat", "LoraAdapter"} <= set(ortgpu.__all__)
    for name in ("read_adapter", "export_adapter", "get_parameters", "set_parameters", "get_format_version"):
        assert hasattr(onnxruntime.AdapterFormat, name) and hasattr(AdapterFormat, name)
    assert hasattr(onnxruntime.LoraAdapter, "Load") and hasattr(onnxruntime.RunOptions, "add_active_adapter")
