"""Optional values (``optional(tensor)``, ``optional(seq(tensor))``) through sessions on both backends, against
onnxruntime.

Optionals live on the host like sequences: ``run()`` takes and gives None for an empty optional, else its element
(an array, or a list of arrays for a sequence); every node that reads or writes one runs on the CPU ("optional
values live on the host"); plans are made per state (empty or present, element shapes); IOBinding refuses them.
Covers the operators (Optional, OptionalHasElement, OptionalGetElement), optional graph inputs and outputs, an
optional carried through a Loop, an If returning an optional, a model mixing device nodes with an optional, the
type names of get_inputs()/get_outputs(), and the typed refusals.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper

import ortgpu
from ortgpu import OrtGpuError

F = TensorProto.FLOAT
I64 = TensorProto.INT64
B = TensorProto.BOOL


def _opt_tensor(name: str, elem: int = F, shape: list[Any] | None = None) -> Any:
    return helper.make_value_info(name, helper.make_optional_type_proto(helper.make_tensor_type_proto(elem, shape)))


def _opt_seq(name: str, elem: int = F) -> Any:
    sequence = helper.make_sequence_type_proto(helper.make_tensor_type_proto(elem, None))
    return helper.make_value_info(name, helper.make_optional_type_proto(sequence))


def _tensor(name: str, elem: int = F, shape: list[Any] | None = None) -> Any:
    return helper.make_tensor_value_info(name, elem, shape)


def _seq(name: str, elem: int = F) -> Any:
    return helper.make_tensor_sequence_value_info(name, elem, None)


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], opset: int = 18) -> bytes:
    graph = helper.make_graph(nodes, "optionals", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def _same(want: Any, have: Any) -> None:
    if want is None:
        assert have is None, have
        return
    if isinstance(want, list):
        assert isinstance(have, list) and len(have) == len(want), (have, want)
        for w, h in zip(want, have):
            _same(w, h)
        return
    assert isinstance(have, np.ndarray) and have.dtype == want.dtype and have.shape == want.shape, (have, want)
    np.testing.assert_array_equal(have, want)


def _run_both(env: ortgpu.Env, model: bytes, feeds: dict[str, Any]) -> list[Any]:
    """ortgpu's outputs, checked equal (None, types, dtypes, shapes, values) to onnxruntime's, twice (the second
    run uses the cached plan)."""
    expected = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    with ortgpu.InferenceSession(model, env=env) as session:
        got = session.run(None, feeds)
        again = session.run(None, feeds)
    assert len(got) == len(expected)
    for want, have, have_again in zip(expected, got, again):
        _same(want, have)
        _same(want, have_again)
    return got


def _has_and_identity(opt: Any) -> bytes:
    return _model(
        [helper.make_node("OptionalHasElement", ["x"], ["has"]), helper.make_node("Identity", ["x"], ["y"])],
        [opt("x")],
        [_tensor("has", B, []), opt("y")],
    )


@pytest.mark.parametrize("value", [None, np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros((0, 4), np.float32)])
def test_optional_tensor_input_and_output(env: ortgpu.Env, value: Any) -> None:
    model = _has_and_identity(lambda name: _opt_tensor(name, F, None))
    has, y = _run_both(env, model, {"x": value})
    assert bool(has) is (value is not None)
    assert (y is None) is (value is None)


@pytest.mark.parametrize(
    "value", [None, [], [np.ones(2, np.float32)], [np.ones((2, 2), np.float32), np.arange(3, dtype=np.float32)]]
)
def test_optional_sequence_input_and_output(env: ortgpu.Env, value: Any) -> None:
    model = _has_and_identity(_opt_seq)
    has, y = _run_both(env, model, {"x": value})
    assert bool(has) is (value is not None)
    assert (y is None) is (value is None)


def test_one_session_runs_empty_and_present(env: ortgpu.Env) -> None:
    """The plan is made per state: an empty run after a present one (and shapes changing) is planned anew."""
    model = _has_and_identity(lambda name: _opt_tensor(name, F, None))
    with ortgpu.InferenceSession(model, env=env) as session:
        for value in [np.ones(3, np.float32), None, np.ones((2, 2), np.float32), None, np.ones(3, np.float32)]:
            has, y = session.run(None, {"x": value})
            assert bool(has) is (value is not None)
            _same(value, y)


def test_optional_construct_and_get(env: ortgpu.Env) -> None:
    """Optional with an input (present) and with only a type (empty); OptionalGetElement feeding device nodes."""
    model = _model(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Optional", ["r"], ["present"]),
            helper.make_node("Optional", [], ["empty"], type=helper.make_tensor_type_proto(F, [2, 3])),
            helper.make_node("OptionalHasElement", ["present"], ["has_present"]),
            helper.make_node("OptionalHasElement", ["empty"], ["has_empty"]),
            helper.make_node("OptionalGetElement", ["present"], ["element"]),
            helper.make_node("Mul", ["element", "x"], ["product"]),
        ],
        [_tensor("x", F, [2, 3])],
        [
            _opt_tensor("present", F, [2, 3]),
            _opt_tensor("empty", F, [2, 3]),
            _tensor("has_present", B, []),
            _tensor("has_empty", B, []),
            _tensor("product", F, [2, 3]),
        ],
    )
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    present, empty, has_present, has_empty, product = _run_both(env, model, {"x": x})
    assert empty is None and bool(has_present) and not bool(has_empty)
    np.testing.assert_array_equal(product, np.maximum(x, 0) * x)
    with ortgpu.InferenceSession(model, env=env) as session:
        placement = {p.op_type: p for p in session.get_node_placement()}
    assert (
        placement["Optional"].placement == "cpu" and placement["Optional"].reason == "optional values live on the host"
    )
    assert placement["Relu"].placement == "webgpu" and placement["Mul"].placement == "webgpu"


def test_optional_of_sequence_construct(env: ortgpu.Env) -> None:
    model = _model(
        [
            helper.make_node("SequenceConstruct", ["x", "x"], ["s"]),
            helper.make_node("Optional", ["s"], ["o"]),
            helper.make_node("OptionalGetElement", ["o"], ["back"]),
            helper.make_node("SequenceLength", ["back"], ["n"]),
            helper.make_node(
                "Optional", [], ["e"], type=helper.make_sequence_type_proto(helper.make_tensor_type_proto(I64, None))
            ),
            helper.make_node("OptionalHasElement", ["e"], ["has_e"]),
        ],
        [_tensor("x", F, [3])],
        [_opt_seq("o"), _seq("back"), _tensor("n", I64, []), _opt_seq("e", I64), _tensor("has_e", B, [])],
    )
    o, back, n, e, has_e = _run_both(env, model, {"x": np.arange(3, dtype=np.float32)})
    assert len(o) == 2 and len(back) == 2 and int(n) == 2 and e is None and not bool(has_e)


def test_has_element_of_plain_and_absent_inputs(env: ortgpu.Env) -> None:
    """Opset 18: a plain tensor or sequence is present; an absent input (empty name) is not."""
    model = _model(
        [
            helper.make_node("OptionalHasElement", ["x"], ["has_x"]),
            helper.make_node("SequenceConstruct", ["x"], ["s"]),
            helper.make_node("OptionalHasElement", ["s"], ["has_s"]),
            helper.make_node("OptionalHasElement", [""], ["has_none"]),
            helper.make_node("OptionalGetElement", ["x"], ["same"]),
        ],
        [_tensor("x", F, [2])],
        [_tensor("has_x", B, []), _tensor("has_s", B, []), _tensor("has_none", B, []), _tensor("same", F, [2])],
    )
    x = np.array([1.5, -2.0], np.float32)
    with ortgpu.InferenceSession(model, env=env) as session:
        has_x, has_s, has_none, same = session.run(None, {"x": x})
    assert bool(has_x) and bool(has_s) and not bool(has_none)
    np.testing.assert_array_equal(same, x)


def test_get_element_of_empty_is_a_typed_error(env: ortgpu.Env) -> None:
    model = _model(
        [helper.make_node("OptionalGetElement", ["x"], ["y"])], [_opt_tensor("x", F, [None])], [_tensor("y", F, [None])]
    )
    with ortgpu.InferenceSession(model, env=env) as session:
        _same(np.ones(4, np.float32), session.run(None, {"x": np.ones(4, np.float32)})[0])
        with pytest.raises(OrtGpuError, match="empty"):
            session.run(None, {"x": None})


def _if_optional_model() -> bytes:
    """An If whose then branch returns an empty optional sequence and else branch a present one."""
    then_branch = helper.make_graph(
        [
            helper.make_node(
                "Optional",
                [],
                ["then_out"],
                type=helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, None)),
            )
        ],
        "then",
        [],
        [_opt_seq("then_out")],
    )
    else_branch = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("SequenceConstruct", ["r", "x"], ["s"]),
            helper.make_node("Optional", ["s"], ["else_out"]),
        ],
        "else",
        [],
        [_opt_seq("else_out")],
    )
    return _model(
        [
            helper.make_node("If", ["cond"], ["out"], then_branch=then_branch, else_branch=else_branch),
            helper.make_node("OptionalHasElement", ["out"], ["has"]),
        ],
        [_tensor("cond", B, []), _tensor("x", F, [3])],
        [_opt_seq("out"), _tensor("has", B, [])],
    )


@pytest.mark.parametrize("cond", [True, False])
def test_if_returns_an_optional(env: ortgpu.Env, cond: bool) -> None:
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    out, has = _run_both(env, _if_optional_model(), {"cond": np.array(cond), "x": x})
    assert (out is None) is cond and bool(has) is not cond


def _loop_optional_model() -> bytes:
    """A Loop carrying an optional tensor: the body appends its iteration to the element, or starts one when the
    optional is empty, and returns it as a present optional."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("OptionalHasElement", ["acc_in"], ["has"]),
            helper.make_node(
                "If",
                ["has"],
                ["current"],
                then_branch=helper.make_graph(
                    [helper.make_node("OptionalGetElement", ["acc_in"], ["got"])], "got", [], [_tensor("got", F, None)]
                ),
                else_branch=helper.make_graph(
                    [helper.make_node("Constant", [], ["start"], value=helper.make_tensor("start", F, [1], [100.0]))],
                    "start",
                    [],
                    [_tensor("start", F, [1])],
                ),
            ),
            helper.make_node("Cast", ["i"], ["i_float"], to=F),
            helper.make_node("Reshape", ["i_float", "one"], ["i_vec"]),
            helper.make_node("Concat", ["current", "i_vec"], ["grown"], axis=0),
            helper.make_node("Optional", ["grown"], ["acc_out"]),
        ],
        "body",
        [_tensor("i", I64, []), _tensor("cond_in", B, []), _opt_tensor("acc_in", F, None)],
        [_tensor("cond_out", B, []), _opt_tensor("acc_out", F, None)],
        initializer=[helper.make_tensor("one", I64, [1], [1])],
    )
    return _model(
        [helper.make_node("Loop", ["trip", "", "acc"], ["result"], body=body)],
        [_tensor("trip", I64, []), _opt_tensor("acc", F, None)],
        [_opt_tensor("result", F, None)],
    )


@pytest.mark.parametrize("trip", [0, 1, 3])
@pytest.mark.parametrize("acc", [None, np.array([7.0, 8.0], np.float32)])
def test_loop_carries_an_optional(env: ortgpu.Env, trip: int, acc: Any) -> None:
    (result,) = _run_both(env, _loop_optional_model(), {"trip": np.array(trip, np.int64), "acc": acc})
    if trip == 0:
        _same(acc, result)
    else:
        assert result is not None and result.shape == ((1 if acc is None else 2) + trip,)


def test_loop_with_an_optional_sequence_node_test_model(env: ortgpu.Env) -> None:
    """onnx's test_loop16_seq_none model: an optional sequence carried, present and empty at the start."""
    model = _node_test_model("test_loop16_seq_none")
    for start in (None, [np.array(7.0, np.float32)]):
        for trip in (0, 2, 4):
            _run_both(env, model, {"trip_count": np.array(trip), "cond": np.array(True), "opt_seq": start})


@functools.lru_cache(maxsize=None)
def _node_test_model(name: str) -> bytes:
    """The model of onnx's node test ``name`` (its cases are made in Python when loaded)."""
    import onnx.backend.test.loader as loader

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        (case,) = [c for c in loader.load_node_model_tests() if c.name == name]
    return bytes(case.model.SerializeToString())


def test_type_names_as_onnxruntime(env: ortgpu.Env) -> None:
    model = _model(
        [
            helper.make_node("Identity", ["a"], ["a_out"]),
            helper.make_node("Identity", ["b"], ["b_out"]),
        ],
        [_opt_tensor("a", I64, [2]), _opt_seq("b")],
        [_opt_tensor("a_out", I64, [2]), _opt_seq("b_out")],
    )
    reference = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    with ortgpu.InferenceSession(model, env=env) as session:
        assert [i.type for i in session.get_inputs()] == [i.type for i in reference.get_inputs()]
        assert [o.type for o in session.get_outputs()] == [o.type for o in reference.get_outputs()]
        assert [i.type for i in session.get_inputs()] == ["optional(tensor(int64))", "optional(seq(tensor(float)))"]


def test_iobinding_refuses_optionals(env: ortgpu.Env) -> None:
    model = _has_and_identity(lambda name: _opt_tensor(name, F, None))
    with ortgpu.InferenceSession(model, env=env) as session:
        binding = session.io_binding()
        with pytest.raises(ortgpu.DtypeError, match=r"optionals.*session\.run\(\)"):
            binding.bind_cpu_input("x", np.ones(2, np.float32))


def test_wrong_feeds_are_typed_errors(env: ortgpu.Env) -> None:
    tensor_model = _has_and_identity(lambda name: _opt_tensor(name, F, None))
    sequence_model = _has_and_identity(_opt_seq)
    with ortgpu.InferenceSession(tensor_model, env=env) as session:
        with pytest.raises(ortgpu.DtypeError, match="never casts"):
            session.run(None, {"x": np.ones(2, np.int64)})
        with pytest.raises(ortgpu.ArgumentTypeError, match="numpy array"):
            session.run(None, {"x": [np.ones(2, np.float32)]})
    with ortgpu.InferenceSession(sequence_model, env=env) as session:
        with pytest.raises(ortgpu.ArgumentTypeError, match="list of numpy arrays"):
            session.run(None, {"x": np.ones(2, np.float32)})


def test_unsupported_optional_types_are_refused(env: ortgpu.Env) -> None:
    optional_of_optional = helper.make_optional_type_proto(
        helper.make_optional_type_proto(helper.make_tensor_type_proto(F, None))
    )
    model = _model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_value_info("x", optional_of_optional)],
        [helper.make_value_info("y", optional_of_optional)],
    )
    with pytest.raises(ortgpu.UnsupportedOpError, match="optional"):
        ortgpu.InferenceSession(model, env=env)


def test_optional_input_decides_a_branch(env: ortgpu.Env) -> None:
    """An If on OptionalHasElement of a graph input: the input's presence decides the plan (a value-deciding
    input); the element's declared shape is checked as onnxruntime checks it."""
    then_branch = helper.make_graph(
        [helper.make_node("OptionalGetElement", ["x"], ["t"])], "t", [], [_tensor("t", F, None)]
    )
    else_branch = helper.make_graph(
        [helper.make_node("Constant", [], ["e"], value=helper.make_tensor("e", F, [2, 2], [1, -2, 3, -4]))],
        "e",
        [],
        [_tensor("e", F, [2, 2])],
    )
    model = _model(
        [
            helper.make_node("OptionalHasElement", ["x"], ["h"]),
            helper.make_node("If", ["h"], ["y"], then_branch=then_branch, else_branch=else_branch),
            helper.make_node("Relu", ["y"], ["z"]),
        ],
        [_opt_tensor("x", F, [None, 2])],
        [_tensor("z", F, None)],
    )
    for value in [None, -np.ones((3, 2), np.float32), np.arange(4, dtype=np.float32).reshape(2, 2) - 1]:
        _run_both(env, model, {"x": value})
    with ortgpu.InferenceSession(model, env=env) as session:
        assert session.value_deciding_inputs == ["x"]
        with pytest.raises(ortgpu.ShapeError, match=r"shape \[None, 2\]; got shape \[3, 3\]"):
            session.run(None, {"x": np.ones((3, 3), np.float32)})
