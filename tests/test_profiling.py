"""Per-session profiling (issue 15): ``InferenceSession(profile=True)``, ``session.profiling()``,
``session.end_profiling()`` -> a Chrome trace JSON file, on both backends.

The model is a small MLP (``models.mlp(layers=2, width=16)``: two planned steps, MatMul+Add+Relu and MatMul+Add).
Profiling is per session (onnxruntime's "C4" lesson): two sessions profiled concurrently from two threads each get
only their own events.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import models
import numpy as np
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

from ortgpu import Env, InferenceSession

WIDTH, BATCH = 16, 4
MODEL = models.mlp(layers=2, width=WIDTH, batch=BATCH).SerializeToString()
_ORT = onnxruntime.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
_rng = np.random.default_rng(15)


def image() -> np.ndarray:
    return _rng.standard_normal((BATCH, WIDTH)).astype(np.float32)


def assert_reference(got: np.ndarray, x: np.ndarray) -> None:
    np.testing.assert_allclose(got, np.asarray(_ORT.run(None, {"X": x})[0]), rtol=1e-5, atol=1e-5)


def load(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        trace: dict[str, Any] = json.load(handle)
    return trace


def complete(trace: dict[str, Any], cat: str | None = None) -> list[dict[str, Any]]:
    """The trace's complete ("X") events, of category ``cat`` if given."""
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and (cat is None or e["cat"] == cat)]


def step_names(sess: InferenceSession) -> list[str]:
    """The first node name of every planned step (what step events are named)."""
    plan = sess._runner.plan_for({"X": (BATCH, WIDTH)}, {"X": np.dtype(np.float32)})
    return [step.name for step in plan.steps]


def assert_nested(trace: dict[str, Any], outer_cat: str, per_outer: int) -> None:
    """Every ``outer_cat`` event holds exactly ``per_outer`` step events of its thread within its span."""
    outers = complete(trace, outer_cat)
    steps = [e for e in complete(trace) if e["cat"] not in ("run", "replay")]
    assert len(steps) == per_outer * len(outers)
    for outer in outers:
        inside = [
            e
            for e in steps
            if e["tid"] == outer["tid"]
            and e["ts"] >= outer["ts"] - 1e-3
            and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"] + 1e-3
        ]
        assert len(inside) == per_outer, (outer, inside)


def test_profiled_runs_write_a_chrome_trace(env: Env, tmp_path: Path) -> None:
    prefix = str(tmp_path / "prof")
    with InferenceSession(MODEL, env=env, profile=True, profile_file_prefix=prefix) as sess:
        assert sess.profiling_active and sess.get_profiling_start_time_ns() > 0
        xs = [image(), image()]
        for x in xs:
            assert_reference(sess.run(None, {"X": x})[0], x)
        path = sess.end_profiling()
        assert not sess.profiling_active
        assert os.path.dirname(path) == str(tmp_path)
        assert os.path.basename(path).startswith(f"prof_{sess.session_id}_") and path.endswith(".json")
        trace = load(path)
        runs = complete(trace, "run")
        assert len(runs) == 2
        names = step_names(sess)
        assert len(names) == 2
        steps = [e for e in complete(trace) if e["cat"] != "run"]
        assert [e["name"] for e in steps] == names * 2
        assert {e["cat"] for e in steps} == {"MatMul+Add+Relu", "MatMul+Add"}
        assert all(e["pid"] == sess.session_id for e in complete(trace))
        assert all(e["dur"] >= 0 and isinstance(e["ts"], float) for e in complete(trace))
        assert_nested(trace, "run", 2)
        assert trace["otherData"]["timing"] == "host"
        assert trace["otherData"]["session_id"] == sess.session_id
        assert trace["otherData"]["backend"] == env.backend_name
        meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
        assert any(e["name"] == "process_name" and e["pid"] == sess.session_id for e in meta)
        # After end_profiling runs record nothing, and a second end_profiling has nothing to write.
        sess.run(None, {"X": image()})
        assert sess.end_profiling() == ""


def test_profiling_context_and_bound_runs(env: Env, tmp_path: Path) -> None:
    with InferenceSession(MODEL, env=env, profile_file_prefix=str(tmp_path / "ctx")) as sess:
        assert not sess.profiling_active and sess.end_profiling() == ""
        sess.run(None, {"X": image()})  # not recorded
        with sess.profiling() as record:
            assert record.path is None and sess.profiling_active
            x = image()
            values = sess.run_with_ort_values(None, {"X": sess.allocator.from_numpy(x)})
            assert_reference(values[0].to_numpy(), x)
            binding = sess.io_binding()
            binding.bind_input("X", sess.allocator.from_numpy(x))
            y = sess.allocator.empty((BATCH, WIDTH), "float32")
            binding.bind_output("Y", y)
            sess.run_with_iobinding(binding)
            assert_reference(y.to_numpy(), x)
        assert record.path is not None and not sess.profiling_active
        trace = load(record.path)
        assert len(complete(trace, "run")) == 2
        assert_nested(trace, "run", 2)
        # A new profiling period starts a new record.
        sess.start_profiling()
        sess.run(None, {"X": image()})
        second = load(sess.end_profiling())
        assert len(complete(second, "run")) == 1


def test_profiled_replays(env: Env, tmp_path: Path) -> None:
    with InferenceSession(MODEL, env=env, graph_capture=True, profile_file_prefix=str(tmp_path / "g")) as sess:
        x = image()
        x_value = sess.allocator.from_numpy(x)
        y_value = sess.allocator.empty((BATCH, WIDTH), "float32")
        binding = sess.io_binding()
        binding.bind_input("X", x_value)
        binding.bind_output("Y", y_value)
        graph = sess.capture(binding, 0)
        try:
            sess.start_profiling()
            y_value.update_inplace(np.zeros((BATCH, WIDTH), np.float32))
            graph.replay()
            assert_reference(y_value.to_numpy(), x)
            x2 = image()
            x_value.update_inplace(x2)
            got = graph.replay_and_read()
            assert_reference(got[0], x2)
            trace = load(sess.end_profiling())
            replays = complete(trace, "replay")
            assert len(replays) == 2 and all(e["args"]["graph_id"] == 0 for e in replays)
            assert_nested(trace, "replay", 2)
            assert graph.replays == 2  # the capture run is not a replay
            graph.replay()  # profiling off again: the recorded list, nothing recorded
            assert_reference(y_value.to_numpy(), x2)
            assert graph.replays == 3 and sess.end_profiling() == ""
        finally:
            graph.release()


def test_concurrent_sessions_get_only_their_own_events(env: Env, tmp_path: Path) -> None:
    runs = 6
    sessions = [
        InferenceSession(MODEL, env=env, profile=True, profile_file_prefix=str(tmp_path / f"s{i}")) for i in range(2)
    ]
    quiet = InferenceSession(MODEL, env=env)  # unprofiled, running at the same time: it records nothing
    errors: list[BaseException] = []
    tids: dict[int, int] = {}
    barrier = threading.Barrier(3)

    def drive(sess: InferenceSession) -> None:
        try:
            tids[sess.session_id] = threading.get_native_id()
            barrier.wait()
            for _ in range(runs):
                x = image()
                assert_reference(sess.run(None, {"X": x})[0], x)
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    try:
        threads = [threading.Thread(target=drive, args=(s,)) for s in [*sessions, quiet]]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        assert quiet.end_profiling() == "" and quiet._runner.profiler is None
        paths = [s.end_profiling() for s in sessions]
        assert len(set(paths)) == 2
        for sess, path in zip(sessions, paths):
            trace = load(path)
            events = complete(trace)
            assert len(complete(trace, "run")) == runs
            assert len(events) == runs * 3  # each run and its two steps: nothing of the other sessions
            assert {e["pid"] for e in events} == {sess.session_id}
            assert {e["tid"] for e in events} == {tids[sess.session_id]}
            assert_nested(trace, "run", 2)
    finally:
        for sess in [*sessions, quiet]:
            sess.close()


def cpu_node_model() -> bytes:
    """``Y = float(2 * double(X))``: the float64 Mul runs on the CPU, between two device steps."""
    nodes = [
        helper.make_node("Cast", ["X"], ["wide_x"], to=TensorProto.DOUBLE, name="to_wide"),
        helper.make_node("Mul", ["wide_x", "two"], ["wide_y"], name="wide_mul"),
        helper.make_node("Cast", ["wide_y"], ["Y"], to=TensorProto.FLOAT, name="to_float"),
    ]
    graph = helper.make_graph(
        nodes,
        "cpu_node",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [BATCH, WIDTH])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [BATCH, WIDTH])],
        [numpy_helper.from_array(np.array([2.0]), "two")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return bytes(model.SerializeToString())


def test_profiled_run_with_a_cpu_step(env: Env, tmp_path: Path) -> None:
    with InferenceSession(cpu_node_model(), env=env, profile_file_prefix=str(tmp_path / "cpu")) as sess:
        placements = {row.node: row.placement for row in sess.get_node_placement()}
        assert "cpu" in placements.values()
        x = image()
        with sess.profiling() as record:
            np.testing.assert_array_equal(sess.run(None, {"X": x})[0], (2.0 * x.astype(np.float64)).astype(np.float32))
        assert record.path is not None
        trace = load(record.path)
        steps = [e for e in complete(trace) if e["cat"] != "run"]
        assert {e["name"]: e["args"]["placement"] for e in steps} == {
            name: placement for name, placement in placements.items() if name in {e["name"] for e in steps}
        }
        assert {e["args"]["placement"] for e in steps} == set(placements.values())


def test_profiling_off_submits_as_before(env: Env, tmp_path: Path) -> None:
    """Unprofiled runs submit the whole plan at once (profiling off is one attribute check); only a profiled run
    splits it into one submission per step."""
    with InferenceSession(MODEL, env=env, profile_file_prefix=str(tmp_path / "off")) as sess:
        runner = sess._runner
        original = runner.submit
        submitted: list[int] = []

        def counting(commands: Any) -> None:
            submitted.append(commands.dispatch_count)
            original(commands)

        runner.submit = counting  # type: ignore[method-assign]
        x = image()
        assert runner.profiler is None
        assert_reference(sess.run(None, {"X": x})[0], x)
        assert submitted == [2]  # both steps' dispatches in one submission
        submitted.clear()
        sess.start_profiling()
        assert_reference(sess.run(None, {"X": x})[0], x)
        assert sess.end_profiling() != ""
        assert submitted == [1, 1]  # one per step


def test_concurrent_profiled_replays_stay_apart(env: Env, tmp_path: Path) -> None:
    """Two sessions, each replaying its own captured graph from its own thread (one also runs): each trace holds
    exactly its own replays and runs."""
    replays = 5
    sessions = [
        InferenceSession(MODEL, env=env, graph_capture=True, profile_file_prefix=str(tmp_path / f"r{i}"))
        for i in range(2)
    ]
    graphs = []
    inputs = []
    outputs = []
    errors: list[BaseException] = []
    try:
        for sess in sessions:
            x_value = sess.allocator.from_numpy(image())
            y_value = sess.allocator.empty((BATCH, WIDTH), "float32")
            binding = sess.io_binding()
            binding.bind_input("X", x_value)
            binding.bind_output("Y", y_value)
            graphs.append(sess.capture(binding, 0))
            inputs.append(x_value)
            outputs.append(y_value)
            sess.start_profiling()
        barrier = threading.Barrier(2)

        def drive(index: int) -> None:
            try:
                barrier.wait()
                for _ in range(replays):
                    x = image()
                    inputs[index].update_inplace(x)
                    graphs[index].replay()
                    assert_reference(outputs[index].to_numpy(), x)
                    if index == 1:
                        assert_reference(sessions[1].run(None, {"X": x})[0], x)
            except BaseException as error:  # noqa: BLE001 - reported by the main thread
                errors.append(error)

        threads = [threading.Thread(target=drive, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        for index, sess in enumerate(sessions):
            trace = load(sess.end_profiling())
            assert len(complete(trace, "replay")) == replays
            assert len(complete(trace, "run")) == (replays if index == 1 else 0)
            assert {e["pid"] for e in complete(trace)} == {sess.session_id}
            steps = [e for e in complete(trace) if e["cat"] not in ("run", "replay")]
            assert len(steps) == 2 * (replays + len(complete(trace, "run")))
    finally:
        for graph in graphs:
            graph.release()
        for sess in sessions:
            sess.close()
