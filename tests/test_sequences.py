"""Sequence values (``seq(tensor)``, lists of numpy arrays) through sessions on both backends, against onnxruntime.

Sequences live on the host: every node that reads or writes one runs on the CPU ("sequence values live on the
host"), they get no device buffer, and a plan with such nodes cannot be captured or bound.  Covers
SequenceConstruct/Insert/Erase/At/Length/Empty, SplitToSequence, ConcatFromSequence, SequenceMap (a body
subgraph), a Loop carrying a sequence, sequence graph inputs and outputs, a model mixing a device tensor path
with a host sequence path, and the refusals (capture, IOBinding, wrong element dtypes).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper

import ortgpu
from ortgpu import ModelError, OrtGpuError

F = TensorProto.FLOAT
I64 = TensorProto.INT64


def _seq(name: str, elem: int = F) -> Any:
    return helper.make_tensor_sequence_value_info(name, elem, None)


def _tensor(name: str, elem: int = F, shape: list[Any] | None = None) -> Any:
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], opset: int = 17) -> bytes:
    graph = helper.make_graph(nodes, "sequences", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def _same(want: Any, have: Any) -> None:
    if isinstance(want, list):
        assert isinstance(have, list) and len(have) == len(want), (have, want)
        for w, h in zip(want, have):
            _same(w, h)
        return
    assert isinstance(have, np.ndarray) and have.dtype == want.dtype and have.shape == want.shape, (have, want)
    np.testing.assert_array_equal(have, want)


def _run_both(env: ortgpu.Env, model: bytes, feeds: dict[str, Any]) -> list[Any]:
    """ortgpu's outputs, checked equal (types, dtypes, shapes, values) to onnxruntime's."""
    expected = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    with ortgpu.InferenceSession(model, env=env) as session:
        got = session.run(None, feeds)
        again = session.run(None, feeds)  # the cached plan
    for want, have, have_again in zip(expected, got, again):
        _same(want, have)
        _same(want, have_again)
    return got


def _placement(session: ortgpu.InferenceSession, feeds: dict[str, Any]) -> dict[str, tuple[str, str]]:
    shapes = {n: tuple(v.shape) if isinstance(v, np.ndarray) else () for n, v in feeds.items()}
    return {p.node: (p.placement, p.reason) for p in session.get_node_placement(shapes, input_values=feeds)}


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("position", [None, 0, 1, -1, 3, -3])
def test_construct_insert_length_at(env: ortgpu.Env, position: int | None) -> None:
    inserted = ["S", "T"] + ([] if position is None else ["P"])
    nodes = [
        helper.make_node("SequenceConstruct", ["A", "B", "C"], ["S"], name="construct"),
        helper.make_node("SequenceInsert", inserted, ["S2"], name="insert"),
        helper.make_node("SequenceLength", ["S2"], ["N"], name="length"),
        helper.make_node("SequenceAt", ["S2", "Q"], ["X"], name="at"),
    ]
    inputs = [_tensor("A", F, [2, 3]), _tensor("B", F, [1, 3]), _tensor("C", F, [4, 3]), _tensor("T", F, [5, 3])]
    inputs.append(_tensor("Q", I64, []))
    feeds: dict[str, Any] = {"A": _rand(2, 3), "B": _rand(1, 3), "C": _rand(4, 3), "T": _rand(5, 3)}
    feeds["Q"] = np.array(-2, np.int64)
    if position is not None:
        inputs.append(_tensor("P", I64, []))
        feeds["P"] = np.array(position, np.int64)
    model = _model(nodes, inputs, [_seq("S2"), _tensor("N", I64), _tensor("X")])
    got = _run_both(env, model, feeds)
    assert len(got[0]) == 4 and got[1] == 4


@pytest.mark.parametrize("position", [None, 0, -1, 1])
def test_erase_and_concat(env: ortgpu.Env, position: int | None) -> None:
    erase = ["S"] + ([] if position is None else ["P"])
    nodes = [
        helper.make_node("SequenceConstruct", ["A", "B", "C"], ["S"]),
        helper.make_node("SequenceErase", erase, ["S2"]),
        helper.make_node("ConcatFromSequence", ["S2"], ["Y"], axis=-1),
        helper.make_node("ConcatFromSequence", ["S"], ["Z"], axis=0, new_axis=1),
    ]
    inputs = [_tensor("A", F, [2, 3]), _tensor("B", F, [2, 3]), _tensor("C", F, [2, 3])]
    feeds: dict[str, Any] = {"A": _rand(2, 3, seed=1), "B": _rand(2, 3, seed=2), "C": _rand(2, 3, seed=3)}
    if position is not None:
        inputs.append(_tensor("P", I64, []))
        feeds["P"] = np.array(position, np.int64)
    _run_both(env, _model(nodes, inputs, [_tensor("Y"), _tensor("Z")]), feeds)


def test_empty_then_insert(env: ortgpu.Env) -> None:
    nodes = [
        helper.make_node("SequenceEmpty", [], ["E"], dtype=I64),
        helper.make_node("SequenceInsert", ["E", "X"], ["S"]),
        helper.make_node("SequenceInsert", ["S", "X"], ["S2"]),
        helper.make_node("ConcatFromSequence", ["S2"], ["Y"], axis=0),
    ]
    feeds = {"X": np.arange(6, dtype=np.int64).reshape(2, 3)}
    _run_both(env, _model(nodes, [_tensor("X", I64, [2, 3])], [_tensor("Y", I64)]), feeds)


@pytest.mark.parametrize(
    ("split", "attrs"),
    [
        (None, {"axis": 1}),
        (None, {"axis": 0, "keepdims": 0}),
        (np.array(2, np.int64), {"axis": 1}),
        (np.array([1, 3, 1], np.int64), {"axis": -1}),
        (np.array([0, 4], np.int64), {"axis": 0}),
    ],
)
def test_split_to_sequence(env: ortgpu.Env, split: np.ndarray | None, attrs: dict[str, Any]) -> None:
    names = ["X"] + ([] if split is None else ["SPLIT"])
    nodes = [
        helper.make_node("SplitToSequence", names, ["S"], **attrs),
        helper.make_node("SequenceLength", ["S"], ["N"]),
    ]
    inputs = [_tensor("X", F, [4, 5])]
    feeds: dict[str, Any] = {"X": _rand(4, 5, seed=7)}
    if split is not None:
        inputs.append(_tensor("SPLIT", I64, list(split.shape)))
        feeds["SPLIT"] = split
    _run_both(env, _model(nodes, inputs, [_seq("S"), _tensor("N", I64)]), feeds)


def test_sequence_graph_input_and_output(env: ortgpu.Env) -> None:
    nodes = [
        helper.make_node("SequenceAt", ["S", "P"], ["X"], name="at"),
        helper.make_node("Identity", ["S"], ["S_OUT"], name="identity"),
        helper.make_node("SequenceLength", ["S"], ["N"], name="length"),
    ]
    model = _model(nodes, [_seq("S"), _tensor("P", I64, [])], [_tensor("X"), _seq("S_OUT"), _tensor("N", I64)])
    for shapes in ([(2, 3), (4,), ()], [(1, 1)], [(0, 2), (3, 2)]):
        feeds = {"S": [_rand(*s, seed=3) for s in shapes], "P": np.array(len(shapes) - 1, np.int64)}
        _run_both(env, model, feeds)
    with ortgpu.InferenceSession(model, env=env) as session:
        assert [a.type for a in session.get_inputs()] == ["seq(tensor(float))", "tensor(int64)"]
        assert session.get_outputs()[1].type == "seq(tensor(float))"
        with pytest.raises(ortgpu.DtypeError, match="sequence of float32"):
            session.run(None, {"S": [np.zeros(2, np.float64)], "P": np.array(0, np.int64)})
        with pytest.raises(OrtGpuError, match="list of numpy arrays"):
            session.run(None, {"S": np.zeros(2, np.float32), "P": np.array(0, np.int64)})
        with pytest.raises(OrtGpuError, match="out of range"):
            session.run(None, {"S": [np.zeros(2, np.float32)], "P": np.array(3, np.int64)})


def _map_model(body_nodes: list[Any], body_in: list[Any], body_out: list[Any], n_tensors: int) -> bytes:
    body = helper.make_graph(body_nodes, "body", body_in, body_out)
    inputs = [_seq("S")] + [_tensor(f"T{i}", F, [3]) for i in range(n_tensors)]
    node = helper.make_node("SequenceMap", ["S"] + [f"T{i}" for i in range(n_tensors)], ["OUT"], body=body, name="map")
    return _model([node], inputs, [_seq("OUT", body_out[0].type.tensor_type.elem_type)])


def test_sequence_map(env: ortgpu.Env) -> None:
    add = _map_model(
        [helper.make_node("Add", ["x", "t"], ["y"])],
        [_tensor("x", F, ["n"]), _tensor("t", F, ["n"])],
        [_tensor("y", F, ["n"])],
        1,
    )
    _run_both(env, add, {"S": [_rand(3), _rand(3, seed=5)], "T0": _rand(3, seed=9)})
    shapes = _map_model(
        [helper.make_node("Shape", ["x"], ["y"])], [_tensor("x", F, ["h", "w"])], [_tensor("y", I64, [2])], 0
    )
    _run_both(env, shapes, {"S": [_rand(2, 3), _rand(4, 1), _rand(0, 5)]})


def test_loop_carrying_a_sequence(env: ortgpu.Env) -> None:
    """The loop body appends its iteration's tensor to a loop-carried sequence (onnx's SequenceMap expansion)."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Cast", ["i"], ["fi"], to=F),
            helper.make_node("Mul", ["X", "fi"], ["xi"]),
            helper.make_node("SequenceInsert", ["seq_in", "xi"], ["seq_out"]),
        ],
        "body",
        [_tensor("i", I64, []), _tensor("cond_in", TensorProto.BOOL, []), _seq("seq_in")],
        [_tensor("cond_out", TensorProto.BOOL, []), _seq("seq_out")],
    )
    nodes = [
        helper.make_node("SequenceEmpty", [], ["E"], dtype=F),
        helper.make_node("Loop", ["M", "", "E"], ["S"], body=body),
        helper.make_node("ConcatFromSequence", ["S"], ["Y"], axis=0, new_axis=1),
    ]
    model = _model(nodes, [_tensor("X", F, [2]), _tensor("M", I64, [])], [_seq("S"), _tensor("Y")])
    _run_both(env, model, {"X": _rand(2), "M": np.array(3, np.int64)})


def _mixed_model() -> bytes:
    nodes = [
        helper.make_node("Relu", ["A"], ["R"], name="relu"),
        helper.make_node("SplitToSequence", ["R"], ["S"], axis=0, name="split"),
        helper.make_node("ConcatFromSequence", ["S"], ["C"], axis=1, name="concat"),
        helper.make_node("Mul", ["C", "C"], ["Y"], name="mul"),
    ]
    return _model(nodes, [_tensor("A", F, [3, 4])], [_tensor("Y", F, [1, 12]), _tensor("R", F, [3, 4])])


def test_mixed_device_tensor_path_and_host_sequence_path(env: ortgpu.Env) -> None:
    feeds = {"A": _rand(3, 4, seed=11)}
    _run_both(env, _mixed_model(), feeds)
    with ortgpu.InferenceSession(_mixed_model(), env=env) as session:
        placed = _placement(session, feeds)
    assert placed["relu"][0] == "webgpu" and placed["mul"][0] == "webgpu"
    for name in ("split", "concat"):
        assert placed[name] == ("cpu", "sequence values live on the host")


def test_capture_of_a_sequence_model_is_refused_naming_the_nodes(env: ortgpu.Env) -> None:
    x = _rand(3, 4, seed=12)
    with ortgpu.InferenceSession(_mixed_model(), env=env, graph_capture=True) as session:
        binding = session.io_binding()
        binding.bind_input("A", session.allocator.from_numpy(x))
        binding.bind_output("Y", session.allocator.empty((1, 12), "float32"))
        binding.bind_output("R", session.allocator.empty((3, 4), "float32"))
        with pytest.raises(ortgpu.CaptureStateError, match="split.*concat"):
            session.capture(binding, graph_id=0)
        got = session.run(None, {"A": x})
    relu = np.maximum(x, 0)
    np.testing.assert_array_equal(got[0], (relu.reshape(1, 12) * relu.reshape(1, 12)))


def test_sequences_cannot_be_bound(env: ortgpu.Env) -> None:
    model = _model([helper.make_node("Identity", ["S"], ["T"])], [_seq("S")], [_seq("T")])
    with ortgpu.InferenceSession(model, env=env) as session:
        with pytest.raises(ortgpu.DtypeError, match="sequences"):
            session.io_binding().bind_output("T", session.allocator.empty((2,), "float32"))
        with pytest.raises(ortgpu.DtypeError, match="sequences"):
            session.io_binding().bind_cpu_input("S", np.zeros(2, np.float32))
        with pytest.raises(OrtGpuError, match="sequence"):
            session.get_node_placement()


def test_value_dependent_element_shapes_are_refused_not_guessed(env: ortgpu.Env) -> None:
    """A SequenceMap body whose shapes follow its values: planned from a probe, the run's shapes differ, so the
    run is a typed error rather than a wrong shape downstream."""
    body = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["y"])], "body", [_tensor("x", F, [4])], [_tensor("y", I64, [1, "k"])]
    )
    nodes = [
        helper.make_node("SequenceConstruct", ["A"], ["S"]),
        helper.make_node("SequenceMap", ["S"], ["M"], body=body),
        helper.make_node("ConcatFromSequence", ["M"], ["Y"], axis=1),
    ]
    model = _model(nodes, [_tensor("A", F, [4])], [_tensor("Y", I64)])
    with ortgpu.InferenceSession(model, env=env) as session, pytest.raises(ModelError, match="element shapes"):
        session.run(None, {"A": np.array([1, 0, 2, 0], np.float32)})
