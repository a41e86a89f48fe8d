"""Capturing models with control flow (issue 13), on both backends.

What the plan knows, it expands (``ortgpu.loader._expand_control_flow``): an ``If`` whose condition is a constant or a
value-deciding input, a ``Loop`` with a known trip count, a ``Scan``; those run on the device and capture like any
node.  A graph captured for the value of an input that decided its work (an ``If`` on the sample rate) re-reads that
input before every replay and refuses with ``CaptureStateError`` when it changed.  Control flow that depends on
data computed on the device runs whole on the CPU, and capture is refused naming the node.

The property test alternates captured replays, fresh runs and input changes (data, the ``If`` condition,
``sequence_lens``, the start token) on the models of tests/test_recurrent_models.py and two small ones: every replay
equals a fresh uncaptured run on the current inputs, or is refused with the documented error and changes nothing.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

import ortgpu
from bench.recurrent_models import greedy_decoder, gru_encoder, lstm_recognizer, streaming_vad

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _model(nodes: list[onnx.NodeProto], inputs: list[Any], outputs: list[Any], inits: list[Any] = ()) -> bytes:  # type: ignore[assignment]
    graph = oh.make_graph(nodes, "control", inputs, outputs, list(inits))
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 9
    return bytes(model.SerializeToString())


def gated_model() -> bytes:
    """``y = If(sr == 16000, x * 2 + 1, relu(x) - 3)``: both branches read the outer ``x`` and are device work."""
    then_g = oh.make_graph(
        [oh.make_node("Mul", ["x", "two"], ["t1"]), oh.make_node("Add", ["t1", "one"], ["t"])],
        "then",
        [],
        [oh.make_tensor_value_info("t", F, [16])],
    )
    else_g = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["e1"]), oh.make_node("Sub", ["e1", "three"], ["e"])],
        "else",
        [],
        [oh.make_tensor_value_info("e", F, [16])],
    )
    inits = [
        numpy_helper.from_array(np.array(16000, np.int64), "rate"),
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(3.0, np.float32), "three"),
    ]
    return _model(
        [
            oh.make_node("Equal", ["sr", "rate"], ["wide"]),
            oh.make_node("If", ["wide"], ["y"], then_branch=then_g, else_branch=else_g),
        ],
        [oh.make_tensor_value_info("x", F, [16]), oh.make_tensor_value_info("sr", I64, [])],
        [oh.make_tensor_value_info("y", F, [16])],
        inits,
    )


def scan_model() -> bytes:
    """A running sum over the rows of ``x [5, 4]`` with a Scan (state [4], scan output the partial sums), reversed."""
    body = oh.make_graph(
        [oh.make_node("Add", ["acc_in", "row"], ["acc_out"]), oh.make_node("Identity", ["acc_out"], ["partial"])],
        "body",
        [oh.make_tensor_value_info("acc_in", F, [4]), oh.make_tensor_value_info("row", F, [4])],
        [oh.make_tensor_value_info("acc_out", F, [4]), oh.make_tensor_value_info("partial", F, [4])],
    )
    return _model(
        [
            oh.make_node(
                "Scan",
                ["init", "x"],
                ["total", "partials"],
                body=body,
                num_scan_inputs=1,
                scan_input_directions=[1],
                scan_output_axes=[1],
            )
        ],
        [oh.make_tensor_value_info("init", F, [4]), oh.make_tensor_value_info("x", F, [5, 4])],
        [oh.make_tensor_value_info("total", F, [4]), oh.make_tensor_value_info("partials", F, [4, 5])],
    )


def early_exit_loop() -> bytes:
    """``while i < 20 and sum(v) < 10: v += x``: the body's condition comes from data computed on the device."""
    body = oh.make_graph(
        [
            oh.make_node("Add", ["v_in", "x"], ["v_out"]),
            oh.make_node("ReduceSum", ["v_out"], ["total"], keepdims=0),
            oh.make_node("Less", ["total", "limit"], ["go"]),
        ],
        "body",
        [
            oh.make_tensor_value_info("i", I64, []),
            oh.make_tensor_value_info("c", B, []),
            oh.make_tensor_value_info("v_in", F, [3]),
        ],
        [oh.make_tensor_value_info("go", B, []), oh.make_tensor_value_info("v_out", F, [3])],
    )
    inits = [
        numpy_helper.from_array(np.array(20, np.int64), "M"),
        numpy_helper.from_array(np.array(True), "yes"),
        numpy_helper.from_array(np.array(10.0, np.float32), "limit"),
    ]
    return _model(
        [oh.make_node("Loop", ["M", "yes", "v0"], ["v"], body=body)],
        [oh.make_tensor_value_info("v0", F, [3]), oh.make_tensor_value_info("x", F, [3])],
        [oh.make_tensor_value_info("v", F, [3])],
        inits,
    )


# -- the models, their inputs, and which inputs decide the recorded work -----------------------------------------


def _normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


Feeds = Callable[[np.random.Generator], dict[str, np.ndarray]]

#: name -> (model builder, data inputs, control inputs (changed by the "control" step), guarded inputs)
CASES: dict[str, tuple[Callable[[], bytes], Feeds, Feeds, frozenset[str]]] = {
    "gated": (
        gated_model,
        lambda rng: {"x": _normal(rng, 16)},
        lambda rng: {"sr": np.array(rng.choice([16000, 8000]), np.int64)},
        frozenset({"sr"}),
    ),
    "scan": (scan_model, lambda rng: {"init": _normal(rng, 4), "x": _normal(rng, 5, 4)}, lambda rng: {}, frozenset()),
    "streaming_vad": (
        streaming_vad,
        lambda rng: {"audio": _normal(rng, 64), "h": _normal(rng, 1, 1, 8), "c": _normal(rng, 1, 1, 8)},
        lambda rng: {"sr": np.array(rng.choice([16000, 8000]), np.int64)},
        frozenset({"sr"}),
    ),
    "greedy_decoder": (
        greedy_decoder,
        lambda rng: {"state": _normal(rng, 1, 8)},
        lambda rng: {"start": np.array([rng.integers(0, 11)], np.int64)},
        frozenset(),
    ),
    "gru_encoder": (
        gru_encoder,
        lambda rng: {"x": _normal(rng, 7, 3, 6), "h0": _normal(rng, 1, 3, 10)},
        lambda rng: {"lengths": rng.integers(0, 8, size=3).astype(np.int32)},
        frozenset(),
    ),
    "lstm_recognizer": (lstm_recognizer, lambda rng: {"image": _normal(rng, 1, 1, 8, 24)}, lambda rng: {}, frozenset()),
}

STEPS = st.lists(
    st.sampled_from(["data", "control", "replay", "replay_and_read", "run", "verify"]), min_size=2, max_size=8
)


def _alternate(env: ortgpu.Env, name: str, steps: list[str], seed: int, on_host: bool) -> None:
    """``on_host``: the guarded inputs are bound as host arrays (``bind_cpu_input``) and changed in place."""
    build, data, control, guarded = CASES[name]
    rng = np.random.default_rng(seed)
    feeds = {**data(rng), **control(rng)}
    with ortgpu.InferenceSession(build(), env=env, graph_capture=True) as session:
        assert set(session.value_deciding_inputs) == guarded
        fresh = session.run(None, feeds)
        host = {n: feeds[n].copy() for n in guarded} if on_host else {}
        values = {n: session.allocator.from_numpy(a) for n, a in feeds.items() if n not in host}
        outputs = {n: session.allocator.empty(a.shape, a.dtype) for n, a in zip(session.output_names, fresh)}
        binding = session.io_binding()
        for n, v in values.items():
            binding.bind_input(n, v)
        for n, a in host.items():
            binding.bind_cpu_input(n, a)
        for n, v in outputs.items():
            binding.bind_output(n, v)
        graph: ortgpu.CapturedGraph | None = None
        try:
            try:
                graph = session.capture(binding)
            except ortgpu.CaptureStateError as error:
                # Documented refusal: only when some node runs on the CPU, and the message says so.
                rows = session.get_node_placement(
                    {n: a.shape for n, a in feeds.items()}, input_values={n: feeds[n] for n in guarded}
                )
                assert "run on the CPU" in str(error) and any(not row.capturable for row in rows), (error, rows)
                return
            captured = {n: feeds[n].copy() for n in guarded}
            for step in steps:
                if step in ("data", "control"):
                    change = data(rng) if step == "data" else control(rng)
                    for n, a in change.items():
                        if n in host:
                            np.copyto(host[n], a)  # the bound array itself changes
                        else:
                            values[n].update_inplace(a)
                    feeds.update(change)
                    continue
                if step == "run":
                    session.run(None, feeds)  # a fresh run between replays changes nothing the graph holds
                    continue
                before = [v.to_numpy() for v in outputs.values()]
                stale = any(not np.array_equal(feeds[n], captured[n]) for n in guarded)
                try:
                    if step == "replay":
                        graph.replay()
                        got = [v.to_numpy() for v in outputs.values()]
                    elif step == "replay_and_read":
                        got = graph.replay_and_read()
                    else:
                        graph.replay(verify=True)
                        got = [v.to_numpy() for v in outputs.values()]
                except ortgpu.CaptureStateError as error:
                    assert stale, f"{name}: refused without a changed guarded input: {error}"
                    assert "was captured for input" in str(error)
                    # Refused before anything was submitted: the outputs are what they were.
                    for old, value in zip(before, outputs.values()):
                        np.testing.assert_array_equal(value.to_numpy(), old)
                    continue
                assert not stale, f"{name}: a replay followed a branch decided by a value that has changed"
                want = session.run(None, feeds)
                for expected, actual in zip(want, got):
                    np.testing.assert_array_equal(actual, expected, err_msg=f"{name}: replay != fresh run")
        finally:
            if graph is not None:
                graph.release()
            for value in list(values.values()) + list(outputs.values()):
                value.release()


@pytest.mark.parametrize("name", sorted(CASES))
def test_replays_equal_fresh_runs_or_are_refused(env: ortgpu.Env, backend_name: str, name: str) -> None:
    examples = 12 if backend_name == "fake" else 4

    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(steps=STEPS, seed=st.integers(0, 2**16), on_host=st.booleans())
    def alternate(steps: list[str], seed: int, on_host: bool) -> None:
        _alternate(env, name, steps, seed, on_host)

    alternate()


def test_expanded_control_flow_captures(env: ortgpu.Env) -> None:
    """Constant-condition If, unrolled Loop and Scan run wholly on the device: capture succeeds for them."""
    for build, guarded in ((gated_model, {"sr": np.array(8000, np.int64)}), (scan_model, {}), (greedy_decoder, {})):
        with ortgpu.InferenceSession(build(), env=env, graph_capture=True) as session:
            rows = session.get_node_placement(input_values=guarded)
            assert all(row.placement == "webgpu" for row in rows), rows
            assert any("inlined" in row.reason or "unrolled" in row.reason for row in rows), rows


def test_guard_refuses_a_changed_condition_and_a_new_graph_follows_it(env: ortgpu.Env) -> None:
    rng = np.random.default_rng(5)
    x = _normal(rng, 16)
    with ortgpu.InferenceSession(gated_model(), env=env, graph_capture=True) as session:
        xv = session.allocator.from_numpy(x)
        sr = session.allocator.from_numpy(np.array(16000, np.int64))
        y = session.allocator.empty((16,), "float32")
        binding = session.io_binding()
        binding.bind_input("x", xv)
        binding.bind_input("sr", sr)
        binding.bind_output("y", y)
        graph = session.capture(binding)
        np.testing.assert_allclose(graph.replay_and_read()[0], x * 2 + 1, rtol=1e-6)
        sr.update_inplace(np.array(8000, np.int64))
        y.update_inplace(np.full(16, 7.0, np.float32))
        with pytest.raises(ortgpu.CaptureStateError, match=r"captured for input 'sr' = 16000.*now holds 8000"):
            graph.replay()
        with pytest.raises(ortgpu.CaptureStateError, match="captured for input 'sr'"):
            graph.replay_and_read()
        np.testing.assert_array_equal(y.to_numpy(), np.full(16, 7.0, np.float32))  # nothing ran
        binding = graph.release()
        assert binding is not None
        other = session.capture(binding, graph_id=1)  # captured for 8000 now: the else branch
        np.testing.assert_allclose(other.replay_and_read()[0], np.maximum(x, 0) - 3, rtol=1e-6)
        sr.update_inplace(np.array(16000, np.int64))
        with pytest.raises(ortgpu.CaptureStateError):
            other.replay()
        other.release()
        for value in (xv, sr, y):
            value.release()


def test_data_dependent_loop_is_refused_naming_the_node(env: ortgpu.Env) -> None:
    with ortgpu.InferenceSession(early_exit_loop(), env=env, graph_capture=True) as session:
        loop = next(row for row in session.get_node_placement() if row.op_type == "Loop")
        assert loop.placement == "cpu" and not loop.capturable and "depends on data" in loop.reason
        values = [session.allocator.from_numpy(np.ones(3, np.float32)) for _ in range(2)]
        out = session.allocator.empty((3,), "float32")
        binding = session.io_binding()
        binding.bind_input("v0", values[0])
        binding.bind_input("x", values[1])
        binding.bind_output("v", out)
        with pytest.raises(ortgpu.CaptureStateError, match=f"{loop.node}.*run on the CPU"):
            session.capture(binding)
        # Uncaptured, it runs: v grows by 1 per step from 1 until its sum reaches 10.
        session.run_with_iobinding(binding, ortgpu.RunOptions(gpu_graph_id=-1))
        np.testing.assert_array_equal(out.to_numpy(), np.full(3, 4.0, np.float32))
        for value in [*values, out]:
            value.release()


def test_large_value_deciding_inputs_are_not_guarded(env: ortgpu.Env) -> None:
    """An If whose condition comes from a big input (here 2048 floats) would re-read it at every replay: refused."""
    then_g = oh.make_graph([oh.make_node("Neg", ["x"], ["t"])], "then", [], [oh.make_tensor_value_info("t", F, [2048])])
    else_g = oh.make_graph([oh.make_node("Abs", ["x"], ["e"])], "else", [], [oh.make_tensor_value_info("e", F, [2048])])
    model = _model(
        [
            oh.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
            oh.make_node("Greater", ["s", "zero"], ["positive"]),
            oh.make_node("If", ["positive"], ["y"], then_branch=then_g, else_branch=else_g),
        ],
        [oh.make_tensor_value_info("x", F, [2048])],
        [oh.make_tensor_value_info("y", F, [2048])],
        [numpy_helper.from_array(np.array(0.0, np.float32), "zero")],
    )
    with ortgpu.InferenceSession(model, env=env, graph_capture=True) as session:
        x = session.allocator.from_numpy(np.ones(2048, np.float32))
        y = session.allocator.empty((2048,), "float32")
        binding = session.io_binding()
        binding.bind_input("x", x)
        binding.bind_output("y", y)
        with pytest.raises(ortgpu.CaptureStateError, match=r"\['x'\].*8192 bytes.*up to 4096"):
            session.capture(binding)
        session.run_with_iobinding(binding, ortgpu.RunOptions(gpu_graph_id=-1))
        np.testing.assert_array_equal(y.to_numpy(), -np.ones(2048, np.float32))
        x.release()
        y.release()


def test_host_bound_condition_is_checked_without_a_device_read(env: ortgpu.Env) -> None:
    """The sample rate bound as a host array: the plan folds it, capture keeps it on the host, and each replay looks
    at the bound array itself (changed in place: refused; restored: replays again)."""
    rng = np.random.default_rng(9)
    x = _normal(rng, 16)
    with ortgpu.InferenceSession(gated_model(), env=env, graph_capture=True) as session:
        assert session.value_deciding_inputs == ["sr"]
        xv = session.allocator.from_numpy(x)
        y = session.allocator.empty((16,), "float32")
        rate = np.array(8000, np.int64)
        binding = session.io_binding()
        binding.bind_input("x", xv)
        binding.bind_cpu_input("sr", rate)
        binding.bind_output("y", y)
        with session.capture(binding) as graph:
            np.testing.assert_allclose(graph.replay_and_read()[0], np.maximum(x, 0) - 3, rtol=1e-6)
            rate[...] = 16000
            with pytest.raises(ortgpu.CaptureStateError, match="now holds 16000"):
                graph.replay()
            rate[...] = 8000
            xv.update_inplace(-x)
            graph.replay(verify=True)
            np.testing.assert_allclose(y.to_numpy(), np.maximum(-x, 0) - 3, rtol=1e-6)
        xv.release()
        y.release()


def test_host_bound_input_read_by_device_work_is_refused(env: ortgpu.Env) -> None:
    """A value-deciding input is folded into the plan wherever a node reads it; one that is also a graph output is
    copied from its buffer by the device, so it cannot stay on the host in a captured graph."""
    model = _model(
        [oh.make_node("Reshape", ["x", "shape"], ["r"])],
        [oh.make_tensor_value_info("x", F, [6]), oh.make_tensor_value_info("shape", I64, [2])],
        [oh.make_tensor_value_info("r", F, None), oh.make_tensor_value_info("shape", I64, [2])],
    )
    with ortgpu.InferenceSession(model, env=env, graph_capture=True) as session:
        assert session.value_deciding_inputs == ["shape"]
        shape = np.array([2, 3], np.int64)
        xv = session.allocator.from_numpy(np.arange(6, dtype=np.float32))
        r, echo = session.allocator.empty((2, 3), "float32"), session.allocator.empty((2,), "int64")
        binding = session.io_binding()
        binding.bind_input("x", xv)
        binding.bind_cpu_input("shape", shape)
        binding.bind_output("r", r)
        binding.bind_output("shape", echo)
        with pytest.raises(ortgpu.CaptureStateError, match=r"\['shape'\] bound on the host.*device work reads"):
            session.capture(binding)
        session.run_with_iobinding(binding, ortgpu.RunOptions(gpu_graph_id=-1))  # uncaptured: fine
        np.testing.assert_array_equal(echo.to_numpy(), shape)
        np.testing.assert_array_equal(r.to_numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))
        for value in (xv, r, echo):
            value.release()
