"""Safe graph capture and replay (issue 4): every guarantee, on both backends.

The model is a tiny MLP (``models.mlp(layers=2, width=16)``, input ``X [batch, 16]``,
output ``Y``); references come from onnxruntime's CPU provider on the *current*
inputs, and consecutive inputs always give different outputs, so a stale replay fails.
Errors are checked by type and by the fragments of their message that name the
object and the fix.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
import weakref
from typing import Any, Callable, Iterator

import models
import numpy as np
import onnx
import onnxruntime
import pytest
from conftest import owned_handles
from onnx import TensorProto, helper, numpy_helper

from ortgpu import (
    CapturedGraph,
    CaptureStateError,
    DtypeError,
    Env,
    FrozenIOBinding,
    InferenceSession,
    InvalidArgumentError,
    IOBinding,
    OrtValue,
    OutOfMemoryError,
    ProvenanceError,
    ReleasedValueError,
    RunOptions,
    ShapeError,
    UnsafeAccessError,
    ValidationError,
)
from ortgpu_core._value import DeviceBuffer
from ortgpu_core.backends.fake import FakeBackend, FakeDeviceSpec

BATCH, WIDTH = 2, 16
MODEL = models.mlp(layers=2, width=WIDTH, batch=BATCH).SerializeToString()
_ORT = onnxruntime.InferenceSession(MODEL, providers=["CPUExecutionProvider"])


def reference(x: np.ndarray) -> np.ndarray:
    return np.asarray(_ORT.run(None, {"X": x})[0])


def assert_reference(got: np.ndarray, x: np.ndarray) -> None:
    np.testing.assert_allclose(got, reference(x), rtol=1e-5, atol=1e-5)


_rng = np.random.default_rng(4)


def image(batch: int = BATCH) -> np.ndarray:
    return _rng.standard_normal((batch, WIDTH)).astype(np.float32)


@contextlib.contextmanager
def raises(error: type[BaseException], *fragments: str) -> Iterator[None]:
    """Expect ``error`` (exactly that class or a subclass) whose message contains every fragment."""
    with pytest.raises(error) as info:
        yield
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in the {type(info.value).__name__} message: {message!r}"


def cpu_node_model(kind: str) -> bytes:
    """``Y = 2 * X`` computed through float64 or int64 arithmetic, which runs on the CPU."""
    wide = TensorProto.DOUBLE if kind == "float64" else TensorProto.INT64
    two = np.array([2.0]) if kind == "float64" else np.array([2], np.int64)
    nodes = [
        helper.make_node("Cast", ["X"], ["wide_x"], to=wide, name="to_wide"),
        helper.make_node("Mul", ["wide_x", "two"], ["wide_y"], name="wide_mul"),
        helper.make_node("Cast", ["wide_y"], ["Y"], to=TensorProto.FLOAT, name="to_float"),
    ]
    graph = helper.make_graph(
        nodes,
        "cpu_node",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [BATCH, WIDTH])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [BATCH, WIDTH])],
        [numpy_helper.from_array(two, "two")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


# -- fixtures and helpers ------------------------------------------------------------------------


@pytest.fixture
def session(env: Env) -> Iterator[InferenceSession]:
    sess = InferenceSession(MODEL, env=env, device=env.default_device, graph_capture=True)
    yield sess
    sess.close()


def bound(
    sess: InferenceSession, *, shared: bool = False, x: np.ndarray | None = None
) -> tuple[IOBinding, OrtValue[Any], OrtValue[Any]]:
    """A binding of fresh device values: input ``x`` (uploaded) and a zero output."""
    allocator = sess.env.shared_allocator(sess.device) if shared else sess.allocator
    x_value = allocator.from_numpy(image() if x is None else x)
    y_value = allocator.empty((BATCH, WIDTH), "float32")
    binding = sess.io_binding()
    binding.bind_input("X", x_value)
    binding.bind_output("Y", y_value)
    return binding, x_value, y_value


def buffer(value: OrtValue[Any]) -> DeviceBuffer:
    """The device buffer behind a device value."""
    assert value._device_buffer is not None, "a device value has a buffer"
    return value._device_buffer


def submits(env: Env) -> int | None:
    """Submits executed by the fake device (None on wgpu, which does not count them)."""
    device = env.default_device._native_device()
    stats = getattr(device, "stats", None)
    return None if stats is None else int(stats.submits)


@contextlib.contextmanager
def wrapped_submit(env: Env, wrapper: Callable[[Callable[[Any], None], Any], None]) -> Iterator[None]:
    """Route every submit of the env's default backend device through ``wrapper(original, commands)``."""
    device = env.default_device._native_device()
    original = device.submit
    device.submit = lambda commands, *rest: wrapper(  # type: ignore[method-assign]
        lambda listed: original(listed, *rest),
        commands,  # (rest: a replay's read_ahead ranges)
    )
    try:
        yield
    finally:
        del device.submit


def assert_mutable(binding: IOBinding, sess: InferenceSession) -> None:
    """The binding accepts a rebind (and is put back as it was)."""
    assert binding.captured_by == ()
    previous = binding.inputs()["X"]
    probe = sess.allocator.empty((BATCH, WIDTH), "float32")
    binding.bind_input("X", probe)
    binding.bind_input("X", previous)
    probe.release()


# -- the workflow ------------------------------------------------------------------------------------


def test_every_replay_reads_the_current_inputs(session: InferenceSession) -> None:
    """The "every image returns the first image's result" report: never stale."""
    binding, x, y = bound(session)
    first = x.to_numpy()
    with session.capture(binding, graph_id=0) as graph:
        assert_reference(y.to_numpy(), first)  # the capture run itself
        results = []
        for _ in range(5):
            batch = image()
            x.update_inplace(batch)
            graph.replay()
            out = y.to_numpy()
            assert_reference(out, batch)
            results.append(out)
        assert graph.replays == 5
    for earlier, later in zip(results, results[1:]):
        assert not np.allclose(earlier, later), "different images must give different results"
    assert graph.released


def test_copy_outputs_to_cpu_and_copy_from_between_replays(session: InferenceSession, env: Env) -> None:
    binding, x, y = bound(session)
    staging = env.shared_allocator(env.default_device).from_numpy(image())
    graph = session.capture(binding, graph_id=0)
    x.copy_from(staging)  # a same-device copy into the pinned input
    graph.replay()
    (out,) = binding.copy_outputs_to_cpu()
    assert_reference(out, staging.to_numpy())
    assert_reference(graph.binding.copy_outputs_to_cpu()[0], staging.to_numpy())
    graph.release()
    staging.release()


def test_replay_and_read_is_replay_then_copy_outputs_in_one_submission(session: InferenceSession, env: Env) -> None:
    """Every call reads the outputs of that call's replay (never an earlier one); one submit per call on the fake
    device (the output copies ride in the replay's submission); the bound output values hold the same result."""
    binding, x, y = bound(session)
    graph = session.capture(binding, graph_id=0)
    before = submits(env)
    previous = None
    for call in range(3):
        batch = image()
        x.update_inplace(batch)
        (out,) = graph.replay_and_read()
        assert isinstance(out, np.ndarray) and out.shape == (BATCH, WIDTH) and out.dtype == np.float32
        assert_reference(out, batch)
        np.testing.assert_array_equal(out, y.to_numpy())
        if previous is not None:
            assert not np.allclose(out, previous)
        previous = out
        assert graph.replays == call + 1
    if before is not None:
        assert submits(env) == before + 3
    graph.release()
    with raises(CaptureStateError, "was released", "capture it again"):
        graph.replay_and_read()


def test_alternating_replays_stay_fresh_and_release_frees_everything(session: InferenceSession, env: Env) -> None:
    """replay() and replay_and_read() alternating, inputs changed before each: every result is the current input's.
    On wgpu the capture run encodes the first replay's command buffer, and each path then keeps one encoded ahead (replay() with its outputs read ahead)
    (encode_ahead), which the graph's release frees with the rest of its native objects, while the session stays
    open."""
    binding, x, y = bound(session)
    session.capture(binding, graph_id=1).release()  # the session's own state (its uploaded weights) exists now
    before = owned_handles(env)
    device = env.default_device._native_device()

    def encoded_ahead() -> int:
        describe = getattr(device, "describe_live_handles", None)
        return 0 if describe is None else sum("encoded ahead" in line for line in describe())

    graph = session.capture(binding, graph_id=0)
    assert encoded_ahead() == (1 if env.backend.name == "wgpu" else 0)  # the capture run left the first replay's
    for step in range(6):
        batch = image()
        x.update_inplace(batch)
        if step % 2:
            (out,) = graph.replay_and_read()
        else:
            graph.replay()
            out = y.to_numpy()
        assert_reference(out, batch)
    # wgpu: the capture run's (no tail), replay()'s (its outputs read ahead: a copy tail) and replay_and_read()'s
    assert encoded_ahead() == (3 if env.backend.name == "wgpu" else 0)
    graph.release()
    assert encoded_ahead() == 0
    assert owned_handles(env) == before


def test_replay_and_read_in_verify_mode_still_verifies(env: Env) -> None:
    with InferenceSession(MODEL, env=env, graph_capture=True, verify_replays=True) as sess:
        binding, x, y = bound(sess)
        graph = sess.capture(binding, graph_id=0)
        batch = image()
        x.update_inplace(batch)
        (out,) = graph.replay_and_read()
        assert_reference(out, batch)
        with wrapped_submit(env, _drop_graph_replays):
            with raises(CaptureStateError, "verify: output 'Y'"):
                graph.replay_and_read()
        graph.release()


def test_capture_from_a_frozen_binding_and_typestate(session: InferenceSession) -> None:
    binding, x, y = bound(session)
    frozen = binding.freeze()
    assert isinstance(frozen, FrozenIOBinding) and frozen.origin is binding
    for method in (
        "bind_input",
        "bind_output",
        "bind_cpu_input",
        "clear_binding_inputs",
        "clear_binding_outputs",
        "freeze",
    ):
        assert not hasattr(frozen, method), method
    assert not hasattr(binding, "replay")
    graph = session.capture(frozen, graph_id=3)
    assert isinstance(graph, CapturedGraph) and graph.graph_id == 3
    assert graph.binding is frozen
    with raises(
        CaptureStateError, "cannot bind input 'X'", "captured by graph 3 of session", "release_captured_graph(3)"
    ):
        binding.bind_input("X", x)
    batch = image()
    x.update_inplace(batch)
    graph.replay()
    assert_reference(y.to_numpy(), batch)
    assert graph.release() is binding
    assert_mutable(binding, session)


def test_release_returns_the_binding_mutable_again_and_is_idempotent(session: InferenceSession) -> None:
    binding, x, y = bound(session)
    graph = session.capture(binding, graph_id=0)
    assert binding.captured_by == (graph.label,)
    assert session.captured_graph_ids == [0]
    returned = graph.release()
    assert returned is binding and isinstance(returned, IOBinding)
    assert graph.released and session.captured_graph_ids == []
    assert buffer(x).pins == () and buffer(y).pins == ()
    assert graph.release() is binding  # idempotent
    with raises(
        CaptureStateError,
        "graph 0 of session",
        "was released and can no longer be replayed",
        "session.capture(binding, graph_id=0)",
    ):
        graph.replay()
    # Mutable again: rebind, capture the same id again, and it computes on the new value.
    other = session.allocator.from_numpy(image())
    returned.bind_input("X", other)
    with session.capture(returned, graph_id=0) as again:
        again.replay()
        assert_reference(y.to_numpy(), other.to_numpy())


def test_captured_graph_as_context_manager_releases_on_error(session: InferenceSession) -> None:
    binding, x, y = bound(session)
    with pytest.raises(KeyError):
        with session.capture(binding, graph_id=0) as graph:
            graph.replay()
            raise KeyError("user code failed")
    assert graph.released and session.captured_graph_ids == []
    assert_mutable(binding, session)


def test_release_captured_graph_by_id(session: InferenceSession) -> None:
    binding, x, y = bound(session)
    session.capture(binding, graph_id=2)
    with raises(CaptureStateError, f"session {session.session_id} has no captured graph 1", "capture it first"):
        session.release_captured_graph(1)
    assert session.release_captured_graph(2) is binding
    assert session.captured_graph_ids == []
    with raises(CaptureStateError, "has no captured graph 2"):
        session.release_captured_graph(2)


def test_graph_objects_cannot_be_constructed_directly() -> None:
    with raises(TypeError, "session.capture(binding, graph_id)"):
        CapturedGraph()
    with raises(TypeError, "session.io_binding()"):
        IOBinding()
    with raises(TypeError, "IOBinding.freeze()"):
        FrozenIOBinding()


# -- guarantee: a captured id rejects every other binding until released --------------------------------


def test_captured_binding_rejects_rebinding_and_clearing(session: InferenceSession) -> None:
    binding, x, y = bound(session)
    other = session.allocator.from_numpy(image())
    graph = session.capture(binding, graph_id=0)
    sid = session.session_id
    fix = "Release the graph first (graph.release() or session.release_captured_graph(0))"
    with raises(CaptureStateError, "cannot bind input 'X'", f"captured by graph 0 of session {sid}", fix):
        binding.bind_input("X", other)
    with raises(CaptureStateError, "cannot bind input 'X'", fix):
        binding.bind_ortvalue_input("X", other)
    with raises(CaptureStateError, "cannot bind input 'X'", fix):
        binding.bind_cpu_input("X", image())
    with raises(CaptureStateError, "cannot bind output 'Y'", f"captured by graph 0 of session {sid}", fix):
        binding.bind_output("Y", other)
    with raises(CaptureStateError, "cannot bind output 'Y'", fix):
        binding.bind_ortvalue_output("Y", other)
    with raises(CaptureStateError, "cannot clear the bound inputs", fix):
        binding.clear_binding_inputs()
    with raises(CaptureStateError, "cannot clear the bound outputs", fix):
        binding.clear_binding_outputs()
    # Nothing changed: same values bound, and replay still computes on them.
    assert binding.inputs() == {"X": x} and binding.outputs() == {"Y": y}
    batch = image()
    x.update_inplace(batch)
    session.run_with_iobinding(binding, RunOptions(gpu_graph_id=0))
    assert_reference(y.to_numpy(), batch)
    graph.release()
    binding.bind_input("X", other)
    binding.clear_binding_outputs()
    assert binding.outputs() == {}


def test_captured_id_rejects_a_different_binding(session: InferenceSession) -> None:
    binding, x, y = bound(session)
    other_binding, x2, y2 = bound(session)
    graph = session.capture(binding, graph_id=0)
    before = y2.to_numpy()
    with raises(
        CaptureStateError, "graph 0 of session", "was captured with another binding", "release_captured_graph(0)"
    ):
        session.run_with_iobinding(other_binding, RunOptions(gpu_graph_id=0))
    with raises(CaptureStateError, "graph 0 of session", "is already captured", "release it first"):
        session.capture(other_binding, graph_id=0)
    # A binding of the *same* values is still another binding: refused.
    same_values = session.io_binding()
    same_values.bind_input("X", x)
    same_values.bind_output("Y", y)
    with raises(CaptureStateError, "was captured with another binding"):
        session.run_with_iobinding(same_values, RunOptions(gpu_graph_id=0))
    assert graph.replays == 0
    np.testing.assert_array_equal(y2.to_numpy(), before)  # the refused binding's output was not touched
    assert other_binding.captured_by == ()
    graph.release()
    session.run_with_iobinding(other_binding, RunOptions(gpu_graph_id=0))  # captures with the other binding now
    assert_reference(y2.to_numpy(), x2.to_numpy())
    session.release_captured_graph(0)


def test_snapshot_frozen_before_a_rebind_cannot_be_captured(session: InferenceSession) -> None:
    """Freeze, rebind the origin, capture the snapshot: the locked origin would name another buffer than the
    graph replays (``b.inputs()["X"].update_inplace(...)`` then ``replay()`` would compute on the old input), so
    the capture is refused, naming the fix, and nothing is locked or pinned."""
    binding, x, y = bound(session)
    snapshot = binding.freeze()
    new_input = session.allocator.from_numpy(image())
    binding.bind_input("X", new_input)
    with raises(CaptureStateError, "rebound since", "Capture the IOBinding itself, or freeze it again"):
        session.capture(snapshot, graph_id=0)
    assert binding.captured_by == () and session.captured_graph_ids == []
    assert all(b.pins == () for b in snapshot._pinned_buffers())
    binding.bind_input("X", x)  # still mutable
    # A snapshot that matches its origin captures, and locks the origin naming what the graph replays.
    fresh = binding.freeze()
    graph = session.capture(fresh, graph_id=0)
    assert binding.captured_by == (graph.label,)
    assert binding.signature == graph.binding.signature
    new_batch = image()
    binding.inputs()["X"].update_inplace(new_batch)
    graph.replay()
    assert_reference(y.to_numpy(), new_batch)
    session.run_with_iobinding(binding, RunOptions(gpu_graph_id=0))
    assert graph.replays == 2
    graph.release()
    new_input.release()


def test_signatures_are_buffer_generations_never_native_addresses(session: InferenceSession) -> None:
    binding, x, y = bound(session)
    assert buffer(x).identity == buffer(x).generation
    assert binding.signature == (
        ("input", "X", "webgpu", buffer(x).generation),
        ("output", "Y", "webgpu", buffer(y).generation),
    )
    assert not any(buffer(v).handle in row for v in (x, y) for row in binding.signature)
    assert binding.freeze().signature == binding.signature
    generations = [session.allocator.empty((1,), "float32") for _ in range(3)]
    numbers = [buffer(v).generation for v in generations]
    assert numbers == sorted(numbers) and len(set(numbers)) == 3
    assert buffer(x).generation not in numbers and buffer(y).generation not in numbers
    for value in generations:
        value.release()
    # Rebinding a value with equal contents changes the signature (identity, not data or wrappers).
    twin = session.allocator.from_numpy(x.to_numpy())
    before = binding.signature
    binding.bind_input("X", twin)
    assert binding.signature != before
    binding.bind_input("X", x)
    assert binding.signature == before
    # A snapshot pins exactly the signature's buffers.
    assert [b.generation for b in binding.freeze()._pinned_buffers()] == [row[3] for row in before]
    twin.release()


# -- guarantee: registration is atomic -------------------------------------------------------------------------


def _race(env: Env, jobs: list[Callable[[], Any]]) -> list[Any]:
    """Run ``jobs`` at once (a barrier) while submits are slowed; returns each result or exception."""
    barrier = threading.Barrier(len(jobs))
    results: list[Any] = [None] * len(jobs)

    def slow(original: Callable[[Any], None], commands: Any) -> None:
        time.sleep(0.05)
        original(commands)

    def worker(index: int) -> None:
        barrier.wait()
        try:
            results[index] = jobs[index]()
        except BaseException as error:  # collected and asserted by the test
            results[index] = error

    with wrapped_submit(env, slow):
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(jobs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    return results


def test_two_threads_capturing_one_id_exactly_one_succeeds(session: InferenceSession, env: Env) -> None:
    first, x1, y1 = bound(session)
    second, x2, y2 = bound(session)
    results = _race(env, [lambda: session.capture(first, graph_id=0), lambda: session.capture(second, graph_id=0)])
    graphs = [r for r in results if isinstance(r, CapturedGraph)]
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(graphs) == 1 and len(errors) == 1, results
    assert isinstance(errors[0], CaptureStateError) and "is already captured" in str(errors[0])
    winner, loser = (first, second) if results[0] is graphs[0] else (second, first)
    assert winner.captured_by == (graphs[0].label,)
    assert session.captured_graph_ids == [0]
    assert_mutable(loser, session)
    assert all(b.pins == () for b in loser._pinned_buffers())
    assert all(b.pins == (graphs[0].label,) for b in winner._pinned_buffers())
    graphs[0].replay()
    assert_reference(winner.outputs()["Y"].to_numpy(), winner.inputs()["X"].to_numpy())
    graphs[0].release()


def test_two_threads_capturing_one_binding_lock_it_once(session: InferenceSession, env: Env) -> None:
    binding, x, y = bound(session)
    results = _race(env, [lambda: session.capture(binding, graph_id=5)] * 2)
    graphs = [r for r in results if isinstance(r, CapturedGraph)]
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(graphs) == 1 and len(errors) == 1 and isinstance(errors[0], CaptureStateError), results
    assert binding.captured_by == (graphs[0].label,)  # the loser's failure did not unlock the winner's lock
    assert buffer(x).pins == (graphs[0].label,)
    with raises(CaptureStateError, "captured by graph 5"):
        binding.bind_input("X", x)
    graphs[0].release()
    assert_mutable(binding, session)


def test_two_threads_run_with_iobinding_first_call_one_capture(session: InferenceSession, env: Env) -> None:
    first, x1, y1 = bound(session)
    second, x2, y2 = bound(session)
    options = RunOptions(gpu_graph_id=1)
    results = _race(
        env, [lambda: session.run_with_iobinding(first, options), lambda: session.run_with_iobinding(second, options)]
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(errors) == 1 and isinstance(errors[0], CaptureStateError), results
    assert "was captured with another binding" in str(errors[0])
    graph = session.captured_graph(1)
    assert graph.binding.origin is (first if results[0] is None else second)
    graph.release()


# -- guarantee: a failed capture rolls back -----------------------------------------------------------------------


@pytest.mark.fake_only
@pytest.mark.parametrize("fault", ["validation_error_on_submit", "out_of_memory_on_allocation"])
def test_failed_capture_rolls_back(fault: str) -> None:
    from conftest import shared_env

    env = shared_env("fake")
    gc.collect()
    baseline = owned_handles(env)
    with InferenceSession(MODEL, env=env, graph_capture=True) as sess:
        binding, x, y = bound(sess)
        sess.run_with_iobinding(binding, RunOptions(gpu_graph_id=-1))  # pipelines and weights exist already
        handles = owned_handles(env)
        getattr(env.backend.faults, fault)(1)  # type: ignore[attr-defined]
        expected = ValidationError if fault == "validation_error_on_submit" else OutOfMemoryError
        with raises(expected, "injected"):
            sess.capture(binding, graph_id=0)
        assert env.backend.faults.pending == ()  # type: ignore[attr-defined]
        assert sess.captured_graph_ids == []
        with raises(CaptureStateError, "has no captured graph 0"):
            sess.captured_graph(0)
        assert buffer(x).pins == () and buffer(y).pins == ()
        x.release()  # unpinned: releasable
        x = sess.allocator.from_numpy(image())
        binding.bind_input("X", x)  # mutable
        assert_mutable(binding, sess)
        gc.collect()
        assert owned_handles(env) == handles, "the failed capture leaked intermediates or bind groups"
        # The id is free: a capture now succeeds and computes.
        with sess.capture(binding, graph_id=0) as graph:
            graph.replay()
            assert_reference(y.to_numpy(), x.to_numpy())
    del x, y, binding
    gc.collect()
    assert owned_handles(env) == baseline


# -- guarantee: bound values live as long as their graph ------------------------------------------------------


def test_bound_value_cannot_be_released_while_captured(session: InferenceSession, env: Env) -> None:
    shared = env.shared_allocator(env.default_device)
    binding, x, y = bound(session)
    s = shared.from_numpy(image())
    binding.bind_input("X", s)
    graph = session.capture(binding, graph_id=0)
    for value in (s, y):
        with raises(
            CaptureStateError, "cannot release a buffer bound to captured graph 0 of session", "release the graph first"
        ):
            value.release()
        assert not value.released
    batch = image()
    s.update_inplace(batch)
    graph.replay()
    assert_reference(y.to_numpy(), batch)
    graph.release()
    s.release()
    y.release()
    assert s.released and y.released
    with raises(ReleasedValueError, "was released"):
        s.to_numpy()
    x.release()


@pytest.mark.parametrize("allocator", ["session", "shared"])
def test_dropped_values_live_until_the_graph_is_released(session: InferenceSession, env: Env, allocator: str) -> None:
    session.run(None, {"X": image()})  # pipelines and weights exist already
    gc.collect()
    baseline = owned_handles(env)
    batch = image()
    binding, x, y = bound(session, shared=allocator == "shared", x=batch)
    graph = session.capture(binding, graph_id=0)
    x_buffer, y_buffer = weakref.ref(buffer(x)), weakref.ref(buffer(y))
    del x, y, binding
    gc.collect()
    kept = [x_buffer(), y_buffer()]
    assert all(b is not None and not b.released for b in kept)
    del kept
    graph.replay()
    (out,) = graph.binding.copy_outputs_to_cpu()
    assert_reference(out, batch)
    assert owned_handles(env) > baseline
    graph.release()  # the user keeps `graph`, drops the returned binding
    gc.collect()
    assert x_buffer() is None and y_buffer() is None, "a released graph must not keep its buffers alive"
    assert owned_handles(env) == baseline
    with raises(CaptureStateError, "was released"):
        _ = graph.binding
    assert graph.release() is None  # idempotent; the binding is gone


# -- guarantee: closing a session ---------------------------------------------------------------------------------


def test_closing_a_session_releases_graphs_then_buffers(env: Env) -> None:
    shared = env.shared_allocator(env.default_device)
    sess = InferenceSession(MODEL, env=env, graph_capture=True)
    sid = sess.session_id
    binding, x, y = bound(sess)
    s = shared.from_numpy(image())
    other = sess.io_binding()
    other.bind_input("X", s)
    other.bind_output("Y", sess.allocator.empty((BATCH, WIDTH), "float32"))
    graphs = [sess.capture(binding, graph_id=0), sess.capture(other, graph_id=1)]
    sess.close()  # graphs pin session-owned buffers: releasing buffers first would fail
    assert sess.closed
    assert all(g.released for g in graphs) and sess.captured_graph_ids == []
    for graph in graphs:
        with raises(CaptureStateError, "was released"):
            graph.replay()
    assert binding.captured_by == () and other.captured_by == ()
    for value in (x, y):
        assert value.released
        with raises(ReleasedValueError, "cannot read the value", f"session {sid} was closed"):
            value.to_numpy()
        with raises(ReleasedValueError, f"session {sid} was closed"):
            value.update_inplace(image())
    # Shared values outlive the session, unpinned.
    assert buffer(s).pins == () and not s.released
    batch = s.to_numpy()
    with InferenceSession(MODEL, env=env, graph_capture=True) as next_session:
        with raises(ReleasedValueError, "was released"):
            next_session.run_with_ort_values(None, {"X": x})
        late = next_session.io_binding()
        with raises(ReleasedValueError, "was released"):
            late.bind_input("X", x)
        late.bind_input("X", s)
        late.bind_output("Y", next_session.allocator.empty((BATCH, WIDTH), "float32"))
        with next_session.capture(late, graph_id=0):
            assert_reference(late.copy_outputs_to_cpu()[0], batch)
    with raises(ReleasedValueError, f"session {sid} is closed", "create a new InferenceSession"):
        sess.run(None, {"X": image()})
    with raises(ReleasedValueError, f"session {sid} is closed"):
        sess.capture(binding, graph_id=0)
    with raises(ReleasedValueError, f"session {sid} is closed"):
        binding.bind_input("X", s)
    sess.close()  # idempotent
    s.release()


# -- guarantee: provenance ------------------------------------------------------------------------------------------


def test_session_values_are_refused_by_other_sessions_and_shared_values_accepted(env: Env) -> None:
    shared = env.shared_allocator(env.default_device)
    with (
        InferenceSession(MODEL, env=env, graph_capture=True) as a,
        InferenceSession(MODEL, env=env, graph_capture=True) as b,
    ):
        owned_by_a = a.allocator.from_numpy(image())
        binding = b.io_binding()
        with raises(
            ProvenanceError,
            f"owned by session {a.session_id}",
            f"cannot be used by session {b.session_id}",
            "env.shared_allocator(device)",
        ):
            binding.bind_input("X", owned_by_a)
        with raises(ProvenanceError, f"owned by session {a.session_id}"):
            b.run_with_ort_values(None, {"X": owned_by_a})
        a_binding = a.io_binding()
        with raises(ProvenanceError, f"this binding belongs to session {a.session_id}, not session {b.session_id}"):
            b.capture(a_binding, graph_id=0)
        with raises(ProvenanceError, f"belongs to session {a.session_id}"):
            b.run_with_iobinding(a_binding, RunOptions(gpu_graph_id=-1))
        # One shared input captured by graphs of both sessions at once.
        s = shared.from_numpy(image())
        graphs, outputs = [], []
        for sess in (a, b):
            bind = sess.io_binding()
            bind.bind_input("X", s)
            out = sess.allocator.empty((BATCH, WIDTH), "float32")
            bind.bind_output("Y", out)
            graphs.append(sess.capture(bind, graph_id=0))
            outputs.append(out)
        assert set(buffer(s).pins) == {g.label for g in graphs}
        batch = image()
        s.update_inplace(batch)
        for graph, out in zip(graphs, outputs):
            graph.replay()
            assert_reference(out.to_numpy(), batch)
        a.close()
        assert buffer(s).pins == (graphs[1].label,)
        with raises(CaptureStateError, f"captured graph 0 of session {b.session_id}"):
            s.release()
        graphs[1].replay()
        assert_reference(outputs[1].to_numpy(), batch)
        graphs[1].release()
        s.release()
        owned_by_a.release()  # already released by a.close(): idempotent


def test_run_with_ort_values_outputs_carry_the_session_provenance(session: InferenceSession, env: Env) -> None:
    batch = image()
    x = env.shared_allocator(env.default_device).from_numpy(batch)
    (y,) = session.run_with_ort_values(None, {"X": x}, RunOptions(gpu_graph_id=-1))
    provenance = y.provenance
    assert provenance.placement == "webgpu" and provenance.allocator_kind == "session"
    assert provenance.session_id == session.session_id and provenance.env_id == env.id
    assert provenance.device is session.device and provenance == session.allocator.provenance
    assert_reference(y.to_numpy(), batch)
    # CPU OrtValues in, device values with provenance out.
    (from_host,) = session.run_with_ort_values(["Y"], {"X": OrtValue.ortvalue_from_numpy(batch)})
    assert from_host.provenance.session_id == session.session_id
    assert_reference(from_host.to_numpy(), batch)
    # The outputs are this session's values: usable here, refused by another session.
    binding = session.io_binding()
    binding.bind_input("X", y)
    binding.bind_output("Y", from_host)
    with session.capture(binding, graph_id=0):
        assert_reference(from_host.to_numpy(), reference(batch))
    with InferenceSession(MODEL, env=env) as other:
        with raises(ProvenanceError, f"owned by session {session.session_id}"):
            other.io_binding().bind_input("X", y)
    with raises(CaptureStateError, "run_with_ort_values() takes transient feeds", "gpu_graph_id=0"):
        session.run_with_ort_values(None, {"X": x}, RunOptions(gpu_graph_id=0))
    x.release()


@pytest.mark.fake_only
def test_shared_values_are_refused_on_another_device() -> None:
    backend = FakeBackend(devices=[FakeDeviceSpec(name="a"), FakeDeviceSpec(name="b")])
    with Env(backend=backend) as env:
        dev_a = next(d for d in env.devices if d.name == "a")
        dev_b = next(d for d in env.devices if d.name == "b")
        on_a = env.shared_allocator(dev_a).from_numpy(image())
        on_b = env.shared_allocator(dev_b).from_numpy(image())
        with (
            InferenceSession(MODEL, env=env, device=dev_a, graph_capture=True) as sess_a,
            InferenceSession(MODEL, env=env, device=dev_b, graph_capture=True) as sess_b,
        ):
            binding = sess_a.io_binding()
            with raises(
                ProvenanceError, "is on another device than session", "(device", "env.shared_allocator(session.device)"
            ):
                binding.bind_input("X", on_b)
            owned_by_b = sess_b.allocator.empty((BATCH, WIDTH), "float32")
            with raises(ProvenanceError, "is on another device than session"):
                binding.bind_output("Y", owned_by_b)
            with raises(ProvenanceError, "is on another device"):
                sess_a.run_with_ort_values(None, {"X": on_b})
            with raises(ProvenanceError, f"runs on device {dev_a.index}", f"not device {dev_b.index}"):
                sess_a.create_ortvalue_from_shape_and_type((BATCH, WIDTH), "float32", "webgpu", dev_b.index)
            assert binding.inputs() == {} and binding.outputs() == {}
            # Each session captures with the shared value of its own device.
            for sess, value in ((sess_a, on_a), (sess_b, on_b)):
                bind = sess.io_binding()
                bind.bind_input("X", value)
                bind.bind_output("Y", sess.allocator.empty((BATCH, WIDTH), "float32"))
                with sess.capture(bind, graph_id=0) as graph:
                    graph.replay()
                    assert_reference(bind.copy_outputs_to_cpu()[0], value.to_numpy())
        on_a.release()
        on_b.release()
        from ortgpu._device_caches import _pipeline_caches

        cached = sum(len(c) for d, c in _pipeline_caches.items() if getattr(d, "_backend", None) is backend)
        assert backend.live_handles() == cached, backend.describe_live_handles()


def test_values_of_another_env_are_refused(session: InferenceSession, backend_name: str) -> None:
    with Env(backend=backend_name) as other_env:  # type: ignore[arg-type]
        foreign = other_env.shared_allocator(other_env.default_device).from_numpy(image())
        binding = session.io_binding()
        with raises(ProvenanceError, f"belongs to Env {other_env.id}", f"runs in Env {session.env.id}"):
            binding.bind_input("X", foreign)
        with raises(ProvenanceError, f"belongs to Env {other_env.id}"):
            session.run_with_ort_values(None, {"X": foreign})
        assert binding.inputs() == {}
        foreign.release()


# -- guarantee: no raw access ---------------------------------------------------------------------------------------


def test_raw_pointer_binding_and_raw_access_are_refused(session: InferenceSession) -> None:
    binding, x, y = bound(session)
    with raises(
        UnsafeAccessError,
        "bind_input('X', device_type, device_id, element_type, shape, buffer_ptr)",
        "binds raw device memory",
        "bind_input('X', value)",
    ):
        binding.bind_input("X", "webgpu", 0, np.float32, [BATCH, WIDTH], 0x10000)  # type: ignore[arg-type]
    with raises(UnsafeAccessError, "bind_output('Y', device_type", "binds raw device memory"):
        binding.bind_output("Y", "webgpu", 0, np.float32, [BATCH, WIDTH], 0x10000)  # type: ignore[arg-type]
    assert binding.inputs() == {"X": x} and binding.outputs() == {"Y": y}
    with session.capture(binding, graph_id=0):  # also refused (not a state error) while captured
        with raises(UnsafeAccessError, "binds raw device memory"):
            binding.bind_input("X", "webgpu", 0, np.float32, [BATCH, WIDTH], 0x10000)  # type: ignore[arg-type]
    with raises(UnsafeAccessError, "data_ptr() is not available for device values"):
        x.data_ptr()
    with raises(UnsafeAccessError, "__dlpack__ is not available for device values"):
        x.__dlpack__()
    with raises(UnsafeAccessError, "__array__ is not available for device values", "value.to_numpy()"):
        np.asarray(x)
    with raises(UnsafeAccessError, "numpy() is not available for device values"):
        x.numpy()


# -- guarantee: several graph ids ---------------------------------------------------------------------------------------


def test_several_graph_ids_with_interleaved_replays(session: InferenceSession) -> None:
    """Graphs 0, 1 and 7 of one session; 0 and 7 read the same input value.  Each graph has its own
    intermediates: interleaved replays never mix, and no replay writes another graph's output."""
    shared_input = session.allocator.from_numpy(image())
    inputs = [shared_input, session.allocator.from_numpy(image()), shared_input]
    graphs, outputs = [], []
    for graph_id, x in zip((0, 1, 7), inputs):
        binding = session.io_binding()
        y = session.allocator.empty((BATCH, WIDTH), "float32")
        binding.bind_input("X", x)
        binding.bind_output("Y", y)
        graphs.append(session.capture(binding, graph_id=graph_id))
        outputs.append(y)
    assert session.captured_graph_ids == [0, 1, 7]
    assert buffer(shared_input).pins == (graphs[0].label, graphs[2].label)
    expected = [reference(x.to_numpy()) for x in inputs]
    order = [1, 0, 2, 1, 1, 2, 0, 0, 2, 1]
    for index in order:
        batch = image()
        inputs[index].update_inplace(batch)
        graphs[index].replay()
        expected[index] = reference(batch)  # the other graph on a shared input keeps its last result
        for other in range(3):
            np.testing.assert_allclose(outputs[other].to_numpy(), expected[other], rtol=1e-5, atol=1e-5)
    assert [g.replays for g in graphs] == [order.count(i) for i in range(3)]
    graphs[1].release()
    assert session.captured_graph_ids == [0, 7]
    graphs[0].replay()
    np.testing.assert_allclose(outputs[0].to_numpy(), reference(shared_input.to_numpy()), rtol=1e-5, atol=1e-5)
    for graph in graphs:
        graph.release()


# -- guarantee: preconditions are checked before anything is recorded --------------------------------------------------


def _nothing_recorded(
    sess: InferenceSession, env: Env, binding: IOBinding | None, handles: int, submitted: int | None
) -> None:
    assert sess.captured_graph_ids == []
    gc.collect()
    assert owned_handles(env) == handles
    assert submits(env) == submitted
    if binding is not None:
        assert binding.captured_by == ()
        assert all(b.pins == () for b in binding._pinned_buffers())


@contextlib.contextmanager
def _refused_before_recording(
    sess: InferenceSession, env: Env, binding: IOBinding | None, error: type[BaseException], *fragments: str
) -> Iterator[None]:
    gc.collect()
    handles, submitted = owned_handles(env), submits(env)
    with raises(error, *fragments):
        yield
    _nothing_recorded(sess, env, binding, handles, submitted)


def test_capture_preconditions_fail_before_recording(session: InferenceSession, env: Env) -> None:
    session.run(None, {"X": image()})  # compile first, so any new handle would be the capture's
    sid = session.session_id
    binding = session.io_binding()
    with _refused_before_recording(
        session, env, binding, CaptureStateError, "inputs ['X'] are not bound", "bind every input"
    ):
        session.capture(binding, graph_id=0)
    x = session.allocator.from_numpy(image())
    binding.bind_input("X", x)
    with _refused_before_recording(
        session,
        env,
        binding,
        CaptureStateError,
        "outputs ['Y'] are not bound",
        "binding.bind_output(name, session.allocator.empty(shape, dtype))",
    ):
        session.capture(binding, graph_id=0)
    with _refused_before_recording(session, env, binding, CaptureStateError, "outputs ['Y'] are not bound"):
        session.run_with_iobinding(binding, RunOptions(gpu_graph_id=0))
    # Wrong dtype and wrong static shape are refused at bind time, and leave the binding unchanged.
    with raises(DtypeError, "output 'Y' has dtype float32 in the model, got int32", "never casts silently"):
        binding.bind_output("Y", session.allocator.empty((BATCH, WIDTH), "int32"))
    with raises(ShapeError, "output 'Y' has shape ['batch', 16] in the model, got [2, 8]"):
        binding.bind_output("Y", session.allocator.empty((BATCH, 8), "float32"))
    assert binding.outputs() == {}
    # A shape that disagrees with the inputs' is found at capture, before anything runs.
    wrong_batch = session.allocator.empty((BATCH + 1, WIDTH), "float32")
    binding.bind_output("Y", wrong_batch)
    with _refused_before_recording(
        session,
        env,
        binding,
        ShapeError,
        "output 'Y' is float32 of shape [2, 16] for these inputs",
        "bound value is float32 of shape [3, 16]",
    ):
        session.capture(binding, graph_id=0)
    # The same value as input and output.
    binding.bind_output("Y", x)
    with _refused_before_recording(session, env, binding, CaptureStateError, "bound both as an input and as an output"):
        session.capture(binding, graph_id=0)
    y = session.allocator.empty((BATCH, WIDTH), "float32")
    binding.bind_output("Y", y)
    # Host values: bind_cpu_input, a CPU OrtValue input, a CPU OrtValue output.
    binding.bind_cpu_input("X", image())
    with _refused_before_recording(
        session, env, binding, CaptureStateError, "cannot capture with host values bound (['X'])", "update_inplace"
    ):
        session.capture(binding, graph_id=0)
    binding.bind_input("X", OrtValue.ortvalue_from_numpy(image()))
    with _refused_before_recording(
        session, env, binding, CaptureStateError, "cannot capture with host values bound (['X'])"
    ):
        session.capture(binding, graph_id=0)
    binding.bind_input("X", x)
    binding.bind_output("Y", OrtValue.ortvalue_from_numpy(np.zeros((BATCH, WIDTH), np.float32)))
    with _refused_before_recording(
        session, env, binding, CaptureStateError, "cannot capture with host values bound (['Y'])"
    ):
        session.capture(binding, graph_id=0)
    binding.bind_output("Y", y)
    # A released value.
    doomed = session.allocator.from_numpy(image())
    binding.bind_input("X", doomed)
    doomed.release()
    with _refused_before_recording(session, env, binding, ReleasedValueError, "bound value 'X'", "it was released"):
        session.capture(binding, graph_id=0)
    binding.bind_input("X", x)
    # Bad graph ids.
    with _refused_before_recording(session, env, binding, InvalidArgumentError, "graph_id must be >= 0"):
        session.capture(binding, graph_id=-2)
    with _refused_before_recording(session, env, binding, TypeError, "graph_id must be an int"):
        session.capture(binding, graph_id="0")  # type: ignore[arg-type]
    # After every refusal, the same id captures.
    with session.capture(binding, graph_id=0) as graph:
        assert graph.graph_id == 0 and f"session {sid}" in str(graph.label)
        assert_reference(y.to_numpy(), x.to_numpy())
    wrong_batch.release()


@pytest.mark.parametrize("kind", ["float64"])  # int64 Mul runs on WebGPU (vec2<u32> kernels); float64 never does
def test_capture_refuses_a_model_with_a_cpu_node(env: Env, kind: str) -> None:
    with InferenceSession(cpu_node_model(kind), env=env, graph_capture=True) as sess:
        placements = {p.node: p.placement for p in sess.get_node_placement()}
        assert placements["wide_mul"] == "cpu"
        batch = image()
        expected = onnxruntime.InferenceSession(cpu_node_model(kind), providers=["CPUExecutionProvider"]).run(
            None, {"X": batch}
        )[0]
        np.testing.assert_array_equal(sess.run(None, {"X": batch})[0], expected)  # ordinary runs work
        binding = sess.io_binding()
        x = sess.allocator.from_numpy(batch)
        y = sess.allocator.empty((BATCH, WIDTH), "float32")
        binding.bind_input("X", x)
        binding.bind_output("Y", y)
        with _refused_before_recording(
            sess,
            env,
            binding,
            CaptureStateError,
            "cannot capture: nodes",
            "wide_mul",
            "run on the CPU",
            "get_node_placement()",
        ):
            sess.capture(binding, graph_id=0)
        with _refused_before_recording(sess, env, binding, CaptureStateError, "wide_mul", "run on the CPU"):
            sess.run_with_iobinding(binding, RunOptions(gpu_graph_id=0))
        np.testing.assert_array_equal(y.to_numpy(), np.zeros_like(batch))  # nothing ran
        sess.run_with_iobinding(binding, RunOptions(gpu_graph_id=-1))
        np.testing.assert_array_equal(y.to_numpy(), expected)
        assert_mutable(binding, sess)


def test_capture_refused_without_graph_capture(env: Env) -> None:
    with InferenceSession(MODEL, env=env) as sess:
        binding, x, y = bound(sess)
        fragments = ("graph_capture=False", "InferenceSession(..., graph_capture=True)", "gpu_graph_id=-1")
        with _refused_before_recording(sess, env, binding, CaptureStateError, *fragments):
            sess.capture(binding, graph_id=0)
        with _refused_before_recording(sess, env, binding, CaptureStateError, *fragments):
            sess.run_with_iobinding(binding, RunOptions(gpu_graph_id=2))
        # Without a graph id, run_with_iobinding is an ordinary run on such a session.
        sess.run_with_iobinding(binding)
        assert_reference(y.to_numpy(), x.to_numpy())
        assert sess.captured_graph_ids == []


# -- verify mode ----------------------------------------------------------------------------------------------------------


def test_verify_passes_on_correct_graphs(session: InferenceSession) -> None:
    binding, x, y = bound(session)
    graph = session.capture(binding, graph_id=0)
    for _ in range(2):
        batch = image()
        x.update_inplace(batch)
        graph.replay(verify=True)
        assert_reference(y.to_numpy(), batch)
    assert graph.replays == 2
    graph.release()


def _drop_graph_replays(original: Callable[[Any], None], commands: Any) -> None:
    """A broken device queue: the captured graph's (frozen) command list executes nothing."""
    if not commands.frozen:
        original(commands)


def test_verify_detects_a_replay_that_leaves_outputs_stale(session: InferenceSession, env: Env) -> None:
    binding, x, y = bound(session)
    graph = session.capture(binding, graph_id=0)
    stale = y.to_numpy()
    with wrapped_submit(env, _drop_graph_replays):
        x.update_inplace(image())
        graph.replay()
        np.testing.assert_array_equal(y.to_numpy(), stale)  # the hazard verify exists for: silently stale
        with raises(
            CaptureStateError,
            "verify: output 'Y' of graph 0 of session",
            "differs from an uncaptured run",
            "stale or unwritten",
        ):
            graph.replay(verify=True)
        poisoned = y.to_numpy()
        assert np.isnan(poisoned).all(), "verify poisons the outputs before the replay"
    graph.replay(verify=True)  # a healthy queue passes again
    assert_reference(y.to_numpy(), x.to_numpy())
    graph.release()


def test_session_verify_option_checks_every_replay(env: Env) -> None:
    with InferenceSession(MODEL, env=env, graph_capture=True, verify_replays=True) as sess:
        binding, x, y = bound(sess)
        graph = sess.capture(binding, graph_id=0)
        batch = image()
        x.update_inplace(batch)
        sess.run_with_iobinding(binding, RunOptions(gpu_graph_id=0))
        assert_reference(y.to_numpy(), batch)
        with wrapped_submit(env, _drop_graph_replays):
            with raises(CaptureStateError, "verify: output 'Y'"):
                graph.replay()
            with raises(CaptureStateError, "verify: output 'Y'"):
                sess.run_with_iobinding(binding, RunOptions(gpu_graph_id=0))
        graph.release()


# -- onnxruntime's spelling --------------------------------------------------------------------------------------------------


def test_run_with_iobinding_graph_id_captures_then_replays(session: InferenceSession) -> None:
    binding, x, y = bound(session)
    options = RunOptions()
    options.add_run_config_entry("gpu_graph_id", "4")
    assert options.get_run_config_entry("gpu_graph_id") == "4"
    session.run_with_iobinding(binding, options)
    graph = session.captured_graph(4)
    assert session.captured_graph_ids == [4] and graph.replays == 0
    assert_reference(y.to_numpy(), x.to_numpy())
    for count in range(1, 4):
        batch = image()
        x.update_inplace(batch)
        session.run_with_iobinding(binding, RunOptions(gpu_graph_id=4))
        assert graph.replays == count
        assert_reference(y.to_numpy(), batch)
    with raises(CaptureStateError, "cannot bind input 'X'", "release_captured_graph(4)"):
        binding.bind_input("X", x)
    assert session.release_captured_graph(4) is binding
    assert_mutable(binding, session)
    # No RunOptions on a capture session: graph 0, as in onnxruntime.
    session.run_with_iobinding(binding)
    assert session.captured_graph_ids == [0]
    session.run_with_iobinding(binding, RunOptions())
    assert session.captured_graph(0).replays == 1
    session.release_captured_graph(0)
    with raises(InvalidArgumentError, "gpu_graph_id must be an integer string"):
        RunOptions().add_run_config_entry("gpu_graph_id", "zero")


def test_ordinary_runs_on_a_capture_session(session: InferenceSession, env: Env) -> None:
    binding, x, y = bound(session)
    graph = session.capture(binding, graph_id=0)
    ordinary = RunOptions(gpu_graph_id=-1)
    for _ in range(2):  # transient feeds of different values, while graph 0 is captured
        batch = image()
        assert_reference(session.run(None, {"X": batch}, ordinary)[0], batch)
        assert_reference(session.run(["Y"], {"X": batch})[0], batch)
        (value,) = session.run_with_ort_values(None, {"X": OrtValue.ortvalue_from_numpy(batch)}, ordinary)
        assert_reference(value.to_numpy(), batch)
        value.release()
        transient = session.io_binding()
        transient.bind_cpu_input("X", batch)
        out = session.allocator.empty((BATCH, WIDTH), "float32")
        transient.bind_output("Y", out)
        session.run_with_iobinding(transient, ordinary)
        assert_reference(out.to_numpy(), batch)
        host_out = OrtValue.ortvalue_from_numpy(np.zeros((BATCH, WIDTH), np.float32))
        transient.bind_output("Y", host_out)
        session.run_with_iobinding(transient, ordinary)
        assert_reference(host_out.numpy(), batch)
        out.release()
    # A different batch size runs ordinarily too.
    wide = image(batch=5)
    assert_reference(session.run(None, {"X": wide}, ordinary)[0], wide)
    # None of that disturbed the graph or its output.
    assert graph.replays == 0
    assert_reference(y.to_numpy(), x.to_numpy())
    batch = image()
    x.update_inplace(batch)
    graph.replay()
    assert_reference(y.to_numpy(), batch)
    # An ordinary run on the captured binding itself is allowed (it writes the bound output).
    other = image()
    x.update_inplace(other)
    session.run_with_iobinding(binding, ordinary)
    assert_reference(y.to_numpy(), other)
    assert graph.replays == 1
    with raises(
        CaptureStateError, "run() takes transient feeds", "cannot capture or replay graph 0", "gpu_graph_id=-1"
    ):
        session.run(None, {"X": batch}, RunOptions(gpu_graph_id=0))
    graph.release()


def test_transient_values_never_meet_a_stale_bind_group(session: InferenceSession, env: Env) -> None:
    """Ordinary runs over values that are released right after, and verified replays (whose scratch outputs
    are released after each check): wgpu-native reuses a freed buffer's address, so a bind group cached
    by handle would name a destroyed buffer (before the fix: a validation panic that aborted the process
    on wgpu; on fake, the cached bind groups piled up)."""
    binding, x, y = bound(session)
    graph = session.capture(binding, graph_id=0)
    counts = []
    for _ in range(12):
        batch = image()
        value = session.allocator.from_numpy(batch)
        (out,) = session.run_with_ort_values(None, {"X": value}, RunOptions(gpu_graph_id=-1))
        assert_reference(out.to_numpy(), batch)
        transient = session.io_binding()
        transient.bind_input("X", value)
        transient.bind_output("Y", out)
        session.run_with_iobinding(transient, RunOptions(gpu_graph_id=-1))
        assert_reference(out.to_numpy(), batch)
        value.release()
        out.release()
        x.update_inplace(batch)
        graph.replay(verify=True)
        assert_reference(y.to_numpy(), batch)
        gc.collect()
        counts.append(owned_handles(env))
    assert max(counts[2:]) <= counts[1], f"native objects pile up across transient runs: {counts}"
    graph.release()


def test_closing_a_session_while_another_thread_captures(env: Env) -> None:
    """close() while a capture is in flight on another thread (inside its submit): close waits for it,
    then releases the new graph; nothing stays registered, pinned, locked or allocated.  (Before the
    fix, close cleared the registry under the capture, whose rollback then failed with KeyError.)"""
    sess = InferenceSession(MODEL, env=env, graph_capture=True)
    binding, x, y = bound(sess, shared=True)
    sess.run(None, {"X": image()})  # compile first
    in_submit = threading.Event()
    outcome: list[Any] = []

    def slow(original: Callable[[Any], None], commands: Any) -> None:
        in_submit.set()
        time.sleep(0.1)
        original(commands)

    def capture() -> None:
        try:
            outcome.append(sess.capture(binding, graph_id=0))
        except BaseException as error:  # asserted below
            outcome.append(error)

    with wrapped_submit(env, slow):
        thread = threading.Thread(target=capture)
        thread.start()
        assert in_submit.wait(timeout=30)
        sess.close()
        thread.join(timeout=60)
    (graph,) = outcome
    assert isinstance(graph, CapturedGraph), graph
    assert graph.released and sess.closed and sess.captured_graph_ids == []
    assert_reference(y.to_numpy(), x.to_numpy())  # the capture run completed before close went on
    assert binding.captured_by == ()
    assert buffer(x).pins == () and buffer(y).pins == ()
    with raises(ReleasedValueError, f"cannot capture: session {sess.session_id} is closed"):
        sess.capture(binding, graph_id=0)
    x.release()
    y.release()


def test_env_close_releases_sessions_graphs_then_buffers() -> None:
    """Closing an Env with a live graph that pins a shared value closes the session (graph first), then frees all."""
    from ortgpu_core.backends.fake import FakeBackend

    backend = FakeBackend()
    env = Env(backend=backend)
    sess = InferenceSession(MODEL, env=env, graph_capture=True)
    shared = env.shared_allocator(env.default_device)
    x = shared.from_numpy(image())
    y = sess.allocator.empty((BATCH, WIDTH), "float32")
    binding = sess.io_binding()
    binding.bind_input("X", x)
    binding.bind_output("Y", y)
    graph = sess.capture(binding, graph_id=0)
    env.close()
    assert sess.closed and graph.released
    assert backend.live_handles() == 0
    with raises(ReleasedValueError, "closed"):
        x.to_numpy()


def test_copy_from_itself_changes_nothing(env: Env) -> None:
    value = env.shared_allocator(env.default_device).from_numpy(image())
    before = value.to_numpy()
    value.copy_from(value)
    np.testing.assert_array_equal(value.to_numpy(), before)


def test_device_lost_during_replay_is_typed_and_leaks_nothing() -> None:
    """A device lost under a captured graph: replay raises DeviceLostError, release and close still work, all freed."""
    from ortgpu_core import DeviceLostError
    from ortgpu_core.backends.fake import FakeBackend

    backend = FakeBackend()
    env = Env(backend=backend)
    sess = InferenceSession(MODEL, env=env, graph_capture=True)
    binding, x, y = bound(sess)
    graph = sess.capture(binding, graph_id=0)
    graph.replay()
    backend.faults.lose_device_on_submit(1)
    with raises(DeviceLostError, "injected device loss"):
        graph.replay()
    with raises(DeviceLostError):
        y.to_numpy()
    assert graph.release() is binding  # releasing a graph on a lost device still unpins and unlocks
    binding.bind_input("X", x)  # mutable again
    sess.close()
    env.close()
    assert backend.live_handles() == 0
