"""The profiler's ring of timestamps read without waiting (issue 15: profiling's cost on average).

A profiled ``replay()`` leaves its timestamps in a slot of its program's ring; once three quarters of the ring are
pending (of RING_SLOTS = 64: 48; of MIN_RING_SLOTS = 4, which most tests here use: 2), those slots are resolved and copied
out by a read nobody waits for (the device's ``read_async``), which a later profiled run picks up when it has
completed (``read_async_done``, then ``read_async_finish``).  A run waits for a read only when no slot is free.
These tests check that, on both backends: the calls made, that every run gets its own timestamps (never another
run's), that a read still in flight survives a graph release, a session close, an Env close and a lost device (no
crash, nothing leaked), two profiled sessions in two threads, and serialized mode's lock.

The fake's ``read_async_done`` says False the first time it is asked about a read (a read still in flight) and True
after; on wgpu (lavapipe) the reads complete when the GPU has done them.  The model is the small MLP of
test_profiling.py (two planned steps: a run timed per step has 3 timestamps, one timed whole 2).
"""

from __future__ import annotations

import gc
import json
import threading
from pathlib import Path
from typing import Any, Callable

import models
import numpy as np
import onnxruntime
import pytest

import ortgpu_core
from ortgpu import Env, InferenceSession, _gpu_step_timer, _profiling
from ortgpu._profiling import _LOST, GpuStepTimer, _GpuRun
from ortgpu_core import DeviceError, DeviceLostError
from ortgpu_core.backends._commands import CommandList

WIDTH, BATCH = 16, 4
MODEL = models.mlp(layers=2, width=WIDTH, batch=BATCH).SerializeToString()
_ORT = onnxruntime.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
_rng = np.random.default_rng(9)


def image() -> np.ndarray:
    return _rng.standard_normal((BATCH, WIDTH)).astype(np.float32)


def assert_reference(got: np.ndarray, x: np.ndarray) -> None:
    np.testing.assert_allclose(got, np.asarray(_ORT.run(None, {"X": x})[0]), rtol=1e-5, atol=1e-5)


def captured(sess: InferenceSession) -> tuple[Any, Any, Any]:
    """``(x_value, y_value, graph)``: device values bound to X and Y, and the graph captured on them."""
    x_value = sess.allocator.from_numpy(image())
    y_value = sess.allocator.empty((BATCH, WIDTH), "float32")
    binding = sess.io_binding()
    binding.bind_input("X", x_value)
    binding.bind_output("Y", y_value)
    return x_value, y_value, sess.capture(binding, 0)


def load(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        trace: dict[str, Any] = json.load(handle)
    return trace


def spans(trace: dict[str, Any], cat: str = "replay") -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == cat]


class Calls:
    """Counts what a session's timers ask of the device (read_async and the rest) and of the runner (the reads
    that wait: ``_read_timestamps``), in order; ``done`` decides the answers of ``read_async_done`` (None: the
    device's own)."""

    def __init__(self, sess: InferenceSession, monkeypatch: pytest.MonkeyPatch) -> None:
        self.log: list[str] = []
        self.done: Callable[[], bool] | None = None
        device = sess._runner.backend_device
        for name in ("read_async", "read_async_done", "read_async_finish", "read_async_cancel"):
            monkeypatch.setattr(device, name, self._counted(name, getattr(device, name)))
        runner = sess._runner
        monkeypatch.setattr(runner, "_read_timestamps", self._counted("read", runner._read_timestamps))
        monkeypatch.setattr(runner, "submit", self._counted("submit", runner.submit))
        self.runs: list[_GpuRun] = []

    def _counted(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if name == "read_async_done" and self.done is not None:
                answer = self.done() and bool(call(*args, **kwargs))
                self.log.append(f"done={answer}")
                return answer
            self.log.append(name)
            return call(*args, **kwargs)

        return counted

    def take(self) -> list[str]:
        log, self.log = self.log, []
        return log


def record_runs(sess: InferenceSession, monkeypatch: pytest.MonkeyPatch) -> list[_GpuRun]:
    """The GPU-timed runs the session's profiler is given, in submission order (the raw runs: their ticks)."""
    runs: list[_GpuRun] = []
    profiler = sess._runner.profiler
    assert profiler is not None
    add = profiler._add_gpu_run

    def adding(run: _GpuRun) -> None:
        runs.append(run)
        add(run)

    monkeypatch.setattr(profiler, "_add_gpu_run", adding)
    return runs


def assert_own_ticks(runs: list[_GpuRun], queries: int) -> None:
    """Every run has its own timestamps: as many as it wrote (``queries`` timed per step, else 2), never
    decreasing, each run's after the previous run's (the GPU runs submissions in order, on both backends)."""
    last = -1
    for index, run in enumerate(runs):
        ticks = run.ticks
        assert ticks is not None and ticks is not _LOST, index
        assert len(ticks) == (queries if run.detail else 2), (index, run.detail, ticks)
        values = [int(t) for t in ticks]
        assert values == sorted(values) and values[0] > 0, (index, values)
        assert values[0] >= last, (index, values, last)
        last = values[-1]


@pytest.fixture
def four_slots(monkeypatch: pytest.MonkeyPatch) -> int:
    """Rings of MIN_RING_SLOTS (4) slots: a read starts after 2 pending runs."""
    monkeypatch.setattr(_gpu_step_timer, "RING_BYTES", 1)
    assert _gpu_step_timer.MIN_RING_SLOTS == 4
    return 4


def test_a_replay_loop_never_waits_for_the_ring(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, four_slots: int
) -> None:
    """Replays alone: a read starts (read_async, right after the submit) once half the ring is pending; the next
    runs ask, after their submit, whether it completed (read_async_done) and finish it when it has
    (read_async_finish); no read waits
    (the runner's _read_timestamps is called only for the trace).  Every replay is in the trace, with its own
    timestamps."""
    with InferenceSession(
        MODEL, env=env, graph_capture=True, profile_detail_every=3, profile_file_prefix=str(tmp_path / "p")
    ) as sess:
        _, _, graph = captured(sess)
        calls = Calls(sess, monkeypatch)
        sess.start_profiling()
        runs = record_runs(sess, monkeypatch)
        calls.done = lambda: False  # in flight until told otherwise
        graph.replay()
        graph.replay()
        assert calls.take() == ["submit", "submit", "read_async"]
        graph.replay()
        graph.replay()
        assert calls.take() == ["submit", "done=False", "submit", "done=False", "read_async"]
        calls.done = None  # the device's own answers from here on
        for _ in range(41):
            graph.replay()
        log = calls.take()
        assert "read" not in log and "read_async_cancel" not in log
        assert log.count("submit") == 41
        started, finished = log.count("read_async"), log.count("read_async_finish")
        assert started == 20 and started <= finished <= started + 2  # (two were in flight before)
        path = sess.end_profiling()
        graph.release()
    assert len(runs) == 45
    assert_own_ticks(runs, queries=3)
    replays = spans(load(path))
    assert len(replays) == 45
    assert [r["args"]["detail"] for r in replays] == [i % 3 == 0 for i in range(45)]
    assert all(r["args"]["timing"] == "gpu" and r["args"]["gpu_ns"] > 0 for r in replays)


def test_a_read_starts_when_three_quarters_of_the_ring_are_pending(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ring of RING_SLOTS (64): the first read starts right after the 48th replay's submit, covering those 48;
    the next 16 replays take the free slots (they ask, after their submit, whether it completed, and finish it once
    it has)."""
    slots, read_at = 64, 48
    assert _profiling.RING_SLOTS == slots
    with InferenceSession(MODEL, env=env, graph_capture=True, profile_file_prefix=str(tmp_path / "p")) as sess:
        _, _, graph = captured(sess)
        calls = Calls(sess, monkeypatch)
        sess.start_profiling()
        calls.done = lambda: False
        for _ in range(read_at):
            graph.replay()
        assert calls.take() == ["submit"] * read_at + ["read_async"]
        timer = next(iter(sess._runner.profiler._timers))  # type: ignore[union-attr]
        assert timer.slots == slots and timer._read_at == read_at and len(timer._reading[0].pending) == read_at
        for _ in range(slots - read_at):
            graph.replay()
        assert calls.take() == ["submit", "done=False"] * (slots - read_at)
        calls.done = None
        graph.replay()  # the slots read are free again once the read is finished (this replay's slot among them)
        log = calls.take()
        assert log[-1] == "submit" and "read_async_finish" in log
        assert len(timer._free) + len(timer._pending) == slots - sum(len(r.pending) for r in timer._reading)
        sess.end_profiling()
        graph.release()


def test_a_run_waits_only_when_no_slot_is_free(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, four_slots: int
) -> None:
    """Reads that never complete on their own: two reads in flight hold all four slots, so the fifth replay
    finishes the oldest (waiting for it) before it takes a slot, the sixth finds a free one (and starts a read),
    the seventh finishes the oldest again."""
    with InferenceSession(MODEL, env=env, graph_capture=True, profile_file_prefix=str(tmp_path / "p")) as sess:
        _, _, graph = captured(sess)
        calls = Calls(sess, monkeypatch)
        sess.start_profiling()
        runs = record_runs(sess, monkeypatch)
        calls.done = lambda: False
        for _ in range(4):
            graph.replay()
        assert calls.take() == ["submit", "submit", "read_async", "submit", "done=False", "submit", "done=False"] + [
            "read_async"
        ]
        graph.replay()
        assert calls.take() == ["done=False", "read_async_finish", "submit", "done=False"]
        assert all(run.ticks is not None for run in runs[:2]) and all(run.ticks is None for run in runs[2:])
        graph.replay()
        assert calls.take() == ["submit", "done=False", "read_async"]
        graph.replay()
        assert calls.take() == ["done=False", "read_async_finish", "submit", "done=False"]
        trace = load(sess.end_profiling())
        assert calls.take() == ["read", "read_async_finish"]  # the pending run (one wait), then the read in flight
        graph.release()
    assert_own_ticks(runs, queries=3)
    assert len(spans(trace)) == 7


def test_replays_and_reads_mixed_get_their_own_timestamps(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """replay(), replay_and_read() and ordinary runs, mixed, over many turns of the ring (RING_SLOTS), each timed per
    step one in four: each run's timestamps are its own (never another run's), every output is right, and the
    trace has every run in order."""
    with InferenceSession(
        MODEL, env=env, graph_capture=True, profile_detail_every=4, profile_file_prefix=str(tmp_path / "p")
    ) as sess:
        x_value, y_value, graph = captured(sess)
        sess.start_profiling()
        runs = record_runs(sess, monkeypatch)
        cats = []
        for index in range(90):
            x = image()
            x_value.update_inplace(x)
            if index % 3 == 0:
                assert_reference(graph.replay_and_read()[0], x)
            elif index % 3 == 1:
                graph.replay()
                assert_reference(y_value.to_numpy(), x)
            else:
                graph.replay()
            cats.append("replay")
            if index % 10 == 5:
                assert_reference(sess.run(None, {"X": x})[0], x)
                cats.append("run")
        trace = load(sess.end_profiling())
        graph.release()
    assert len(runs) == len(cats)
    assert_own_ticks([run for run in runs if run.cat == "replay"], queries=3)
    assert_own_ticks(runs, queries=3)
    events = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] in ("run", "replay")]
    assert [e["cat"] for e in events] == cats


def test_a_graph_released_while_its_ring_is_read(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, four_slots: int
) -> None:
    """A graph released while a read of its ring is in flight (and runs pending): the profiler reads both when
    the trace is written, then frees the timer; nothing leaks (the env fixture checks)."""
    with InferenceSession(MODEL, env=env, graph_capture=True, profile_file_prefix=str(tmp_path / "p")) as sess:
        _, _, graph = captured(sess)
        calls = Calls(sess, monkeypatch)
        sess.start_profiling()
        runs = record_runs(sess, monkeypatch)
        calls.done = lambda: False
        for _ in range(3):
            graph.replay()
        graph.release()
        assert calls.take()[-2:] == ["submit", "done=False"]
        trace = load(sess.end_profiling())
        assert calls.take() == ["read", "read_async_finish"]
    assert_own_ticks(runs, queries=3)
    assert len(spans(trace)) == 3


@pytest.mark.parametrize("end", ["close", "close_then_trace"])
def test_a_session_closed_while_its_ring_is_read(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, four_slots: int, end: str
) -> None:
    """A session closed (its graph and programs released) while a read is in flight: with the trace written
    after, the runs are in it; without, the read is dropped when the profiler goes; nothing leaks either way."""
    sess = InferenceSession(MODEL, env=env, graph_capture=True, profile_file_prefix=str(tmp_path / "p"))
    _, _, graph = captured(sess)
    calls = Calls(sess, monkeypatch)
    sess.start_profiling()
    calls.done = lambda: False
    for _ in range(3):
        graph.replay()
    sess.close()
    if end == "close_then_trace":
        trace = load(sess.end_profiling())
        assert len(spans(trace)) == 3
        assert calls.take()[-2:] == ["read", "read_async_finish"]
    else:
        runner = sess._runner
        runner.profiler = None  # the record dropped (as with its session): the timer it adopted is freed unread
        gc.collect()
        assert calls.take()[-1] == "read_async_cancel"


def test_an_env_closed_while_a_ring_is_read(
    tmp_path: Path, backend_name: str, monkeypatch: pytest.MonkeyPatch, four_slots: int
) -> None:
    """The device destroyed (its Env closed) while a read is in flight: the trace is still written (the runs that
    could not be read are left out, and the error is named in otherData.timing_errors); nothing crashes."""
    environment = Env(backend=backend_name)
    try:
        sess = InferenceSession(MODEL, env=environment, graph_capture=True, profile_file_prefix=str(tmp_path / "p"))
        _, _, graph = captured(sess)
        monkeypatch.setattr(sess._runner.backend_device, "read_async_done", lambda ticket: False)  # in flight
        sess.start_profiling()
        for _ in range(3):
            graph.replay()
        timer = next(iter(sess._runner.profiler._timers))  # type: ignore[union-attr]
        assert isinstance(timer, GpuStepTimer) and len(timer._reading) == 1 and len(timer._pending) == 1
        environment.close()
        trace = load(sess.end_profiling())
        assert "timing_errors" in trace["otherData"]
        assert len(spans(trace)) <= 3
    finally:
        environment.close()
    assert environment.live_handles() == 0


@pytest.mark.fake_only
def test_a_device_lost_while_a_ring_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, four_slots: int) -> None:
    """The device lost while a read is in flight: the next replay raises DeviceLostError (from its own submit); the
    trace is written without the lost runs (the read's finish raises then); closing frees everything."""
    environment = Env(backend="fake")
    try:
        sess = InferenceSession(MODEL, env=environment, graph_capture=True, profile_file_prefix=str(tmp_path / "p"))
        _, _, graph = captured(sess)
        calls = Calls(sess, monkeypatch)
        sess.start_profiling()
        calls.done = lambda: False
        for _ in range(3):
            graph.replay()
        sess._runner.backend_device.lose("lost in a test")
        calls.done = None
        with pytest.raises(DeviceLostError):
            graph.replay()  # (its own submit raises: reads in flight are finished after a submit)
        assert calls.take()[-1] == "submit"
        trace = load(sess.end_profiling())
        assert "read_async_finish" in calls.take()  # the read in flight, finished (raising) when the trace is written
        assert len(spans(trace)) <= 3
        sess.close()
    finally:
        environment.close()
    assert environment.live_handles() == 0


def test_a_read_that_cannot_start_leaves_its_runs_pending(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, four_slots: int
) -> None:
    """read_async raising (a device error) does not fail the replay: the runs stay pending, in their slots, and
    are read later (here: when the ring is full, by a read that waits); none is lost."""
    with InferenceSession(MODEL, env=env, graph_capture=True, profile_file_prefix=str(tmp_path / "p")) as sess:
        _, _, graph = captured(sess)
        device = sess._runner.backend_device

        def failing(*args: Any) -> Any:
            raise DeviceError("read_async failed (a test)")

        monkeypatch.setattr(device, "read_async", failing)
        sess.start_profiling()
        runs = record_runs(sess, monkeypatch)
        for _ in range(6):
            graph.replay()
        trace = load(sess.end_profiling())
        graph.release()
    assert_own_ticks(runs, queries=3)
    assert len(spans(trace)) == 6


def finish_fails_once(sess: InferenceSession, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make the session device's first ``read_async_finish`` raise a ``DeviceError`` (the later ones work); the list
    returned holds one item once it has."""
    device = sess._runner.backend_device
    finish = device.read_async_finish
    failed: list[int] = []

    def failing_once(*args: Any) -> Any:
        if not failed:
            failed.append(1)
            raise DeviceError("read_async_finish failed (a test)")
        return finish(*args)

    monkeypatch.setattr(device, "read_async_finish", failing_once)
    return failed


def test_a_read_that_fails_after_a_replay_was_submitted_is_noted_not_raised(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, four_slots: int
) -> None:
    """A read of the ring that fails when a later replay finishes it (after that replay's submit): the replay
    returns (its own work was submitted, its result right), the read's runs are lost, and the trace says why in
    ``otherData.timing_errors``; the other runs keep their own timestamps."""
    with InferenceSession(MODEL, env=env, graph_capture=True, profile_file_prefix=str(tmp_path / "p")) as sess:
        x_value, y_value, graph = captured(sess)
        failed = finish_fails_once(sess, monkeypatch)
        sess.start_profiling()
        runs = record_runs(sess, monkeypatch)
        for _ in range(6):
            x = image()
            x_value.update_inplace(x)
            graph.replay()
            assert_reference(y_value.to_numpy(), x)
        trace = load(sess.end_profiling())
        graph.release()
    assert failed
    lost = [run for run in runs if run.ticks is _LOST]
    assert len(lost) == 2  # the two runs of the first read (half of the four slots)
    assert_own_ticks([run for run in runs if run.ticks is not _LOST], queries=3)
    assert len(spans(trace)) == 4
    assert any("read_async_finish failed (a test)" in error for error in trace["otherData"]["timing_errors"])


def test_a_read_a_replay_must_wait_for_that_fails_is_noted_and_the_replay_goes_on(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, four_slots: int
) -> None:
    """Reads that never complete on their own hold every slot, so the fifth replay must finish the oldest before
    its submit; that finish fails: the replay still runs (its result right), the read's runs are lost and the
    trace says why."""
    with InferenceSession(MODEL, env=env, graph_capture=True, profile_file_prefix=str(tmp_path / "p")) as sess:
        x_value, y_value, graph = captured(sess)
        calls = Calls(sess, monkeypatch)
        failed = finish_fails_once(sess, monkeypatch)
        sess.start_profiling()
        runs = record_runs(sess, monkeypatch)
        calls.done = lambda: False
        for _ in range(4):
            graph.replay()
        calls.take()
        x = image()
        x_value.update_inplace(x)
        graph.replay()
        assert_reference(y_value.to_numpy(), x)
        assert failed and calls.take()[-2:] == ["submit", "done=False"]
        calls.done = None
        trace = load(sess.end_profiling())
        graph.release()
    assert [run.ticks is _LOST for run in runs] == [True, True, False, False, False]
    assert_own_ticks(runs[2:], queries=3)
    assert len(spans(trace)) == 3
    assert any("read_async_finish failed (a test)" in error for error in trace["otherData"]["timing_errors"])


def test_two_sessions_in_two_threads_each_get_their_own(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, four_slots: int
) -> None:
    """Two profiled sessions replaying in two threads (reads started and finished in both, concurrently): each
    trace holds its own session's replays only, all of them, from its own thread, each with its own timestamps."""
    count = 30
    results: dict[int, tuple[dict[str, Any], list[_GpuRun], int, int]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def work(index: int) -> None:
        try:
            with InferenceSession(
                MODEL, env=env, graph_capture=True, profile_file_prefix=str(tmp_path / f"t{index}")
            ) as sess:
                x_value, y_value, graph = captured(sess)
                sess.start_profiling()
                runs = record_runs(sess, monkeypatch)
                barrier.wait()
                for step in range(count):
                    x = image()
                    x_value.update_inplace(x)
                    graph.replay()
                    if step % 4 == 3:
                        assert_reference(y_value.to_numpy(), x)
                trace = load(sess.end_profiling())
                graph.release()
                results[index] = (trace, runs, sess.session_id, threading.get_native_id())
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert results[0][2] != results[1][2]
    for trace, runs, session_id, tid in results.values():
        replays = spans(trace)
        assert len(replays) == count
        assert all(e["pid"] == session_id for e in trace["traceEvents"])
        assert all(e["tid"] == tid for e in replays)
        assert_own_ticks(runs, queries=3)


def test_timers_without_reads_that_do_not_wait(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, four_slots: int
) -> None:
    """A device without read_async (ASYNC_READS off models it): the ring is read by a read that waits, when full."""
    monkeypatch.setattr(_gpu_step_timer, "ASYNC_READS", False)
    with InferenceSession(MODEL, env=env, graph_capture=True, profile_file_prefix=str(tmp_path / "p")) as sess:
        _, _, graph = captured(sess)
        calls = Calls(sess, monkeypatch)
        sess.start_profiling()
        runs = record_runs(sess, monkeypatch)
        for _ in range(5):
            graph.replay()
        assert calls.take() == ["submit"] * 4 + ["read", "submit"]
        sess.end_profiling()
        graph.release()
    assert_own_ticks(runs, queries=3)


def test_read_async_of_the_backends(device: ortgpu_core.Device) -> None:
    """The backends' read_async: the bytes after the submitted commands (a write then a copy), once done; finish
    copies them out once (again: refused); cancel is harmless after finish and twice."""
    native = device._native_device()
    buffer, source = native.create_buffer(256), native.create_buffer(256)
    try:
        native.write_buffer(buffer, 0, bytes(range(256)))
        native.write_buffer(source, 0, bytes(range(100, 164)) + bytes(192))
        commands = CommandList()
        commands.add_copy(source, 0, buffer, 192, 64)
        ticket = native.read_async(commands, buffer, 64, 192)
        for _ in range(1000):
            if native.read_async_done(ticket):
                break
            native.wait_idle()
        assert native.read_async_done(ticket)
        out = np.zeros(190, dtype=np.uint8)
        native.read_async_finish(ticket, out)
        assert out.tolist() == list(range(64, 192)) + list(range(100, 162))
        with pytest.raises(ortgpu_core.ValidationError):
            native.read_async_finish(ticket, out)
        native.read_async_cancel(ticket)
        cancelled = native.read_async(CommandList(), buffer, 0, 64)
        native.read_async_cancel(cancelled)
        native.read_async_cancel(cancelled)
    finally:
        native.destroy_buffer(buffer)
        native.destroy_buffer(source)


def test_serialized_mode_reads_under_the_envs_lock(
    tmp_path: Path, backend_name: str, monkeypatch: pytest.MonkeyPatch, four_slots: int
) -> None:
    """In serialized mode every device operation holds the Env's serial lock: the ring's reads that do not wait
    are started and finished under it too (as the runner's own submits and reads are), and so are the ring's query
    sets and buffer, given back at a record's end and made again by the next record's first replay."""
    from ortgpu._device_caches import _serial_lock

    environment = Env(backend=backend_name, execution_mode="serialized")
    try:
        lock = _serial_lock(environment)
        held: list[tuple[str, bool]] = []
        with InferenceSession(
            MODEL, env=environment, graph_capture=True, profile_file_prefix=str(tmp_path / "p")
        ) as sess:
            _, _, graph = captured(sess)
            device = sess._runner.backend_device

            def checking(name: str, call: Callable[..., Any]) -> Callable[..., Any]:
                def checked(*args: Any, **kwargs: Any) -> Any:
                    held.append((name, lock._is_owned()))  # type: ignore[attr-defined]
                    return call(*args, **kwargs)

                return checked

            calls = ("read_async", "read_async_finish", "create_query_set", "create_query_resolve_buffer")
            for name in (*calls, "release_query_set"):
                monkeypatch.setattr(device, name, checking(name, getattr(device, name)))
            sess.start_profiling()
            for _ in range(7):
                graph.replay()
            assert len(spans(load(sess.end_profiling()))) == 7
            sess.start_profiling()  # the ring was given back: made again (under the lock) by the first replay
            for _ in range(7):
                graph.replay()
            assert len(spans(load(sess.end_profiling()))) == 7
            graph.release()
        assert {name for name, _ in held} == {*calls, "release_query_set"}
        assert all(owned for _, owned in held), held
    finally:
        environment.close()


def test_each_replay_names_the_list_the_next_one_submits(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ring's slots have lists of their own, used in turn; each profiled replay tells its submit which list the
    next replay will submit (``encode_next``: the wgpu backend encodes that one's command buffer ahead, just before
    its use, instead of the submitted one's), and the next replay takes that slot.  Checked over three laps of the
    ring with runs timed per step (one in 3) and whole, reads of the ring in between: every hint is the list the
    next replay submits, every replay whose next list exists already gives one unless no slot was free, and every
    result and every run's timestamps are right."""
    submitted: list[tuple[CommandList, CommandList | None]] = []
    with InferenceSession(
        MODEL, env=env, graph_capture=True, profile_detail_every=3, profile_file_prefix=str(tmp_path / "p")
    ) as sess:
        x_value, y_value, graph = captured(sess)
        runner = sess._runner
        submit = runner.submit

        def recording(commands: CommandList, read_ahead: Any = (), encode_next: CommandList | None = None) -> None:
            submitted.append((commands, encode_next))
            submit(commands, read_ahead, encode_next)

        monkeypatch.setattr(runner, "submit", recording)
        sess.start_profiling()
        runs = record_runs(sess, monkeypatch)
        timer = None
        laps = 3 * _profiling.RING_SLOTS
        no_slot_free = []
        for index in range(laps):
            x = image()
            x_value.update_inplace(x)
            graph.replay()
            assert_reference(y_value.to_numpy(), x)
            timer = timer or next(iter(runner.profiler._timers))  # type: ignore[union-attr]
            if not timer._free:
                no_slot_free.append(index)
        sess.end_profiling()
        graph.release()
    assert len(submitted) == laps
    seen: set[int] = set()
    hinted = 0
    for index, ((commands, hint), (following, _)) in enumerate(zip(submitted, submitted[1:])):
        seen.add(id(commands))
        assert hint is None or hint is following, index
        if id(following) in seen and index not in no_slot_free:  # its list existed, and a slot was free: named
            assert hint is following, index
        hinted += hint is not None
    assert hinted >= laps // 2, hinted
    assert_own_ticks(runs, queries=3)


def test_runs_timed_whole_are_resolved_by_the_read_of_the_ring(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run timed per step resolves its own timestamps after its work; runs timed whole write their two into the
    span query set and leave them there: the read of the ring resolves them all with one resolve, then copies.
    Every run still gets its own timestamps."""
    submitted: list[list[str]] = []
    resolves: list[list[tuple[Any, ...]]] = []
    with InferenceSession(
        MODEL, env=env, graph_capture=True, profile_detail_every=1000, profile_file_prefix=str(tmp_path / "p")
    ) as sess:
        x_value, y_value, graph = captured(sess)
        runner = sess._runner
        submit = runner.submit
        device = runner.backend_device
        read_async = device.read_async

        def recording(commands: CommandList, read_ahead: Any = (), encode_next: CommandList | None = None) -> None:
            submitted.append([r[0] for r in commands.records() if r[0] in ("timestamp", "resolve")])
            submit(commands, read_ahead, encode_next)

        def reading(commands: CommandList, buffer: int, offset: int, size: int) -> Any:
            resolves.append([r for r in commands.records() if r[0] == "resolve"])
            return read_async(commands, buffer, offset, size)

        monkeypatch.setattr(runner, "submit", recording)
        monkeypatch.setattr(device, "read_async", reading)
        sess.start_profiling()
        runs = record_runs(sess, monkeypatch)
        for _ in range(60):
            x = image()
            x_value.update_inplace(x)
            graph.replay()
            assert_reference(y_value.to_numpy(), x)
        timer = next(iter(runner.profiler._timers))  # type: ignore[union-attr]
        assert timer._read_at == 48
        span_query_set = timer.span_query_set
        path = sess.end_profiling()
        graph.release()
    assert submitted[0] == ["timestamp"] * 3 + ["resolve"]  # the first replay: per step
    assert all(kinds == ["timestamp"] * 2 for kinds in submitted[1:]), submitted
    assert len(resolves) == 1 and len(resolves[0]) == 1  # one read started (at 48 pending), one resolve in it
    (_, query_set, first, count, _, _) = resolves[0][0]
    assert query_set == span_query_set and first % 2 == 0 and count >= 2 * 47
    assert_own_ticks(runs, queries=3)
    replays = spans(load(path))
    assert len(replays) == 60 and all(r["args"]["gpu_ns"] > 0 for r in replays)


def test_a_slot_gets_its_per_step_query_set_only_when_a_run_timed_per_step_takes_it(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs timed whole write the span query set: a ring's slots make their own query sets (for runs timed per
    step) only when such a run takes them (or is expected to take them next), so 40 replays with one in 20 timed per
    step make the span query set and three slots' of 64; all are given back when the record ends."""
    with InferenceSession(
        MODEL, env=env, graph_capture=True, profile_detail_every=20, profile_file_prefix=str(tmp_path / "p")
    ) as sess:
        x_value, y_value, graph = captured(sess)
        device = sess._runner.backend_device
        made: list[int] = []
        create = device.create_query_set

        def counting(count: int, *, label: str = "") -> int:
            made.append(count)
            return create(count, label=label)

        monkeypatch.setattr(device, "create_query_set", counting)
        before = device.live_handles()
        sess.start_profiling()
        for _ in range(40):
            x = image()
            x_value.update_inplace(x)
            graph.replay()
            assert_reference(y_value.to_numpy(), x)
        timer = next(iter(sess._runner.profiler._timers))  # type: ignore[union-attr]
        # the span query set, then slot 0's (replay 0), slot 1's (replay 20: slot 0 is still pending, not read yet)
        # and slot 2's (the slot the 41st replay, timed per step, is expected to take: its list is made ahead)
        assert made == [2 * timer.slots] + [timer.queries] * 3
        assert [bool(query_set) for query_set in timer.query_sets[:4]] == [True, True, True, False]
        replays = spans(load(sess.end_profiling()))
        assert device.live_handles() == before
        graph.release()
    assert [r["args"]["detail"] for r in replays] == [i % 20 == 0 for i in range(40)]
