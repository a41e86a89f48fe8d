"""If, Loop and Scan (CPU control flow, ortgpu/_subgraph.py) in sessions on both backends, against onnxruntime.

Models are built with onnx.helper: a Loop whose body holds an If and reads tensors of the enclosing graph, a
Loop whose condition ends it early, Ifs on a graph-input condition (planned per value), Scan at opset 8 (batch,
sequence_lens, reverse) and at opsets 9/16 (axes, input and output directions).  Device-computed trip counts
are refused (typed) rather than guessed; control flow the plan knows is expanded onto the device, the rest runs
whole on the CPU (capture refuses naming it); expansion is bounded (nested loops too); subgraph nodes count
against the node-count limit, and subgraph attributes of other operators stay refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime
import pytest

import ortgpu
import ortgpu_core
from ortgpu.loader._model import load_model
from ortgpu_core._errors import CaptureStateError, ModelError, UnsupportedOpError

F = onnx.TensorProto.FLOAT
I64 = onnx.TensorProto.INT64
B = onnx.TensorProto.BOOL


def _model(
    nodes: list[onnx.NodeProto], inputs: list[Any], outputs: list[Any], opset: int, inits: tuple[Any, ...] = ()
) -> bytes:
    graph = oh.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def _compare(model: bytes, env: ortgpu_core.Env, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    expected = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    with ortgpu.InferenceSession(model, env=env) as session:
        got = session.run(None, feeds)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)
    return [np.asarray(g) for g in got]


def _loop_with_if(opset: int = 13) -> bytes:
    """v <- (i even ? v + Y : v * 2) for i < M; Y is read from the main graph inside the nested If."""
    two = oh.make_tensor("two", I64, [], [2])
    zero = oh.make_tensor("zero", I64, [], [0])
    then_g = oh.make_graph(
        [oh.make_node("Add", ["v", "Y"], ["t"])], "then", [], [oh.make_tensor_value_info("t", F, [3])]
    )
    else_g = oh.make_graph(
        [oh.make_node("Mul", ["v", "scale"], ["e"])], "else", [], [oh.make_tensor_value_info("e", F, [3])]
    )
    body = oh.make_graph(
        [
            oh.make_node("Constant", [], ["scale"], value=oh.make_tensor("s", F, [], [2.0])),
            oh.make_node("Mod", ["i", "two"], ["r"]),
            oh.make_node("Equal", ["r", "zero"], ["even"]),
            oh.make_node("If", ["even"], ["v2"], then_branch=then_g, else_branch=else_g),
            oh.make_node("Identity", ["c"], ["c2"]),
            oh.make_node("ReduceSum", ["v2"], ["s2"], keepdims=0),
        ],
        "body",
        [
            oh.make_tensor_value_info("i", I64, []),
            oh.make_tensor_value_info("c", B, []),
            oh.make_tensor_value_info("v", F, [3]),
        ],
        [
            oh.make_tensor_value_info("c2", B, []),
            oh.make_tensor_value_info("v2", F, [3]),
            oh.make_tensor_value_info("s2", F, []),
        ],
        initializer=[two, zero],
    )
    return _model(
        [
            oh.make_node("Constant", [], ["true"], value=oh.make_tensor("t", B, [], [True])),
            oh.make_node("Loop", ["M", "true", "X"], ["final", "sums"], body=body),
        ],
        [
            oh.make_tensor_value_info("M", I64, []),
            oh.make_tensor_value_info("X", F, [3]),
            oh.make_tensor_value_info("Y", F, [3]),
        ],
        [oh.make_tensor_value_info("final", F, [3]), oh.make_tensor_value_info("sums", F, [None])],
        opset,
    )


def test_loop_with_nested_if_and_outer_scope_reads(env: ortgpu_core.Env) -> None:
    """M is a graph input: each trip count is planned for its value (zero trips included)."""
    model = _loop_with_if()
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    for trips in (3, 0, 5):
        final, sums = _compare(model, env, {"M": np.array(trips, np.int64), "X": x, "Y": y})
        assert sums.shape == (trips,)
    with ortgpu.InferenceSession(model, env=env) as session:
        # The trip count is known when planning: the loop is unrolled (each iteration's If inlined) onto the device.
        rows = session.get_node_placement(input_values={"M": np.array(2, np.int64)})
        loop = next(p for p in rows if p.op_type == "Loop")
        assert loop.placement == "webgpu" and "unrolled: 2 iterations" in loop.reason, rows
        inlined = [p for p in rows if p.node.startswith(f"{loop.node}/iter1/") and p.op_type == "If"]
        assert inlined and "branch inlined" in inlined[0].reason, rows
        assert all(p.placement == "webgpu" and p.capturable for p in rows), rows
        # Zero trips leave a scan output whose shape only the interpreter's rules give: the loop runs whole.
        rows = session.get_node_placement(input_values={"M": np.array(0, np.int64)})
        loop = next(p for p in rows if p.op_type == "Loop")
        assert loop.placement == "cpu" and not loop.capturable
        body_rows = [p for p in rows if p.node.startswith(f"{loop.node}/body/")]
        assert {p.op_type for p in body_rows} >= {"Mod", "Equal", "If", "ReduceSum"}
        assert all(p.placement == "cpu" and "which runs on the CPU" in p.reason for p in body_rows)
        assert all(p.inside == loop.node for p in body_rows) and loop.inside == ""  # nested ones name the outer loop
        assert any(p.node.startswith(f"{loop.node}/body/") and "/then/" in p.node for p in body_rows)


def _early_exit_loop() -> bytes:
    """while (i < 20 && sum(v) < limit): v += X; the body's condition (from outer tensors) decides the length."""
    body = oh.make_graph(
        [
            oh.make_node("Add", ["v", "X"], ["v2"]),
            oh.make_node("ReduceSum", ["v2"], ["total"], keepdims=0),
            oh.make_node("Less", ["total", "limit"], ["c2"]),
            oh.make_node("Cast", ["i"], ["fi"], to=F),
        ],
        "body",
        [
            oh.make_tensor_value_info("i", I64, []),
            oh.make_tensor_value_info("c", B, []),
            oh.make_tensor_value_info("v", F, [2]),
        ],
        [
            oh.make_tensor_value_info("c2", B, []),
            oh.make_tensor_value_info("v2", F, [2]),
            oh.make_tensor_value_info("fi", F, []),
        ],
    )
    return _model(
        [
            oh.make_node("Constant", [], ["M"], value=oh.make_tensor("m", I64, [], [20])),
            oh.make_node("Constant", [], ["go"], value=oh.make_tensor("g", B, [], [True])),
            oh.make_node("Constant", [], ["limit"], value=oh.make_tensor("l", F, [], [10.0])),
            oh.make_node("Constant", [], ["X"], value=oh.make_tensor("x", F, [2], [1.0, 1.5])),
            oh.make_node("Loop", ["M", "go", "V"], ["final", "steps"], body=body),
        ],
        [oh.make_tensor_value_info("V", F, [2])],
        [oh.make_tensor_value_info("final", F, [2]), oh.make_tensor_value_info("steps", F, [None])],
        16,
    )


def test_loop_condition_ends_it_early(env: ortgpu_core.Env) -> None:
    final, steps = _compare(_early_exit_loop(), env, {"V": np.zeros(2, np.float32)})
    assert steps.shape == (4,)


def test_loop_trip_count_computed_on_the_device_is_refused(env: ortgpu_core.Env) -> None:
    """M from a tensor too big to fold when planning (a 160 MB Expand of the input): the scan output's length is
    only known when the model runs, so planning refuses (nothing big is allocated)."""
    body = oh.make_graph(
        [oh.make_node("Identity", ["c"], ["c2"]), oh.make_node("Cast", ["i"], ["fi"], to=F)],
        "body",
        [oh.make_tensor_value_info("i", I64, []), oh.make_tensor_value_info("c", B, [])],
        [oh.make_tensor_value_info("c2", B, []), oh.make_tensor_value_info("fi", F, [])],
    )
    model = _model(
        [
            oh.make_node("Constant", [], ["big"], value=oh.make_tensor("b", I64, [2], [5000, 4000])),
            oh.make_node("Expand", ["N", "big"], ["wide"]),
            oh.make_node("ReduceMax", ["wide"], ["M"], keepdims=0),
            oh.make_node("Loop", ["M", ""], ["steps"], body=body),
        ],
        [oh.make_tensor_value_info("N", I64, [])],
        [oh.make_tensor_value_info("steps", F, [None])],
        13,
    )
    with ortgpu.InferenceSession(model, env=env) as session:
        with pytest.raises(ModelError, match="depend on the value of tensor 'M'"):
            session.run(None, {"N": np.array(3, np.int64)})


def _if_model() -> bytes:
    then_g = oh.make_graph(
        [oh.make_node("Add", ["X", "W"], ["t"])], "then", [], [oh.make_tensor_value_info("t", F, [2, 3])]
    )
    else_g = oh.make_graph(
        [oh.make_node("Transpose", ["X"], ["e"], perm=[1, 0])],
        "else",
        [],
        [oh.make_tensor_value_info("e", F, [None, None])],
    )
    weight = oh.make_tensor("W", F, [3], [1.0, 2.0, 3.0])
    return _model(
        [oh.make_node("If", ["cond"], ["out"], then_branch=then_g, else_branch=else_g)],
        [oh.make_tensor_value_info("cond", B, []), oh.make_tensor_value_info("X", F, [2, 3])],
        [oh.make_tensor_value_info("out", F, [None, None])],
        11,
        (weight,),
    )


def test_if_branches_of_different_shapes(env: ortgpu_core.Env) -> None:
    """The branch (and so the output shape) follows the condition's value; outer initializer read."""
    model = _if_model()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert _compare(model, env, {"cond": np.array(True), "X": x})[0].shape == (2, 3)
    assert _compare(model, env, {"cond": np.array(False), "X": x})[0].shape == (3, 2)


def test_capture_refuses_naming_the_control_flow_node(env: ortgpu_core.Env) -> None:
    with ortgpu.InferenceSession(_early_exit_loop(), env=env, graph_capture=True) as session:
        binding = session.io_binding()
        v = session.allocator.from_numpy(np.zeros(2, np.float32))
        final = session.allocator.empty((2,), "float32")
        steps = session.allocator.empty((4,), "float32")
        binding.bind_input("V", v)
        binding.bind_output("final", final)
        binding.bind_output("steps", steps)
        with pytest.raises(CaptureStateError, match="Loop_4.*run on the CPU"):
            session.capture(binding, graph_id=0)
        for value in (v, final, steps):
            value.release()


def _scan9(opset: int, in_axis: int, in_dir: int, out_axis: int, out_dir: int) -> bytes:
    """A running sum over axis ``in_axis`` of X (plus an outer bias), states and per-step outputs."""
    body = oh.make_graph(
        [
            oh.make_node("Add", ["acc", "x"], ["acc2"]),
            oh.make_node("Mul", ["acc2", "bias"], ["y"]),
        ],
        "body",
        [oh.make_tensor_value_info("acc", F, [4]), oh.make_tensor_value_info("x", F, [4])],
        [oh.make_tensor_value_info("acc2", F, [4]), oh.make_tensor_value_info("y", F, [4])],
    )
    x_shape = [5, 4] if in_axis in (0, -2) else [4, 5]
    return _model(
        [
            oh.make_node(
                "Scan",
                ["S", "X"],
                ["final", "ys"],
                body=body,
                num_scan_inputs=1,
                scan_input_axes=[in_axis],
                scan_input_directions=[in_dir],
                scan_output_axes=[out_axis],
                scan_output_directions=[out_dir],
            )
        ],
        [
            oh.make_tensor_value_info("S", F, [4]),
            oh.make_tensor_value_info("X", F, x_shape),
            oh.make_tensor_value_info("bias", F, [4]),
        ],
        [oh.make_tensor_value_info("final", F, [4]), oh.make_tensor_value_info("ys", F, [None, None])],
        opset,
    )


@pytest.mark.parametrize(
    ("opset", "in_axis", "in_dir", "out_axis", "out_dir"),
    [(9, 0, 0, 0, 0), (9, 1, 1, 1, 0), (16, -1, 0, -1, 1), (16, 0, 1, 0, 1)],
)
def test_scan9_axes_and_directions(
    env: ortgpu_core.Env, opset: int, in_axis: int, in_dir: int, out_axis: int, out_dir: int
) -> None:
    model = _scan9(opset, in_axis, in_dir, out_axis, out_dir)
    rng = np.random.default_rng(1)
    x_shape = (5, 4) if in_axis in (0, -2) else (4, 5)
    feeds = {
        "S": rng.standard_normal(4).astype(np.float32),
        "X": rng.standard_normal(x_shape).astype(np.float32),
        "bias": rng.standard_normal(4).astype(np.float32),
    }
    _compare(model, env, feeds)


def test_scan8_batch_sequence_lens_and_reverse(env: ortgpu_core.Env) -> None:
    body = oh.make_graph(
        [oh.make_node("Add", ["acc", "x"], ["acc2"]), oh.make_node("Identity", ["acc2"], ["y"])],
        "body",
        [oh.make_tensor_value_info("acc", F, [2]), oh.make_tensor_value_info("x", F, [2])],
        [oh.make_tensor_value_info("acc2", F, [2]), oh.make_tensor_value_info("y", F, [2])],
    )
    rng = np.random.default_rng(2)
    for direction in (0, 1):
        model = _model(
            [
                oh.make_node(
                    "Scan", ["lens", "S", "X"], ["final", "ys"], body=body, num_scan_inputs=1, directions=[direction]
                )
            ],
            [
                oh.make_tensor_value_info("lens", I64, [3]),
                oh.make_tensor_value_info("S", F, [3, 2]),
                oh.make_tensor_value_info("X", F, [3, 4, 2]),
            ],
            [oh.make_tensor_value_info("final", F, [3, 2]), oh.make_tensor_value_info("ys", F, [3, 4, 2])],
            8,
        )
        feeds: dict[str, np.ndarray] = {
            "lens": np.array([4, 2, 1], np.int64),
            "S": rng.standard_normal((3, 2)).astype(np.float32),
            "X": rng.standard_normal((3, 4, 2)).astype(np.float32),
        }
        _compare(model, env, feeds)


def test_subgraph_nodes_count_against_the_node_limit() -> None:
    model = _loop_with_if()
    load_model(model, max_nodes=10)  # 2 + 6 in the body + 2 in the branches
    with pytest.raises(ModelError, match="nodes, more than the limit of 9"):
        load_model(model, max_nodes=9)


def test_other_subgraph_attributes_and_unsupported_body_ops_are_refused() -> None:
    body = oh.make_graph([oh.make_node("Identity", ["a"], ["b"])], "b", [], [oh.make_tensor_value_info("b", F, [1])])
    graph = oh.make_graph(
        [oh.make_node("Custom", ["a"], ["out"], domain="x.y", body=body)],
        "g",
        [oh.make_tensor_value_info("a", F, [1])],
        [oh.make_tensor_value_info("out", F, [1])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("x.y", 1)])
    with pytest.raises(UnsupportedOpError, match="subgraph attribute 'body'"):
        load_model(model.SerializeToString())
    then_g = oh.make_graph(
        [oh.make_node("NoSuchOp", ["a"], ["t"], domain="x.y")], "t", [], [oh.make_tensor_value_info("t", F, [1])]
    )
    graph = oh.make_graph(
        [oh.make_node("If", ["c"], ["out"], then_branch=then_g, else_branch=then_g)],
        "g",
        [oh.make_tensor_value_info("c", B, []), oh.make_tensor_value_info("a", F, [1])],
        [oh.make_tensor_value_info("out", F, [1])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("x.y", 1)])
    with pytest.raises(UnsupportedOpError, match="NoSuchOp"):
        load_model(model.SerializeToString())


@pytest.mark.parametrize("given", [("M", ""), ("", "c"), ("M", "c")], ids=["M-only", "cond-only", "both"])
def test_loop_trip_count_and_condition_variants(env: ortgpu_core.Env, given: tuple[str, str]) -> None:
    """The body's condition output (false after two steps) ends the loop even without a ``cond`` input, as in
    onnxruntime; an initial false ``cond`` runs no iteration (empty scan output shaped from the body)."""
    body = oh.make_graph(
        [
            oh.make_node("Constant", [], ["one"], value=oh.make_tensor("o", I64, [], [1])),
            oh.make_node("Less", ["i", "one"], ["again"]),
            oh.make_node("Add", ["v", "w"], ["v2"]),
        ],
        "body",
        [
            oh.make_tensor_value_info("i", I64, []),
            oh.make_tensor_value_info("c", B, []),
            oh.make_tensor_value_info("v", F, [2]),
        ],
        [
            oh.make_tensor_value_info("again", B, []),
            oh.make_tensor_value_info("v2", F, [2]),
            oh.make_tensor_value_info("v2", F, [2]),
        ],
    )
    model = _model(
        [oh.make_node("Loop", [*given, "V"], ["out", "scanned"], body=body)],
        [
            oh.make_tensor_value_info("M", I64, []),
            oh.make_tensor_value_info("c", B, []),
            oh.make_tensor_value_info("V", F, [2]),
            oh.make_tensor_value_info("w", F, [2]),
        ],
        [oh.make_tensor_value_info("out", F, [2]), oh.make_tensor_value_info("scanned", F, [None, 2])],
        13,
    )
    v, w = np.array([1.0, 2.0], np.float32), np.array([0.5, -1.0], np.float32)
    for trips, cond in ((5, True), (1, True), (5, False), (0, True)):
        feeds: dict[str, np.ndarray] = {"M": np.array(trips, np.int64), "c": np.array(cond), "V": v, "w": w}
        _compare(model, env, feeds)


def test_loop_nested_in_scan_reads_two_scopes_up(env: ortgpu_core.Env) -> None:
    """A Scan body holding a Loop whose body reads ``bias`` (main graph) and ``x`` (the Scan body): the outer
    names of nested subgraphs reach both control-flow nodes as extra inputs."""
    inner = oh.make_graph(
        [
            oh.make_node("Add", ["acc", "bias"], ["plus"]),
            oh.make_node("Mul", ["plus", "x"], ["acc2"]),
            oh.make_node("Identity", ["c"], ["c2"]),
        ],
        "inner",
        [
            oh.make_tensor_value_info("i", I64, []),
            oh.make_tensor_value_info("c", B, []),
            oh.make_tensor_value_info("acc", F, [3]),
        ],
        [oh.make_tensor_value_info("c2", B, []), oh.make_tensor_value_info("acc2", F, [3])],
    )
    body = oh.make_graph(
        [
            oh.make_node("Constant", [], ["yes"], value=oh.make_tensor("y", B, [], [True])),
            oh.make_node("Loop", ["K", "yes", "state"], ["state2"], body=inner),
            oh.make_node("ReduceMax", ["state2"], ["peak"], keepdims=1),
        ],
        "body",
        [oh.make_tensor_value_info("state", F, [3]), oh.make_tensor_value_info("x", F, [3])],
        [oh.make_tensor_value_info("state2", F, [3]), oh.make_tensor_value_info("peak", F, [1])],
    )
    model = _model(
        [oh.make_node("Scan", ["S", "X"], ["final", "peaks"], body=body, num_scan_inputs=1)],
        [
            oh.make_tensor_value_info("S", F, [3]),
            oh.make_tensor_value_info("X", F, [4, 3]),
            oh.make_tensor_value_info("K", I64, []),
            oh.make_tensor_value_info("bias", F, [3]),
        ],
        [oh.make_tensor_value_info("final", F, [3]), oh.make_tensor_value_info("peaks", F, [4, 1])],
        17,
    )
    rng = np.random.default_rng(3)
    feeds: dict[str, np.ndarray] = {
        "S": rng.standard_normal(3).astype(np.float32),
        "X": (rng.standard_normal((4, 3)) * 0.5).astype(np.float32),
        "K": np.array(3, np.int64),
        "bias": rng.standard_normal(3).astype(np.float32),
    }
    _compare(model, env, feeds)
    with ortgpu.InferenceSession(model, env=env) as session:
        (scan,) = [n for n in session._runner.model.nodes if n.op_type == "Scan"]
        assert scan.inputs == ("S", "X", "K", "bias")


def test_runaway_constant_loop_is_stopped_while_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    """All inputs constant: the Loop is folded at load; a trip count of 2**63 - 1 with a condition that stays
    true stops at the iteration limit with a typed error instead of hanging the load."""
    from ortgpu.ops.ai_onnx import control_flow

    monkeypatch.setattr(control_flow, "MAX_LOOP_ITERATIONS", 50)
    body = oh.make_graph(
        [oh.make_node("Identity", ["c"], ["c2"]), oh.make_node("Cast", ["i"], ["fi"], to=F)],
        "body",
        [oh.make_tensor_value_info("i", I64, []), oh.make_tensor_value_info("c", B, [])],
        [oh.make_tensor_value_info("c2", B, []), oh.make_tensor_value_info("fi", F, [])],
    )
    model = _model(
        [
            oh.make_node("Constant", [], ["M"], value=oh.make_tensor("m", I64, [], [2**63 - 1])),
            oh.make_node("Constant", [], ["go"], value=oh.make_tensor("g", B, [], [True])),
            oh.make_node("Loop", ["M", "go"], ["steps"], body=body),
        ],
        [],
        [oh.make_tensor_value_info("steps", F, [None])],
        13,
    )
    with pytest.raises(ModelError, match="more than 50 iterations"):
        load_model(model)


def test_scan_body_shapes_deciding_values_are_refused_not_guessed(env: ortgpu_core.Env) -> None:
    """onnx cannot infer this Scan's outputs (its body reads an outer tensor), so the planner runs it on zeros;
    the body's Reshape takes its shape from the fed ``shp``, whose zeros cannot stand for it: a typed refusal
    naming the body, never a guessed shape."""
    body = oh.make_graph(
        [oh.make_node("Add", ["s", "x"], ["s2"]), oh.make_node("Reshape", ["x", "shp"], ["y"])],
        "body",
        [oh.make_tensor_value_info("s", F, [4]), oh.make_tensor_value_info("x", F, [4])],
        [oh.make_tensor_value_info("s2", F, [4]), oh.make_tensor_value_info("y", F, [None, None])],
    )
    model = _model(
        [oh.make_node("Scan", ["S", "X"], ["f", "ys"], body=body, num_scan_inputs=1)],
        [
            oh.make_tensor_value_info("S", F, [4]),
            oh.make_tensor_value_info("X", F, [3, 4]),
            oh.make_tensor_value_info("shp", I64, [2]),
        ],
        [oh.make_tensor_value_info("f", F, [4]), oh.make_tensor_value_info("ys", F, [None, None, None])],
        17,
    )
    feeds: dict[str, np.ndarray] = {
        "S": np.zeros(4, np.float32),
        "X": np.ones((3, 4), np.float32),
        "shp": np.array([2, 2], np.int64),
    }
    with ortgpu.InferenceSession(model, env=env) as session:
        with pytest.raises(ModelError, match="in the body of Scan node 'Scan_0'"):
            session.run(None, feeds)


def _nested_loops(outer: int, inner: int) -> bytes:
    """``for i < outer: for j < inner: v = v + 1``: both trip counts known, far too many nodes to unroll."""
    inner_body = oh.make_graph(
        [oh.make_node("Add", ["w_in", "one"], ["w_out"]), oh.make_node("Identity", ["c2"], ["c2_out"])],
        "inner",
        [
            oh.make_tensor_value_info("j", I64, []),
            oh.make_tensor_value_info("c2", B, []),
            oh.make_tensor_value_info("w_in", F, [2]),
        ],
        [oh.make_tensor_value_info("c2_out", B, []), oh.make_tensor_value_info("w_out", F, [2])],
    )
    outer_body = oh.make_graph(
        [
            oh.make_node("Loop", ["n_inner", "", "v_in"], ["v_out"], body=inner_body),
            oh.make_node("Identity", ["c1"], ["c1_out"]),
        ],
        "outer",
        [
            oh.make_tensor_value_info("i", I64, []),
            oh.make_tensor_value_info("c1", B, []),
            oh.make_tensor_value_info("v_in", F, [2]),
        ],
        [oh.make_tensor_value_info("c1_out", B, []), oh.make_tensor_value_info("v_out", F, [2])],
    )
    inits = (
        oh.make_tensor("n_outer", I64, [], [outer]),
        oh.make_tensor("n_inner", I64, [], [inner]),
        oh.make_tensor("one", F, [], [1.0]),
    )
    return _model(
        [oh.make_node("Loop", ["n_outer", "", "v0"], ["v"], body=outer_body)],
        [oh.make_tensor_value_info("v0", F, [2])],
        [oh.make_tensor_value_info("v", F, [2])],
        17,
        inits,
    )


def test_expansion_is_bounded_over_nested_loops(env: ortgpu_core.Env) -> None:
    """1000 x 1000 iterations would be two million nodes: planning gives up within one budget (the inner attempts
    count) and the loop runs whole; a small nest unrolls onto the device."""
    import time

    from ortgpu.loader._expand_control_flow import MAX_EXPANDED_NODES

    with ortgpu.InferenceSession(_nested_loops(1000, 1000), env=env) as session:
        start = time.perf_counter()
        rows = session.get_node_placement()
        planning = time.perf_counter() - start
        outer = next(p for p in rows if p.node == "Loop_0")
        assert outer.placement == "cpu" and "MAX_EXPANDED_NODES" in outer.reason, rows
        assert planning < 120, f"planning took {planning:.1f} s"  # unbounded attempts would take hours
    assert MAX_EXPANDED_NODES == 4096
    with ortgpu.InferenceSession(_nested_loops(3, 4), env=env) as session:
        rows = session.get_node_placement()
        assert all(p.placement == "webgpu" for p in rows), rows
        assert any(p.node.startswith("Loop_0/iter2/Loop_0/iter3/") for p in rows), [p.node for p in rows]
        v0 = np.array([0.5, -2.0], np.float32)
        np.testing.assert_array_equal(session.run(None, {"v0": v0})[0], v0 + 12)
