"""Issue 15's guarantees for sessions sharing a device, as tests.

* ``serialized`` mode: the fake backend's record of device operations by thread (``FakeBackend.operation_log``)
  shows no two operations of different threads overlapping, over session creation, runs, capture, replay,
  allocation, transfers and close; in ``concurrent`` mode, with the same work and operations that take time
  (``operations.set_latency``), they do overlap.  ``$ORTGPU_EXECUTION_MODE`` picks the mode.
* Ordering (onnxruntime's "C3"): values allocated and uploaded through the Env-shared allocator from one thread,
  while another thread's session runs and buffers are freed and reused, always hold what was uploaded when the
  next run reads them, on both backends; with the fake's zero-fill deferred to the next submit (the ordering rule
  removed, ``faults.defer_zero_fill()``) the same workload sees wrong values, so the check would catch the hazard.
* K threads x M sessions x R runs with distinct inputs, both modes, both backends: every output is its reference.
* Error isolation: a validation error or out-of-memory injected into one thread's run reaches that caller only;
  the other thread's session, running meanwhile, sees nothing, and both sessions stay usable.
"""

from __future__ import annotations

import collections
import gc
import threading
from typing import Callable, Literal

import numpy as np
import onnxruntime
import pytest
from conftest import owned_handles

import ortgpu
from bench.models import mlp
from ortgpu_core._errors import InvalidArgumentError, OutOfMemoryError, ValidationError
from ortgpu_core.backends._commands import CommandList
from ortgpu_core.backends._fake_oplog import FakeOperation, overlapping
from ortgpu_core.backends.fake import FakeBackend

Mode = Literal["concurrent", "serialized"]
WIDTH = 16
BATCH = 2
MODELS = [mlp(layers=2, width=WIDTH, batch=BATCH, seed=seed).SerializeToString() for seed in (11, 12, 13, 14)]
_REFERENCE_SESSIONS = [onnxruntime.InferenceSession(m, providers=["CPUExecutionProvider"]) for m in MODELS]


def reference(model: int, x: np.ndarray) -> np.ndarray:
    return np.asarray(_REFERENCE_SESSIONS[model].run(None, {"X": x})[0])


def distinct_input(*key: int, batch: int = BATCH) -> np.ndarray:
    """An input no other (thread, session, run) gets."""
    return np.random.default_rng(list(key)).standard_normal((batch, WIDTH)).astype(np.float32)


def close(actual: np.ndarray, expected: np.ndarray) -> bool:
    return actual.shape == expected.shape and bool(np.allclose(actual, expected, rtol=1e-5, atol=1e-5))


def run_threads(targets: list[Callable[[], None]], timeout: float = 120) -> None:
    """Run each target in its own thread; re-raise the first failure here; fail on a hang."""
    failures: list[BaseException] = []

    def guarded(target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as error:  # noqa: BLE001 - reported in the calling thread
            failures.append(error)

    threads = [threading.Thread(target=guarded, args=(t,), name=f"worker-{i}") for i, t in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a worker thread hung"
    if failures:
        raise failures[0]


# -- serialized mode: no overlapping device operations ---------------------------------------------------------


def device_workload(env: ortgpu.Env, model: int, worker: int, start: threading.Barrier) -> None:
    """Every kind of device operation a user's thread makes: session creation (pipelines, weights), runs,
    capture and replay, allocation and uploads through the Env-shared allocator, a device copy, reads, close."""
    start.wait()
    sess = ortgpu.InferenceSession(MODELS[model], env=env, graph_capture=True)
    shared = env.shared_allocator()
    for run in range(2):
        x = distinct_input(worker, run)
        (y,) = sess.run(None, {"X": x})
        assert close(y, reference(model, x))
    x_value = shared.from_numpy(distinct_input(worker, 0))
    y_value = sess.allocator.empty((BATCH, WIDTH), "float32")
    binding = sess.io_binding()
    binding.bind_input("X", x_value)
    binding.bind_output("Y", y_value)
    with sess.capture(binding, graph_id=0) as graph:
        for run in range(3):
            x = distinct_input(worker, 10 + run)
            x_value.update_inplace(x)
            graph.replay()
            assert close(y_value.to_numpy(), reference(model, x))
    copied = shared.empty((BATCH, WIDTH), "float32")
    copied.copy_from(y_value)
    assert close(copied.to_numpy(), reference(model, distinct_input(worker, 12)))
    for value in (copied, x_value, y_value):
        value.release()
    sess.close()


def recorded_workload(mode: Mode, threads: int = 3) -> list[FakeOperation]:
    backend = FakeBackend()
    # Operations that take time, outside the fake's lock, as a real device's do: overlap has room to happen.
    backend.operations.set_latency(submit=0.002, write=0.0005, read=0.0005, allocate=0.0005, pipeline=0.0005)
    with ortgpu.Env(backend=backend, execution_mode=mode) as env:
        backend.operations.enable()
        start = threading.Barrier(threads)
        run_threads([lambda i=i: device_workload(env, i, i, start) for i in range(threads)])  # type: ignore[misc]
        backend.operations.disable()
    return backend.operation_log()


def describe(pairs: list[tuple[FakeOperation, FakeOperation]]) -> str:
    kinds = collections.Counter(tuple(sorted((a.kind, b.kind))) for a, b in pairs)
    return ", ".join(f"{a}/{b}: {n}" for (a, b), n in kinds.most_common())


def test_serialized_mode_runs_every_device_operation_alone() -> None:
    operations = recorded_workload("serialized")
    kinds = {op.kind for op in operations}
    assert {"allocate", "write", "submit", "read", "pipeline", "bind_group", "release"} <= kinds, kinds
    assert len({op.thread for op in operations}) >= 3
    pairs = overlapping(operations)
    assert not pairs, f"{len(pairs)} pairs of device operations of different threads overlapped: {describe(pairs)}"


def test_concurrent_mode_lets_device_operations_overlap() -> None:
    operations = recorded_workload("concurrent")
    pairs = overlapping(operations)
    submits = [(a, b) for a, b in pairs if a.kind == b.kind == "submit"]
    # Three threads each submitting with 2 ms of latency: their submits run side by side.
    assert submits, f"no two submits overlapped in concurrent mode (overlaps: {describe(pairs) or 'none'})"
    # A read (waiting for the device) holds nothing another thread's submission needs.
    waits = [(a, b) for a, b in pairs if {a.kind, b.kind} == {"read", "submit"}]
    assert waits, f"no read overlapped another thread's submit in concurrent mode (overlaps: {describe(pairs)})"


def test_execution_mode_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORTGPU_EXECUTION_MODE", "serialized")
    with ortgpu.Env(backend="fake") as env:
        assert env.execution_mode == "serialized"
        assert "serialized" in repr(env.default_device._native_device())
    with ortgpu.Env(backend="fake", execution_mode="concurrent") as env:  # the argument wins
        assert env.execution_mode == "concurrent"
    monkeypatch.setenv("ORTGPU_EXECUTION_MODE", "sequential")
    with pytest.raises(InvalidArgumentError, match="ORTGPU_EXECUTION_MODE"):
        ortgpu.Env(backend="fake")
    monkeypatch.delenv("ORTGPU_EXECUTION_MODE")
    with ortgpu.Env(backend="fake") as env:
        assert env.execution_mode == "concurrent"


def test_the_operation_log_is_bounded_off_by_default_and_records_outermost_calls() -> None:
    backend = FakeBackend()
    device = backend.open_device(0)
    buffer = device.create_buffer(16)
    assert backend.operation_log() == []  # off by default
    backend.operations.enable(capacity=5)
    out = bytearray(16)
    device.submit_and_read(CommandList(), [(buffer, 0, out)])  # one operation: its submit and read are inside it
    assert [(op.kind, op.thread_name, op.failed) for op in backend.operation_log()] == [
        ("submit", threading.current_thread().name, False)
    ]
    with pytest.raises(ValidationError):
        device.write_buffer(buffer, 2, b"1234")  # unaligned: recorded as failed
    assert backend.operation_log()[-1].kind == "write" and backend.operation_log()[-1].failed
    for _ in range(10):
        device.read_buffer(buffer, 0, 4)
    log = backend.operation_log()
    assert len(log) == 5 and all(op.kind == "read" for op in log)  # a ring of the last 5
    assert all(a.end <= b.start for a, b in zip(log, log[1:]))
    with pytest.raises(InvalidArgumentError):
        backend.operations.set_latency(sumbit=0.001)
    backend.operations.disable()
    device.destroy_buffer(buffer)
    assert len(backend.operation_log()) == 5
    device.destroy()


# -- ordering: the C3 hazard -------------------------------------------------------------------------------------


def c3_workload(env: ortgpu.Env, rounds: int, arm: Callable[[], None] = lambda: None) -> list[str]:
    """Thread A runs session 0 over and over; this thread allocates a value through the Env-shared allocator
    (releasing the previous one, so memory is reused), uploads into it, and runs session 1 on it.  ``arm`` runs
    once both sessions are warm.  Returns the wrong results seen, by either thread."""
    sessions = [ortgpu.InferenceSession(MODELS[m], env=env) for m in (0, 1)]
    shared = env.shared_allocator()
    wrong: list[str] = []
    try:
        for m, sess in enumerate(sessions):  # plans, pipelines and weights exist before the race starts
            sess.run(None, {"X": distinct_input(99, m)})
        arm()
        stop = threading.Event()
        started = threading.Event()

        def other_session() -> None:
            run = 0
            while not stop.is_set() or run < 3:
                x = distinct_input(1, run)
                (y,) = sessions[0].run(None, {"X": x})
                if not close(y, reference(0, x)):
                    wrong.append(f"session 0, run {run}")
                run += 1
                started.set()

        thread = threading.Thread(target=other_session)
        thread.start()
        try:
            started.wait(timeout=60)
            previous = None
            for step in range(rounds):
                x = distinct_input(2, step)
                if step % 2:
                    value = shared.empty((BATCH, WIDTH), "float32")
                    value.update_inplace(x)
                else:
                    value = shared.from_numpy(x)
                if previous is not None:
                    previous.release()
                output = sessions[1].allocator.empty((BATCH, WIDTH), "float32")
                binding = sessions[1].io_binding()
                binding.bind_input("X", value)
                binding.bind_output("Y", output)
                sessions[1].run_with_iobinding(binding)
                if not close(output.to_numpy(), reference(1, x)):
                    wrong.append(f"session 1 on a shared upload, step {step}")
                output.release()
                previous = value
            if previous is not None:
                previous.release()
        finally:
            stop.set()
            thread.join(timeout=60)
        assert not thread.is_alive(), "the other session's thread hung"
    finally:
        for sess in sessions:
            sess.close()
    return wrong


def test_shared_uploads_are_never_cleared_under_a_running_session(backend_name: str) -> None:
    with ortgpu.Env(backend=backend_name) as env:  # type: ignore[arg-type]
        wrong = c3_workload(env, rounds=12)
        assert not wrong, f"wrong results: {wrong}"
        gc.collect()
        assert owned_handles(env) == 0, "the workload leaked device objects"


def test_the_c3_check_catches_a_clear_landing_after_an_upload() -> None:
    """The ordering rule removed (the fake defers each new buffer's zero-fill to the next submit): the same
    workload then reads wiped uploads, so the test above would fail."""
    backend = FakeBackend()
    with ortgpu.Env(backend=backend) as env:
        wrong = c3_workload(env, rounds=6, arm=backend.faults.defer_zero_fill)
        backend.faults.defer_zero_fill(False)
    assert any("shared upload" in w for w in wrong), wrong


# -- K threads x M sessions x R runs -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["concurrent", "serialized"])
def test_threads_sessions_runs_all_give_their_references(backend_name: str, mode: Mode) -> None:
    threads, sessions_per_thread, runs = 3, 2, 3
    with ortgpu.Env(backend=backend_name, execution_mode=mode) as env:  # type: ignore[arg-type]
        sessions = [
            [ortgpu.InferenceSession(MODELS[(t + s) % len(MODELS)], env=env) for s in range(sessions_per_thread)]
            for t in range(threads)
        ]
        start = threading.Barrier(threads)

        def work(t: int) -> None:
            start.wait()
            for r in range(runs):
                for s, sess in enumerate(sessions[t]):
                    x = distinct_input(t, s, r)
                    (y,) = sess.run(None, {"X": x})
                    model = (t + s) % len(MODELS)
                    assert close(y, reference(model, x)), f"thread {t}, session {s}, run {r}"

        run_threads([lambda t=t: work(t) for t in range(threads)])  # type: ignore[misc]
        for row in sessions:
            for sess in row:
                sess.close()
        gc.collect()
        assert owned_handles(env) == 0, "the sessions leaked device objects"


# -- error isolation ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["validation_error_on_submit", "out_of_memory_on_allocation"])
def test_a_fault_in_one_threads_run_reaches_that_caller_only(fault: str) -> None:
    backend = FakeBackend()
    with ortgpu.Env(backend=backend) as env:
        faulty, healthy = (ortgpu.InferenceSession(MODELS[m], env=env) for m in (0, 1))
        for m, sess in enumerate((faulty, healthy)):
            sess.run(None, {"X": distinct_input(98, m)})
        injected = threading.Event()
        done = threading.Event()
        healthy_runs = [0]

        def run_healthy() -> None:
            run = 0
            while not done.is_set() or run < 5:  # runs before, during and after the fault
                x = distinct_input(3, run)
                (y,) = healthy.run(None, {"X": x})
                assert close(y, reference(1, x)), f"healthy session, run {run}"
                run += 1
                healthy_runs[0] = run
                if run == 3:
                    injected.wait(timeout=60)

        def run_faulty() -> None:
            try:
                me = threading.get_ident()
                if fault == "validation_error_on_submit":
                    backend.faults.validation_error_on_submit(1, thread=me)
                    expected: type[Exception] = ValidationError
                    x = distinct_input(4, 0)
                else:
                    backend.faults.out_of_memory_on_allocation(1, thread=me)
                    expected = OutOfMemoryError
                    x = distinct_input(4, 0, batch=BATCH + 3)  # a new shape: the run plans and allocates
                injected.set()
                with pytest.raises(expected, match="injected"):
                    faulty.run(None, {"X": x})
                for run in range(3):  # the failing session stays usable, the new shape included
                    x = distinct_input(5, run, batch=BATCH + run)
                    (y,) = faulty.run(None, {"X": x})
                    assert close(y, reference(0, x)), f"faulty session after the fault, run {run}"
            finally:
                injected.set()
                done.set()

        run_threads([run_healthy, run_faulty])
        assert not backend.faults.pending
        assert healthy_runs[0] >= 5
        faulty.close()
        healthy.close()
        gc.collect()
        assert owned_handles(env) == 0, backend.describe_live_handles()
