"""Per-session profiling (issue 15): ``InferenceSession(profile=True)``, ``session.profiling()``,
``session.end_profiling()`` -> a Chrome trace JSON file, on both backends.

The model is a small MLP (``models.mlp(layers=2, width=16)``: two planned steps, MatMul+Add+Relu and MatMul+Add).
Profiling is per session (onnxruntime's "C4" lesson): two sessions profiled concurrently from two threads each get
only their own events.

Both backends here have timestamp queries (lavapipe has wgpu-native's ``timestamp-query-inside-encoders``, the fake
models them), so profiled runs are timed with GPU timestamps (one submission per run); a fake device told it has
none (``FakeDeviceSpec(timestamp_queries=False)``), and plans with CPU steps, fall back to host timing.  The
timestamp and resolve records themselves are checked here too: a bad one raises ``ValidationError`` and executes
nothing.
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
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortgpu_core
from ortgpu import Env, InferenceSession, _gpu_step_timer
from ortgpu._profiling import RING_SLOTS
from ortgpu_core import ArgumentTypeError, InvalidArgumentError, ValidationError
from ortgpu_core.backends._commands import CommandList
from ortgpu_core.backends.fake import FakeBackend, FakeDeviceSpec

WIDTH, BATCH = 16, 4
MODEL = models.mlp(layers=2, width=WIDTH, batch=BATCH).SerializeToString()
_ORT = onnxruntime.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
_rng = np.random.default_rng(15)


def image() -> np.ndarray:
    return _rng.standard_normal((BATCH, WIDTH)).astype(np.float32)


def assert_reference(got: np.ndarray, x: np.ndarray) -> None:
    np.testing.assert_allclose(got, np.asarray(_ORT.run(None, {"X": x})[0]), rtol=1e-5, atol=1e-5)


def captured(sess: InferenceSession, x: np.ndarray | None = None) -> tuple[Any, Any, Any, Any]:
    """Device values for X (``x``, else a random image) and Y bound in a new binding, and the graph captured from
    it (id 0): ``(x_value, y_value, binding, graph)``."""
    x_value = sess.allocator.from_numpy(image() if x is None else x)
    y_value = sess.allocator.empty((BATCH, WIDTH), "float32")
    binding = sess.io_binding()
    binding.bind_input("X", x_value)
    binding.bind_output("Y", y_value)
    return x_value, y_value, binding, sess.capture(binding, 0)


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
    with InferenceSession(MODEL, profile_detail_every=1, env=env, profile=True, profile_file_prefix=prefix) as sess:
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
        assert trace["otherData"]["timing"] == "gpu-timestamps"
        assert all(e["args"]["timing"] == "gpu" for e in runs)
        assert trace["otherData"]["session_id"] == sess.session_id
        assert trace["otherData"]["backend"] == env.backend_name
        meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
        assert any(e["name"] == "process_name" and e["pid"] == sess.session_id for e in meta)
        # After end_profiling runs record nothing, and a second end_profiling has nothing to write.
        sess.run(None, {"X": image()})
        assert sess.end_profiling() == ""


def test_profiling_context_and_bound_runs(env: Env, tmp_path: Path) -> None:
    with InferenceSession(MODEL, profile_detail_every=1, env=env, profile_file_prefix=str(tmp_path / "ctx")) as sess:
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
    with InferenceSession(
        MODEL, profile_detail_every=1, env=env, graph_capture=True, profile_file_prefix=str(tmp_path / "g")
    ) as sess:
        x = image()
        x_value, y_value, binding, graph = captured(sess, x)
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
        InferenceSession(
            MODEL, profile_detail_every=1, env=env, profile=True, profile_file_prefix=str(tmp_path / f"s{i}")
        )
        for i in range(2)
    ]
    quiet = InferenceSession(
        MODEL, profile_detail_every=1, env=env
    )  # unprofiled, running at the same time: it records nothing
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
    with InferenceSession(
        cpu_node_model(), profile_detail_every=1, env=env, profile_file_prefix=str(tmp_path / "cpu")
    ) as sess:
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
    """Unprofiled runs submit the whole plan at once (profiling off is one attribute check); a profiled run (GPU
    timestamps) is one submission too: the same dispatches, with a timestamp before each step and after the last
    and the resolve of those timestamps after the work (read back later, with those of other runs)."""
    with InferenceSession(MODEL, profile_detail_every=1, env=env, profile_file_prefix=str(tmp_path / "off")) as sess:
        runner = sess._runner
        original = runner.submit
        submitted: list[int] = []
        queries: list[list[str]] = []

        def counting(commands: Any, *rest: Any, **hints: Any) -> None:
            submitted.append(commands.dispatch_count)
            queries.append([r[0] for r in commands.records() if r[0] in ("timestamp", "resolve")])
            original(commands, *rest, **hints)

        runner.submit = counting  # type: ignore[method-assign]
        x = image()
        assert runner.profiler is None
        assert_reference(sess.run(None, {"X": x})[0], x)
        assert submitted == [2]  # both steps' dispatches in one submission
        submitted.clear()
        sess.start_profiling()
        assert_reference(sess.run(None, {"X": x})[0], x)
        assert sess.end_profiling() != ""
        assert submitted == [2]  # still one submission
        # three timestamps (before each of the two steps, after the last), then their resolve (the ring's read,
        # when the trace is written, only copies)
        assert queries == [[], ["timestamp"] * 3 + ["resolve"]]


def test_concurrent_profiled_replays_stay_apart(env: Env, tmp_path: Path) -> None:
    """Two sessions, each replaying its own captured graph from its own thread (one also runs): each trace holds
    exactly its own replays and runs."""
    replays = 5
    sessions = [
        InferenceSession(
            MODEL, profile_detail_every=1, env=env, graph_capture=True, profile_file_prefix=str(tmp_path / f"r{i}")
        )
        for i in range(2)
    ]
    graphs = []
    inputs = []
    outputs = []
    errors: list[BaseException] = []
    try:
        for sess in sessions:
            x_value, y_value, binding, graph = captured(sess)
            graphs.append(graph)
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


def test_records_started_and_ended_while_other_threads_run(env: Env, tmp_path: Path) -> None:
    """One thread starts and ends profiling records over and over while two others replay the session's captured
    graph and run it: every output is right, nothing raises, each trace holds only this session's events with GPU
    spans that have durations, and the timers given back at each record's end are made again by the next record's
    first run (nothing leaks: the env fixture checks after the session closes)."""
    records = 12
    with InferenceSession(MODEL, env=env, graph_capture=True, profile_file_prefix=str(tmp_path / "toggle")) as sess:
        x_value, y_value, _, graph = captured(sess)
        x = image()
        x_value.update_inplace(x)
        errors: list[BaseException] = []
        stop = threading.Event()

        def replaying() -> None:
            try:
                while not stop.is_set():
                    assert_reference(graph.replay_and_read()[0], x)
            except BaseException as error:  # noqa: BLE001 - reported by the main thread
                errors.append(error)

        def running() -> None:
            try:
                while not stop.is_set():
                    assert_reference(sess.run(None, {"X": x})[0], x)
            except BaseException as error:  # noqa: BLE001 - reported by the main thread
                errors.append(error)

        workers = [threading.Thread(target=replaying), threading.Thread(target=running)]
        spans = 0
        try:
            for worker in workers:
                worker.start()
            for _ in range(records):
                sess.start_profiling()
                for _ in range(3):  # this thread's own runs, so that every record holds some
                    assert_reference(sess.run(None, {"X": x})[0], x)
                trace = load(sess.end_profiling())
                assert {e["pid"] for e in complete(trace)} == {sess.session_id}
                timed = [e for e in complete(trace) if e["cat"] in ("run", "replay") and e["args"]["timing"] == "gpu"]
                assert len(timed) >= 3 and all(e["args"]["gpu_ns"] > 0 for e in timed)
                spans += len(timed)
        finally:
            stop.set()
            for worker in workers:
                worker.join()
            graph.release()
        assert not errors, errors
        assert spans >= 3 * records


# -- GPU timestamps ------------------------------------------------------------------------------------------------


def gpu_events(trace: dict[str, Any], outer_cat: str) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Each ``outer_cat`` span with its step events (those of its thread within its span), in order."""
    steps = [e for e in complete(trace) if e["cat"] not in ("run", "replay")]
    out = []
    for outer in complete(trace, outer_cat):
        inside = [
            e
            for e in steps
            if e["tid"] == outer["tid"]
            and e["ts"] >= outer["ts"] - 1e-3
            and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"] + 1e-3
        ]
        out.append((outer, inside))
    return out


def test_gpu_timed_steps_are_positive_and_fit_their_span(env: Env, tmp_path: Path) -> None:
    """Runs and replays timed with GPU timestamps: every step event has a positive GPU duration, the steps of a run
    add up to at most its span (exactly, up to rounding: they partition it), the trace is JSON with traceEvents, and
    more runs than the resolve buffer has slots are all recorded (the slots are read back when full)."""
    runs = RING_SLOTS + 3
    with InferenceSession(
        MODEL, profile_detail_every=1, env=env, graph_capture=True, profile_file_prefix=str(tmp_path / "gpu")
    ) as sess:
        x_value, y_value, binding, graph = captured(sess)
        try:
            sess.start_profiling()
            for _ in range(runs):
                x = image()
                assert_reference(sess.run(None, {"X": x})[0], x)
            for _ in range(3):
                x = image()
                x_value.update_inplace(x)
                assert_reference(graph.replay_and_read()[0], x)
            path = sess.end_profiling()
        finally:
            graph.release()
    with open(path, encoding="utf-8") as handle:
        trace = json.load(handle)
    assert isinstance(trace["traceEvents"], list)
    assert trace["otherData"]["timing"] == "gpu-timestamps" and "GPU timestamps" in trace["otherData"]["timing_note"]
    for cat, count in (("run", runs), ("replay", 3)):
        spans = gpu_events(trace, cat)
        assert len(spans) == count
        for outer, steps in spans:
            assert outer["args"]["timing"] == "gpu" and outer["args"]["gpu_ns"] > 0
            assert [e["cat"] for e in steps] == ["MatMul+Add+Relu", "MatMul+Add"]
            assert all(e["dur"] > 0 and e["args"]["dispatches"] >= 1 for e in steps)
            assert sum(e["dur"] for e in steps) <= outer["dur"] + 1e-3
            assert abs(outer["dur"] * 1000 - outer["args"]["gpu_ns"]) < 1.0
    assert {e["pid"] for e in complete(trace)} == {sess.session_id}


def test_ending_a_record_gives_back_the_timing_resources(env: Env, tmp_path: Path) -> None:
    """end_profiling leaves nothing of the record's GPU timing on the device (the query sets, the resolve buffer
    and the timed command lists are given back: held on, they slowed unprofiled submissions), and a later record
    makes them again and times its runs as the first did."""
    with InferenceSession(MODEL, env=env, graph_capture=True, profile_file_prefix=str(tmp_path / "again")) as sess:
        x = image()
        _, y_value, _, graph = captured(sess, x)
        try:
            assert_reference(graph.replay_and_read()[0], x)
            assert_reference(sess.run(None, {"X": x})[0], x)
            before = env.live_handles()
            for record in range(2):
                sess.start_profiling()
                for _ in range(3):
                    assert_reference(sess.run(None, {"X": x})[0], x)
                    graph.replay()
                    assert_reference(y_value.to_numpy(), x)
                assert env.live_handles() > before  # a record's query sets and resolve buffers
                trace = load(sess.end_profiling())
                assert env.live_handles() == before, f"record {record} left timing resources behind"
                assert trace["otherData"]["timing"] == "gpu-timestamps"
                for cat in ("run", "replay"):
                    spans = [e for e in complete(trace, cat) if e["args"].get("timing") == "gpu"]
                    assert len(spans) == 3 and all(e["args"]["gpu_ns"] > 0 for e in spans)
        finally:
            graph.release()


def test_timing_resources_are_released_with_the_session(env: Env, tmp_path: Path) -> None:
    """A profiled program holds one query set and one resolve buffer, released when the session closes (the env
    fixture also checks that nothing leaked)."""
    sess = InferenceSession(MODEL, profile_detail_every=1, env=env, profile_file_prefix=str(tmp_path / "rel"))
    try:
        sess.run(None, {"X": image()})
        before = env.live_handles()
        sess.start_profiling()
        sess.run(None, {"X": image()})
        assert env.live_handles() - before >= 2  # the query set and its resolve buffer
        sess.run(None, {"X": image()})
        during = env.live_handles()
        assert load(sess.end_profiling())["otherData"]["timing"] == "gpu-timestamps"
        assert env.live_handles() <= during  # ending profiling makes nothing new
    finally:
        sess.close()
    assert env.live_handles() < before


def test_replays_of_a_graph_released_while_profiling_are_kept(env: Env, tmp_path: Path) -> None:
    """Replays whose timestamps were not read back yet when their graph is released still reach the trace (the
    profiler reads them when it is written, then frees the graph's query set and buffer); a session closed while
    profiling, never ended, leaks nothing either (the env fixture checks)."""
    with InferenceSession(
        MODEL, profile_detail_every=1, env=env, graph_capture=True, profile_file_prefix=str(tmp_path / "gone")
    ) as sess:
        x_value, y_value, binding, graph = captured(sess)
        handles = env.live_handles()
        sess.start_profiling()
        for _ in range(3):
            graph.replay()
        assert env.live_handles() > handles  # the graph's query set and resolve buffer
        graph.release()
        trace = load(sess.end_profiling())
        replays = complete(trace, "replay")
        assert [e["args"]["timing"] for e in replays] == ["gpu"] * 3
        assert_nested(trace, "replay", 2)
        # queued back to back (replay() does not wait), they keep the GPU's order on the timeline, not overlapping
        for first, second in zip(replays, replays[1:]):
            assert first["ts"] + first["dur"] <= second["ts"] + 1e-3
        assert env.live_handles() < handles  # the graph's own state, and the timer's, are gone
        # profiling left on at close: the pending run's timer is freed with the session's profiler
        sess.start_profiling()
        sess.run(None, {"X": image()})


def test_a_device_without_timestamps_falls_back_to_host_timing(tmp_path: Path) -> None:
    """A device without timestamp queries: each step submitted alone and waited for, and the trace says "host"."""
    with ortgpu_core.Env(backend=FakeBackend([FakeDeviceSpec(timestamp_queries=False)])) as env:
        device = env.default_device._native_device()
        assert not device.timestamps_supported
        with pytest.raises(ValidationError, match="does not support timestamp queries"):
            device.create_query_set(2)
        with InferenceSession(
            MODEL, profile_detail_every=1, env=env, profile_file_prefix=str(tmp_path / "host")
        ) as sess:
            runner = sess._runner
            original = runner.submit
            submitted: list[tuple[int, int]] = []

            def counting(commands: Any, *rest: Any, **hints: Any) -> None:
                submitted.append((commands.dispatch_count, commands.query_count))
                original(commands, *rest, **hints)

            runner.submit = counting  # type: ignore[method-assign]
            with sess.profiling() as record:
                x = image()
                assert_reference(sess.run(None, {"X": x})[0], x)
            assert submitted == [(1, 0), (1, 0)]  # one per step, no timestamps
            assert record.path is not None
            trace = load(record.path)
            assert trace["otherData"]["timing"] == "host"
            assert "host timing" in trace["otherData"]["timing_note"]
            assert [e["args"]["timing"] for e in complete(trace, "run")] == ["host"]
            assert_nested(trace, "run", 2)
        assert env.live_handles() == 0


def test_a_plan_with_cpu_steps_is_timed_on_the_host(env: Env, tmp_path: Path) -> None:
    """On a device with timestamps, a plan with CPU steps still falls back to host timing (documented)."""
    with InferenceSession(
        cpu_node_model(), profile_detail_every=1, env=env, profile_file_prefix=str(tmp_path / "cpuh")
    ) as sess:
        with sess.profiling() as record:
            sess.run(None, {"X": image()})
        assert record.path is not None
        trace = load(record.path)
        assert trace["otherData"]["timing"] == "host"
        assert [e["args"]["timing"] for e in complete(trace, "run")] == ["host"]


@pytest.mark.parametrize(
    "bad",
    [
        "index past the set",
        "resolve offset unaligned",
        "resolve past the buffer",
        "resolve past the set",
        "resolve into a storage buffer",
        "timestamp into a buffer",
        "released query set",
    ],
)
def test_bad_timestamp_records_raise_and_change_nothing(env: Env, bad: str) -> None:
    """A bad timestamp or resolve record raises ValidationError at submit and nothing of the list executes (a clear
    before it leaves the buffer as it was); the query sets are released (live handles back where they were)."""
    device = env.default_device._native_device()
    assert device.timestamps_supported
    before = device.live_handles()
    query_set = device.create_query_set(4, label="test")
    resolve = device.create_query_resolve_buffer(512, label="test")
    data = device.create_buffer(256, label="test data")
    try:
        device.write_buffer(data, 0, np.arange(64, dtype=np.uint32).tobytes())
        commands = CommandList()
        commands.add_clear(data, 0, 256)
        commands.add_timestamp(query_set, 0)
        if bad == "index past the set":
            commands.add_timestamp(query_set, 4)
        elif bad == "resolve offset unaligned":
            commands.add_resolve(query_set, 0, 1, resolve, 128)
        elif bad == "resolve past the buffer":
            commands.add_resolve(query_set, 0, 4, resolve, 512 - 16)
        elif bad == "resolve past the set":
            commands.add_resolve(query_set, 2, 3, resolve, 0)
        elif bad == "resolve into a storage buffer":
            commands.add_resolve(query_set, 0, 1, data, 0)
        elif bad == "timestamp into a buffer":
            commands.add_timestamp(data, 0)
        else:
            dead = device.create_query_set(2)
            device.release_query_set(dead)
            commands.add_timestamp(dead, 0)
        with pytest.raises(ValidationError):
            device.submit(commands)
        got = np.frombuffer(device.read_buffer(data, 0, 256), dtype=np.uint32)
        np.testing.assert_array_equal(got, np.arange(64, dtype=np.uint32))
        # The device is still usable: a good list runs and resolves increasing timestamps.
        good = CommandList()
        good.add_timestamp(query_set, 0)
        good.add_clear(data, 0, 256)
        good.add_timestamp(query_set, 1)
        good.add_resolve(query_set, 0, 2, resolve, 256)
        out = np.zeros(2, dtype=np.uint64)
        device.submit_and_read(good, [(resolve, 256, out.view(np.uint8))])
        assert out[1] >= out[0] > 0
        assert not np.frombuffer(device.read_buffer(data, 0, 256), dtype=np.uint32).any()
    finally:
        device.destroy_buffer(data)
        device.destroy_buffer(resolve)
        device.release_query_set(query_set)
    assert device.live_handles() == before


def test_per_step_detail_on_a_sample_and_the_rest_timed_whole(env: Env, tmp_path: Path) -> None:
    """profile_detail_every=3: replays 0, 3 and 6 of seven are timed per step, the other four whole (a span with
    args.detail false and no step events); every replay computes the same as unprofiled."""
    with InferenceSession(
        MODEL, profile_detail_every=3, env=env, graph_capture=True, profile_file_prefix=str(tmp_path / "s")
    ) as sess:
        x_value, y_value, binding, graph = captured(sess)
        try:
            with sess.profiling() as record:
                for _ in range(7):
                    x = image()
                    x_value.update_inplace(x)
                    assert_reference(graph.replay_and_read()[0], x)
            assert record.path is not None
            trace = load(record.path)
            assert trace["otherData"]["detail_every"] == 3
            replays = complete(trace, "replay")
            assert len(replays) == 7
            detailed = [e for e in replays if e["args"]["detail"]]
            assert len(detailed) == 3 and all(e["args"]["gpu_ns"] >= 0 for e in replays)
            steps = [e for e in complete(trace) if e["cat"] not in ("run", "replay")]
            assert len(steps) == 3 * len(step_names(sess))
        finally:
            graph.release()


def test_a_sampled_out_replay_on_the_host_path_is_marked(tmp_path: Path) -> None:
    """Without timestamp queries a replay not in the sample runs as an unprofiled one and leaves an instant
    event; runs not in the sample leave their host span (args.detail false) and no steps."""
    with ortgpu_core.Env(backend=FakeBackend([FakeDeviceSpec(timestamp_queries=False)])) as env:
        with InferenceSession(
            MODEL, profile_detail_every=2, env=env, graph_capture=True, profile_file_prefix=str(tmp_path / "m")
        ) as sess:
            x_value, _, binding, graph = captured(sess)
            try:
                with sess.profiling() as record:
                    for _ in range(3):
                        x = image()
                        x_value.update_inplace(x)
                        assert_reference(graph.replay_and_read()[0], x)
                    for _ in range(2):
                        x = image()
                        assert_reference(sess.run(None, {"X": x})[0], x)
                assert record.path is not None
                trace = load(record.path)
                marks = [e for e in trace["traceEvents"] if e["ph"] == "i"]
                assert [m["args"]["detail"] for m in marks] == [False]  # replays 0 and 2 timed, 1 marked
                assert len(complete(trace, "replay")) == 2
                runs = complete(trace, "run")  # runs 3 (not in the sample) and 4 (in it)
                assert [r["args"].get("detail", True) for r in runs] == [False, True]
                steps = [e for e in complete(trace) if e["cat"] not in ("run", "replay")]
                assert len(steps) == 3 * len(step_names(sess))
            finally:
                graph.release()
        assert env.live_handles() == 0


@pytest.mark.parametrize("bad", [0, -3])
def test_detail_every_below_one_is_refused(env: Env, bad: int) -> None:
    with pytest.raises(InvalidArgumentError, match="profile_detail_every must be >= 1"):
        InferenceSession(MODEL, env=env, profile_detail_every=bad)
    with InferenceSession(MODEL, env=env) as sess:
        with pytest.raises(InvalidArgumentError, match=">= 1"):
            sess.start_profiling(detail_every=bad)
        assert not sess.profiling_active  # nothing started


@pytest.mark.parametrize("bad", [True, 2.0, "3", None])
def test_detail_every_of_the_wrong_type_is_refused(env: Env, bad: object) -> None:
    with pytest.raises(ArgumentTypeError, match="profile_detail_every must be an int"):
        InferenceSession(MODEL, env=env, profile_detail_every=bad)  # type: ignore[arg-type]


def test_a_profiled_replay_and_read_is_one_submission(env: Env, tmp_path: Path) -> None:
    """With GPU timestamps a profiled replay_and_read submits the timed work once, with its outputs read ahead in
    that submission (as a replay()'s: the copies it returns come from there, no other submission), each naming the
    list the next one submits; its timestamps wait in the ring (3 runs), read once when the trace is written; the
    results are right."""
    with InferenceSession(MODEL, env=env, graph_capture=True, profile_file_prefix=str(tmp_path / "one")) as sess:
        x_value, _, binding, graph = captured(sess)
        runner = sess._runner
        calls: list[str] = []
        submit, submit_and_read = runner.submit, runner.submit_and_read
        work = graph._replay_work
        assert work is not None
        ranges = work.read_ahead  # the outputs' ranges, read ahead in each replay's submission
        assert ranges

        def counting_submit(commands: Any, read_ahead: Any = (), encode_next: Any = None) -> None:
            calls.append("submit" if list(read_ahead) == list(ranges) and encode_next is not None else "other")
            submit(commands, read_ahead, encode_next)

        def counting_submit_and_read(commands: Any, reads: Any) -> None:
            calls.append(f"submit_and_read({len(reads)})")
            submit_and_read(commands, reads)

        def counting_read(commands: Any, buffer: int, offset: int, out: Any) -> None:
            calls.append("read")
            read(commands, buffer, offset, out)

        read = runner._read_timestamps
        runner.submit = counting_submit  # type: ignore[method-assign]
        runner.submit_and_read = counting_submit_and_read  # type: ignore[method-assign]
        runner._read_timestamps = counting_read  # type: ignore[method-assign]
        try:
            with sess.profiling() as record:
                for _ in range(3):  # the first timed per step, the others whole
                    x = image()
                    x_value.update_inplace(x)
                    assert_reference(graph.replay_and_read()[0], x)
            assert calls == ["submit"] * 3 + ["read"]
            assert record.path is not None
            spans = gpu_events(load(record.path), "replay")
            assert [(outer["args"]["detail"], len(steps)) for outer, steps in spans] == [
                (True, 2),
                (False, 0),
                (False, 0),
            ]
            assert all(outer["args"]["timing"] == "gpu" and outer["args"]["gpu_ns"] > 0 for outer, _ in spans)
        finally:
            runner.submit, runner.submit_and_read = submit, submit_and_read  # type: ignore[method-assign]
            del runner._read_timestamps
            graph.release()


def test_a_full_ring_is_read_once_and_replays_keep_their_order(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Profiled runs leave their timestamps in their ring slot; the ring's pending runs are resolved and read back
    together only when every slot holds one (one read, one wait, before the next run) or when the trace is written,
    on a device without reads that do not wait (ASYNC_READS off: tests/test_profiling_async_ring.py has the ring
    with them).  With a ring of MIN_RING_SLOTS (4) slots (RING_BYTES made small): a replay_and_read, 2 replays and
    a replay_and_read (4 of 4 pending), 5 replays (the ring read on its own before the first), the trace (read for
    the last one).  The trace has every replay, in submission order, each span after the previous one."""
    monkeypatch.setattr(_gpu_step_timer, "RING_BYTES", 1)
    monkeypatch.setattr(_gpu_step_timer, "ASYNC_READS", False)
    with InferenceSession(MODEL, env=env, graph_capture=True, profile_file_prefix=str(tmp_path / "ring")) as sess:
        x_value, _, binding, graph = captured(sess)
        runner = sess._runner
        calls: list[str] = []
        read, submit, submit_and_read = runner._read_timestamps, runner.submit, runner.submit_and_read

        def counting_read(commands: Any, buffer: int, offset: int, out: Any) -> None:
            calls.append("read")
            read(commands, buffer, offset, out)

        def counting_submit(commands: Any, read_ahead: Any = (), encode_next: Any = None) -> None:
            calls.append("submit")
            submit(commands, read_ahead, encode_next)

        def counting_submit_and_read(commands: Any, reads: Any) -> None:
            calls.append(f"submit_and_read({len(reads)})")
            submit_and_read(commands, reads)

        def read_and_check() -> None:
            x = image()
            x_value.update_inplace(x)
            assert_reference(graph.replay_and_read()[0], x)

        runner._read_timestamps = counting_read  # type: ignore[method-assign]
        runner.submit = counting_submit  # type: ignore[method-assign]
        runner.submit_and_read = counting_submit_and_read  # type: ignore[method-assign]
        slots = _gpu_step_timer.MIN_RING_SLOTS
        assert slots == 4
        try:
            sess.start_profiling()
            read_and_check()
            assert calls == ["submit"]
            calls.clear()
            graph.replay()
            graph.replay()
            read_and_check()
            assert calls == ["submit", "submit", "submit"]
            calls.clear()
            for _ in range(slots + 1):
                graph.replay()
            assert calls == ["read"] + ["submit"] * slots + ["read", "submit"]
            calls.clear()
            trace = load(sess.end_profiling())
            assert calls == ["read"]
        finally:
            del runner._read_timestamps, runner.submit, runner.submit_and_read
            graph.release()
    spans = complete(trace, "replay")
    assert len(spans) == 2 * slots + 1
    assert all(span["args"]["timing"] == "gpu" for span in spans)
    starts = [span["ts"] for span in spans]
    assert starts == sorted(starts)
    assert all(b["ts"] >= a["ts"] + a["dur"] - 1e-3 for a, b in zip(spans, spans[1:]))
