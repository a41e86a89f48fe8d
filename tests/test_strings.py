"""String tensors (numpy object arrays of str) through sessions on both backends, against onnxruntime.

Strings live on the host: every node that reads or writes one runs on the CPU ("string tensors live on the
host"), they get no device buffer, and a plan with such nodes cannot be captured.  Covers string passthrough,
Equal and Cast on strings, StringConcat/StringSplit/RegexFullMatch/StringNormalizer, LabelEncoder (ai.onnx.ml
opsets 1, 2 and 4), a model mixing a device float path with a host string path, and the refusals (capture,
IOBinding, RE2-only pattern syntax).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortgpu
from ortgpu import ModelError, OrtGpuError
from ortgpu.loader._propagate import SHAPE_INPUT_POSITIONS

S = TensorProto.STRING


def _model(
    nodes: list[Any],
    inputs: list[tuple[str, int, list[Any] | None]],
    outputs: list[tuple[str, int]],
    opset: int = 20,
    ml_opset: int | None = None,
) -> bytes:
    graph = helper.make_graph(
        nodes,
        "strings",
        [helper.make_tensor_value_info(name, dtype, shape) for name, dtype, shape in inputs],
        [helper.make_tensor_value_info(name, dtype, None) for name, dtype in outputs],
    )
    opsets = [helper.make_opsetid("", opset)]
    if ml_opset is not None:
        opsets.append(helper.make_opsetid("ai.onnx.ml", ml_opset))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 9 if opset >= 20 else 8
    return bytes(model.SerializeToString())


def _strings(*items: Any) -> np.ndarray:
    return np.array(items, dtype=object)


def _run_both(env: ortgpu.Env, model: bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """ortgpu's outputs, checked equal (dtype, shape, values) to onnxruntime's."""
    expected = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    with ortgpu.InferenceSession(model, env=env) as session:
        got = session.run(None, feeds)
    for want, have in zip(expected, got):
        assert have.dtype == want.dtype and have.shape == want.shape, (have, want)
        if want.dtype == object:
            assert all(isinstance(item, str) for item in have.flat)
            assert have.tolist() == want.tolist()
        else:
            np.testing.assert_array_equal(have, want)
    return got


def _placement(session: ortgpu.InferenceSession, feeds: dict[str, np.ndarray]) -> dict[str, tuple[str, str]]:
    return {
        p.node: (p.placement, p.reason)
        for p in session.get_node_placement({n: a.shape for n, a in feeds.items()}, input_values=feeds)
    }


# -- passthrough, Equal, Cast ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3,), (2, 2), (0,), ()])
def test_identity_passthrough(env: ortgpu.Env, shape: tuple[int, ...]) -> None:
    words = np.array(["a", "héllo", "", "x y"] * 2, dtype=object)
    x = words[: int(np.prod(shape))].reshape(shape)
    model = _model([helper.make_node("Identity", ["X"], ["Y"], name="id")], [("X", S, list(shape))], [("Y", S)])
    _run_both(env, model, {"X": x})
    with ortgpu.InferenceSession(model, env=env) as session:
        assert _placement(session, {"X": x})["id"] == ("cpu", "string tensors live on the host")


def test_graph_input_straight_to_output(env: ortgpu.Env) -> None:
    graph = helper.make_graph(
        [],
        "g",
        [helper.make_tensor_value_info("X", S, [2])],
        [helper.make_tensor_value_info("X", S, [2])],
    )
    model = bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    with ortgpu.InferenceSession(model, env=env) as session:
        (got,) = session.run(None, {"X": _strings("p", "q")})
    assert got.dtype == object and got.tolist() == ["p", "q"]


def test_numpy_str_arrays_are_accepted(env: ortgpu.Env) -> None:
    model = _model([helper.make_node("Identity", ["X"], ["Y"])], [("X", S, [3])], [("Y", S)])
    with ortgpu.InferenceSession(model, env=env) as session:
        (got,) = session.run(None, {"X": np.array(["ab", "c", "dé"])})
        (from_bytes,) = session.run(None, {"X": np.array([b"ab", b"c", "dé".encode()])})
    assert got.dtype == object and got.tolist() == ["ab", "c", "dé"]
    assert from_bytes.tolist() == ["ab", "c", "dé"]


def test_string_initializer_and_constant(env: ortgpu.Env) -> None:
    table = numpy_helper.from_array(_strings("k1", "k2"), "T")
    constant = helper.make_node("Constant", [], ["C"], value=numpy_helper.from_array(_strings("c"), "c"))
    nodes = [
        constant,
        helper.make_node("StringConcat", ["X", "T"], ["A"]),
        helper.make_node("StringConcat", ["A", "C"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("X", S, [2])], [helper.make_tensor_value_info("Y", S, [2])], [table]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    _run_both(env, bytes(model.SerializeToString()), {"X": _strings("a", "b")})


@pytest.mark.parametrize(("a_shape", "b_shape"), [((4,), (4,)), ((2, 3), (3,)), ((2, 1), (1, 3)), ((0,), (1,))])
def test_equal_on_strings(env: ortgpu.Env, a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(3)
    pool = np.array(["x", "y", "", "é"], dtype=object)
    a = rng.choice(pool, a_shape).astype(object)
    b = rng.choice(pool, b_shape).astype(object)
    model = _model(
        [helper.make_node("Equal", ["A", "B"], ["Y"], name="eq")],
        [("A", S, list(a_shape)), ("B", S, list(b_shape))],
        [("Y", TensorProto.BOOL)],
    )
    _run_both(env, model, {"A": a, "B": b})


@pytest.mark.parametrize(
    ("onnx_type", "values"),
    [
        (TensorProto.FLOAT, np.array([0.1, 1 / 3, 1e-5, 1e20, -0.0, np.inf, -np.inf, np.nan, 3.0, 100.5], np.float32)),
        (TensorProto.DOUBLE, np.array([0.1, 1 / 3, 1e300, -2.5], np.float64)),
        (TensorProto.FLOAT16, np.array([0.1, 1000, -3], np.float16)),
        (TensorProto.INT64, np.array([-5, 2**62, 0], np.int64)),
        (TensorProto.UINT8, np.array([0, 255], np.uint8)),
        (TensorProto.BOOL, np.array([True, False])),
    ],
)
def test_cast_numbers_to_strings(env: ortgpu.Env, onnx_type: int, values: np.ndarray) -> None:
    model = _model(
        [helper.make_node("Cast", ["X"], ["Y"], to=S)], [("X", onnx_type, list(values.shape))], [("Y", S)], 19
    )
    _run_both(env, model, {"X": values})


@pytest.mark.parametrize(
    ("onnx_type", "texts"),
    [
        (TensorProto.FLOAT, ["3.14", "1e-5", "1E8", "+INF", "inf", "-Inf", "NaN", " 2.5", "-0", ".5"]),
        (TensorProto.DOUBLE, ["3.14", "-1e300", "nan"]),
        (TensorProto.FLOAT16, ["0.1", "-65504"]),
        (TensorProto.INT64, ["12", "-7", " 3", "+4", "9223372036854775807"]),
        (TensorProto.UINT8, ["300", "-1", "7"]),
        (TensorProto.INT8, ["200", "-129"]),
    ],
)
def test_cast_strings_to_numbers(env: ortgpu.Env, onnx_type: int, texts: list[str]) -> None:
    model = _model(
        [helper.make_node("Cast", ["X"], ["Y"], to=onnx_type)], [("X", S, [len(texts)])], [("Y", onnx_type)], 19
    )
    expected = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]).run(
        None, {"X": np.array(texts, dtype=object)}
    )[0]
    with ortgpu.InferenceSession(model, env=env) as session:
        (got,) = session.run(None, {"X": np.array(texts, dtype=object)})
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
    ("onnx_type", "text"), [(TensorProto.FLOAT, "abc"), (TensorProto.INT64, "2.5"), (TensorProto.FLOAT, "0x10")]
)
def test_cast_refuses_text_the_spec_leaves_undefined(env: ortgpu.Env, onnx_type: int, text: str) -> None:
    model = _model([helper.make_node("Cast", ["X"], ["Y"], to=onnx_type)], [("X", S, [1])], [("Y", onnx_type)], 19)
    with ortgpu.InferenceSession(model, env=env) as session, pytest.raises(ModelError, match="cannot convert"):
        session.run(None, {"X": _strings(text)})


# -- string operators ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("a_shape", "b_shape"), [((3,), (3,)), ((2, 3), (1,)), ((), ()), ((0, 2), (2,))])
def test_string_concat(env: ortgpu.Env, a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(4)
    pool = np.array(["ab", "", "ü", "x y"], dtype=object)
    a = np.asarray(rng.choice(pool, a_shape), dtype=object)
    b = np.asarray(rng.choice(pool, b_shape), dtype=object)
    model = _model(
        [helper.make_node("StringConcat", ["A", "B"], ["Y"])],
        [("A", S, list(a_shape)), ("B", S, list(b_shape))],
        [("Y", S)],
    )
    _run_both(env, model, {"A": a, "B": b})


@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"delimiter": ","},
        {"delimiter": "::"},
        {"delimiter": ",", "maxsplit": 1},
        {"maxsplit": 1},
        {"delimiter": ""},
    ],
)
def test_string_split(env: ortgpu.Env, attrs: dict[str, Any]) -> None:
    x = _strings(["a,b,,c", "  one  two   three ", ""], ["x::y::z", "no delimiter", ",lead,trail,"])
    model = _model(
        [helper.make_node("StringSplit", ["X"], ["Y", "Z"], **attrs)],
        [("X", S, [2, 3])],
        [("Y", S), ("Z", TensorProto.INT64)],
    )
    if "StringSplit" not in SHAPE_INPUT_POSITIONS:
        # Its output width depends on the values: without the planner knowing that, it is refused, never guessed.
        with ortgpu.InferenceSession(model, env=env) as session, pytest.raises(ModelError):
            session.run(None, {"X": x})
        return
    _run_both(env, model, {"X": x})


@pytest.mark.parametrize(
    ("pattern", "texts"),
    [
        (r"[a-z]+@(gmail|yahoo)\.com", ["me@gmail.com", "me@gmail.comx", "Me@yahoo.com", ""]),
        (r"\d{3}-\w+", ["123-ab_c", "12-ab", "١٢٣-ab", "123-é"]),
        (r"a*", ["", "aaa", "ab"]),
        (r"(?i)hello\s+world", ["HeLLo  World", "hello world!", "hello\tworld"]),
    ],
)
def test_regex_full_match(env: ortgpu.Env, pattern: str, texts: list[str]) -> None:
    model = _model(
        [helper.make_node("RegexFullMatch", ["X"], ["Y"], pattern=pattern)],
        [("X", S, [len(texts)])],
        [("Y", TensorProto.BOOL)],
    )
    _run_both(env, model, {"X": np.array(texts, dtype=object)})


@pytest.mark.parametrize("pattern", [r"(?=a)a", r"(a)\1", r"[[:alpha:]]+", r"\pL+"])
def test_regex_refuses_syntax_outside_re2_or_python(env: ortgpu.Env, pattern: str) -> None:
    model = _model(
        [helper.make_node("RegexFullMatch", ["X"], ["Y"], pattern=pattern)], [("X", S, [1])], [("Y", TensorProto.BOOL)]
    )
    with ortgpu.InferenceSession(model, env=env) as session, pytest.raises(ModelError, match="RegexFullMatch"):
        session.run(None, {"X": _strings("aa")})


@pytest.mark.parametrize(
    "attrs",
    [
        {"case_change_action": "NONE"},
        {"case_change_action": "LOWER", "stopwords": ["monday"], "is_case_sensitive": 0},
        {"case_change_action": "UPPER", "stopwords": ["Monday"], "is_case_sensitive": 1},
        {"case_change_action": "NONE", "stopwords": ["monday", "tuesday", "x"]},
    ],
)
@pytest.mark.parametrize("two_dim", [False, True])
def test_string_normalizer(env: ortgpu.Env, attrs: dict[str, Any], two_dim: bool) -> None:
    words = ["Monday", "tuesday", "x", "monday", "Wédnesday", "straße"]
    if attrs.get("stopwords") == ["monday", "tuesday", "x"]:
        words = ["Monday", "tuesday", "X"]  # every word dropped: a single ""
    x = np.array([words] if two_dim else words, dtype=object)
    model = _model(
        # locale "C" (ASCII-only case changes): onnxruntime here has no en_US locale installed.
        [helper.make_node("StringNormalizer", ["X"], ["Y"], locale="C", **attrs)],
        [("X", S, list(x.shape))],
        [("Y", S)],
        10,
    )
    if "StringNormalizer" not in SHAPE_INPUT_POSITIONS:
        with ortgpu.InferenceSession(model, env=env) as session, pytest.raises(ModelError):
            session.run(None, {"X": x})
        return
    _run_both(env, model, {"X": x})


@pytest.mark.parametrize(("action", "expected"), [("UPPER", ["ÉTÉ", "STRAßE"]), ("LOWER", ["été", "straße"])])
def test_string_normalizer_default_locale(env: ortgpu.Env, action: str, expected: list[str]) -> None:
    """The default locale (en_US) changes every letter with a one-letter case mapping, as towupper does."""
    model = _model(
        [helper.make_node("StringNormalizer", ["X"], ["Y"], case_change_action=action, stopwords=["A"])],
        [("X", S, [3])],
        [("Y", S)],
        10,
    )
    with ortgpu.InferenceSession(model, env=env) as session:
        if "StringNormalizer" not in SHAPE_INPUT_POSITIONS:
            with pytest.raises(ModelError):  # see test_string_normalizer
                session.run(None, {"X": _strings("éTé", "a", "StraßE")})
            return
        (got,) = session.run(None, {"X": _strings("éTé", "a", "StraßE")})
    assert got.tolist() == expected


def test_string_normalizer_refuses_other_locales(env: ortgpu.Env) -> None:
    model = _model(
        [helper.make_node("StringNormalizer", ["X"], ["Y"], case_change_action="UPPER", locale="tr_TR.UTF-8")],
        [("X", S, [1])],
        [("Y", S)],
        10,
    )
    with ortgpu.InferenceSession(model, env=env) as session, pytest.raises(ModelError):
        session.run(None, {"X": _strings("i")})


# -- LabelEncoder ---------------------------------------------------------------------------------------


def _encoder(ml_opset: int, in_type: int, out_type: int, shape: tuple[int, ...], **attrs: Any) -> bytes:
    node = helper.make_node("LabelEncoder", ["X"], ["Y"], domain="ai.onnx.ml", **attrs)
    return _model([node], [("X", in_type, list(shape))], [("Y", out_type)], 17, ml_opset)


@pytest.mark.parametrize(
    ("ml_opset", "in_type", "out_type", "attrs", "x"),
    [
        (2, S, TensorProto.INT64, {"keys_strings": ["a", "b"], "values_int64s": [1, 2]}, _strings("a", "b", "z")),
        (
            2,
            S,
            TensorProto.INT64,
            {"keys_strings": ["a"], "values_int64s": [7], "default_int64": 42},
            _strings(["a", "q"], ["", "a"]),
        ),
        (2, TensorProto.INT64, S, {"keys_int64s": [1, 5], "values_strings": ["one", "five"]}, np.array([5, 1, 2])),
        (
            2,
            TensorProto.FLOAT,
            TensorProto.FLOAT,
            {"keys_floats": [0.5, float("nan")], "values_floats": [1.5, 9.0], "default_float": 3.0},
            np.array([0.5, np.nan, 2.0], np.float32),
        ),
        (
            4,
            TensorProto.FLOAT,
            TensorProto.FLOAT,
            {"keys_floats": [0.5, float("nan")], "values_floats": [1.5, 9.0], "default_float": 3.0},
            np.array([0.5, np.nan, 2.0], np.float32),
        ),
        (2, TensorProto.FLOAT, S, {"keys_floats": [0.5], "values_strings": ["half"]}, np.array([0.5, 1.0], np.float32)),
        (
            4,
            S,
            TensorProto.INT16,
            {
                "keys_tensor": numpy_helper.from_array(_strings("a", "b"), "k"),
                "values_tensor": numpy_helper.from_array(np.array([3, 4], np.int16), "v"),
                "default_tensor": numpy_helper.from_array(np.array([-9], np.int16), "d"),
            },
            _strings("b", "c", "a"),
        ),
        (
            4,
            TensorProto.INT64,
            TensorProto.DOUBLE,
            {
                "keys_tensor": numpy_helper.from_array(np.array([1, 2], np.int64), "k"),
                "values_tensor": numpy_helper.from_array(np.array([0.25, 0.5], np.float64), "v"),
            },
            np.array([[2, 1], [3, 2]], np.int64),
        ),
    ],
)
def test_label_encoder(
    env: ortgpu.Env, ml_opset: int, in_type: int, out_type: int, attrs: dict[str, Any], x: np.ndarray
) -> None:
    _run_both(env, _encoder(ml_opset, in_type, out_type, x.shape, **attrs), {"X": x})


def test_label_encoder_refuses_repeated_keys(env: ortgpu.Env) -> None:
    """The spec maps a repeated key to its last value, onnxruntime to its first: refused, never guessed."""
    model = _encoder(2, S, TensorProto.INT64, (1,), keys_strings=["a", "a"], values_int64s=[1, 2])
    with ortgpu.InferenceSession(model, env=env) as session, pytest.raises(ModelError, match="repeated"):
        session.run(None, {"X": _strings("a")})


def test_label_encoder_opset_1(env: ortgpu.Env) -> None:
    """Opset 1 maps strings to their index in classes_strings and back; numpy is the reference (onnxruntime
    implements opset 1 too)."""
    classes = ["cat", "dog", "fish"]
    to_int = _encoder(1, S, TensorProto.INT64, (3,), classes_strings=classes, default_int64=-5)
    to_str = _encoder(1, TensorProto.INT64, S, (4,), classes_strings=classes, default_string="none")
    _run_both(env, to_int, {"X": _strings("dog", "bird", "cat")})
    _run_both(env, to_str, {"X": np.array([2, 7, 0, -1], np.int64)})


# -- mixed models, capture and bindings -------------------------------------------------------------------


def _mixed_model() -> bytes:
    """A float path (Relu, on the device) and a string path (Cast to string, StringConcat, Equal: on the CPU)."""
    nodes = [
        helper.make_node("Relu", ["F"], ["R"], name="relu"),
        helper.make_node("Cast", ["R"], ["RS"], to=S, name="to_string"),
        helper.make_node("StringConcat", ["RS", "W"], ["C"], name="concat"),
        helper.make_node("Equal", ["C", "W"], ["E"], name="eq"),
        helper.make_node("Mul", ["R", "R"], ["M"], name="mul"),
    ]
    return _model(
        nodes,
        [("F", TensorProto.FLOAT, [2, 3]), ("W", S, [3])],
        [("M", TensorProto.FLOAT), ("C", S), ("E", TensorProto.BOOL)],
    )


def test_mixed_float_device_path_and_string_host_path(env: ortgpu.Env) -> None:
    feeds = {
        "F": np.array([[-1.0, 0.5, 2.0], [3.25, -4.0, 7.0]], np.float32),
        "W": _strings("", "x", "y"),
    }
    _run_both(env, _mixed_model(), feeds)
    with ortgpu.InferenceSession(_mixed_model(), env=env) as session:
        placed = _placement(session, feeds)
    assert placed["relu"][0] == "webgpu" and placed["mul"][0] == "webgpu"
    for name in ("to_string", "concat", "eq"):
        assert placed[name] == ("cpu", "string tensors live on the host")


def test_capture_of_a_string_model_is_refused_naming_the_nodes(env: ortgpu.Env) -> None:
    """Float in, float out, strings inside: the string nodes run on the CPU, so the plan cannot be captured."""
    nodes = [
        helper.make_node("Cast", ["X"], ["S"], to=S, name="num_to_text"),
        helper.make_node("Cast", ["S"], ["Y"], to=TensorProto.FLOAT, name="text_to_num"),
    ]
    model = _model(nodes, [("X", TensorProto.FLOAT, [4])], [("Y", TensorProto.FLOAT)])
    x = np.array([1.5, -2.0, 1e-3, 7.0], np.float32)
    with ortgpu.InferenceSession(model, env=env, graph_capture=True) as session:
        binding = session.io_binding()
        binding.bind_input("X", session.allocator.from_numpy(x))
        binding.bind_output("Y", session.allocator.empty((4,), "float32"))
        with pytest.raises(ortgpu.CaptureStateError, match="num_to_text.*text_to_num"):
            session.capture(binding, graph_id=0)
        (got,) = session.run(None, {"X": x})
    np.testing.assert_array_equal(got, x)  # "%.8g" keeps float32 exactly


def test_string_inputs_cannot_be_bound(env: ortgpu.Env) -> None:
    model = _model([helper.make_node("Identity", ["X"], ["Y"])], [("X", S, [2])], [("Y", S)])
    with ortgpu.InferenceSession(model, env=env) as session:
        binding = session.io_binding()
        with pytest.raises(ortgpu.DtypeError, match="strings"):
            binding.bind_cpu_input("X", _strings("a", "b"))


def test_string_node_args_and_ort_values(env: ortgpu.Env) -> None:
    model = _model([helper.make_node("Identity", ["X"], ["Y"])], [("X", S, [2])], [("Y", S)])
    with ortgpu.InferenceSession(model, env=env) as session:
        assert [arg.type for arg in session.get_inputs() + session.get_outputs()] == ["tensor(string)"] * 2
        with pytest.raises(ortgpu.DtypeError):
            session.allocator.empty((2,), object)  # strings never live on the device
        with pytest.raises(ortgpu.DtypeError, match="strings"):
            session.io_binding().bind_output("Y", session.allocator.empty((2,), "float32"))


def test_string_feed_of_wrong_dtype_is_refused(env: ortgpu.Env) -> None:
    model = _model([helper.make_node("Identity", ["X"], ["Y"])], [("X", S, [2])], [("Y", S)])
    with ortgpu.InferenceSession(model, env=env) as session, pytest.raises(OrtGpuError):
        session.run(None, {"X": np.array([1.0, 2.0], np.float32)})
