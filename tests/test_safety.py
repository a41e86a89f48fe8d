"""The safety promise under threads, copies, garbage collection and misuse of reachable objects (issue 10).

One regression test (or a few) per hole an adversarial review found, on both backends:

1. capture racing a rebind on another thread never leaves the binding locked naming another buffer than the
   graph replays;
2. and 3. core objects are not copyable or picklable (a copy would free or unlock what the original still uses);
   CPU values copy their data;
4. a session and its graphs dropped without close()/release() free everything and unpin Env-shared values;
5. pins, native writes and native addresses are not reachable through public attributes;
9. capture racing an ordinary run builds the session's state once;
10. errors under races and teardown are the documented ones, and releasing always succeeds.

Items 6-7 (hostile models) are in ``test_hostile_models.py``, 8 (native memory) in ``test_soak.py``.
"""

from __future__ import annotations

import copy
import gc
import pickle
import threading
import time
from typing import Any, Callable, Iterator

import models
import numpy as np
import pytest
from conftest import owned_handles

from ortgpu import (
    CapturedGraph,
    CaptureStateError,
    Env,
    FrozenIOBinding,
    InferenceSession,
    IOBinding,
    OrtValue,
    ReleasedValueError,
    ShapeError,
    UnsafeAccessError,
)
from ortgpu_core import DeviceBuffer
from ortgpu_core.backends.protocol import BackendDevice

BATCH, WIDTH = 2, 8
MODEL = models.mlp(layers=2, width=WIDTH, batch=BATCH, seed=11).SerializeToString()
_rng = np.random.default_rng(10)


def batch() -> np.ndarray:
    return _rng.standard_normal((BATCH, WIDTH)).astype(np.float32)


@pytest.fixture
def session(env: Env) -> Iterator[InferenceSession]:
    sess = InferenceSession(MODEL, env=env, graph_capture=True)
    yield sess
    sess.close()


def bound(sess: InferenceSession, *, shared: bool = False) -> tuple[IOBinding, OrtValue[Any], OrtValue[Any]]:
    allocator = sess.env.shared_allocator(sess.device) if shared else sess.allocator
    x = allocator.from_numpy(batch())
    y = allocator.empty((BATCH, WIDTH), "float32")
    binding = sess.io_binding()
    binding.bind_input("X", x)
    binding.bind_output("Y", y)
    return binding, x, y


def generation(value: OrtValue[Any]) -> int:
    buffer = value._device_buffer
    assert buffer is not None
    return int(buffer.generation)


def run_in_thread(
    body: Callable[[threading.Event], None],
) -> tuple[threading.Thread, threading.Event, list[BaseException]]:
    """Start ``body(stop)`` on a thread; exceptions it raises are collected, not lost."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            body(stop)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, stop, errors


# -- 1. capture racing a rebind ------------------------------------------------------------------------------


def test_capture_racing_rebinds_locks_exactly_what_the_graph_replays(session: InferenceSession) -> None:
    """A thread rebinds X between two values while the main thread captures and releases: every captured graph's
    locked binding names the buffer the graph replays, and a replay after writing through the binding is fresh.
    (Before the fix, capture froze, planned, then locked: 26-34 of 150-300 captures were stale.)"""
    binding, x1, y = bound(session)
    x2 = session.allocator.from_numpy(batch())

    def rebind(stop: threading.Event) -> None:
        flip = False
        while not stop.is_set():
            flip = not flip
            try:
                binding.bind_input("X", x1 if flip else x2)
            except CaptureStateError:
                pass

    thread, stop, errors = run_in_thread(rebind)
    mismatches = captures = 0
    deadline = time.monotonic() + 4.0
    try:
        while captures < 120 and time.monotonic() < deadline:
            graph = session.capture(binding, graph_id=0)
            captures += 1
            if generation(binding.inputs()["X"]) != generation(graph.binding.inputs()["X"]):
                mismatches += 1
            if captures % 20 == 0:
                data = batch()
                binding.inputs()["X"].update_inplace(data)
                graph.replay()
                np.testing.assert_allclose(y.to_numpy(), session.run(None, {"X": data})[0], rtol=1e-6, atol=1e-6)
            graph.release()
    finally:
        stop.set()
        thread.join(10)
    assert not errors, errors
    assert captures >= 20
    assert mismatches == 0, f"{mismatches} of {captures} captures locked a binding naming another buffer"
    x2.release()


# -- 2, 3. copies and pickles ----------------------------------------------------------------------------------


COPIERS: dict[str, Callable[[Any], object]] = {
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
    "pickle": lambda obj: pickle.dumps(obj),
}


@pytest.mark.parametrize("how", sorted(COPIERS))
def test_core_objects_refuse_copies_and_nothing_changes(session: InferenceSession, how: str) -> None:
    binding, x, y = bound(session, shared=True)
    graph = session.capture(binding, graph_id=0)
    buffer = x._device_buffer
    assert buffer is not None
    objects: list[object] = [
        x,
        y,
        buffer,
        binding,
        graph.binding,
        graph,
        session,
        session.env,
        session.device,
        session.allocator,
        session.env.shared_allocator(session.device),
    ]
    for obj in objects:
        with pytest.raises(UnsafeAccessError, match="cannot be copied or pickled"):
            COPIERS[how](obj)
    if how == "pickle":
        with pytest.raises(UnsafeAccessError):
            pickle.dumps(x.provenance)
    else:
        assert COPIERS[how](x.provenance) is x.provenance  # immutable
    # Nothing changed: the graph still pins and locks, and replays fresh data.
    with pytest.raises(CaptureStateError):
        x.release()
    with pytest.raises(CaptureStateError):
        binding.bind_input("X", session.allocator.empty((BATCH, WIDTH), "float32"))
    data = batch()
    x.update_inplace(data)
    graph.replay()
    np.testing.assert_allclose(y.to_numpy(), session.run(None, {"X": data})[0], rtol=1e-6, atol=1e-6)
    assert graph.release() is binding
    x.release()
    assert buffer.released


def test_use_after_free_through_a_copied_buffer_is_impossible(session: InferenceSession) -> None:
    """``c = copy.copy(x.buffer); del c`` freed x's native buffer through Cython's automatic pickling."""
    x = session.allocator.from_numpy(batch())
    expected = x.to_numpy()
    with pytest.raises(UnsafeAccessError):
        copy.copy(x._device_buffer)
    gc.collect()
    other = session.allocator.from_numpy(batch())  # would reuse a freed address
    np.testing.assert_array_equal(x.to_numpy(), expected)
    other.release()
    x.release()


def test_no_cython_pickle_state_hooks_are_reachable(session: InferenceSession) -> None:
    binding, x, y = bound(session)
    graph = session.capture(binding, graph_id=0)
    for obj in (graph.binding, binding, graph, x, x._device_buffer, session.allocator, session.device):
        assert not hasattr(obj, "__setstate_cython__") and not hasattr(obj, "__reduce_cython__"), type(obj)
    graph.release()


def test_cpu_values_copy_and_pickle_their_data() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    value = OrtValue.ortvalue_from_numpy(array)
    for twin in (copy.copy(value), copy.deepcopy(value), pickle.loads(pickle.dumps(value))):
        assert isinstance(twin, OrtValue) and twin.device_name() == "cpu"
        np.testing.assert_array_equal(twin.numpy(), array)
        twin.numpy()[0, 0] = 100.0  # independent of the original
        assert value.numpy()[0, 0] == 0.0
    value.release()
    with pytest.raises(ReleasedValueError):
        copy.copy(value)


def test_session_python_objects_refuse_copies(session: InferenceSession) -> None:
    for how in COPIERS.values():
        with pytest.raises(UnsafeAccessError, match="Create another InferenceSession"):
            how(session)
    assert not session.closed


# -- 4. objects dropped without close() ------------------------------------------------------------------------


def test_session_and_graph_dropped_without_close_unpin_shared_values(env: Env) -> None:
    """A session and its graph collected without close()/release(): the Env-shared input is unpinned and
    releasable, and nothing the session owned leaks (the env fixture counts native objects)."""
    shared = env.shared_allocator(env.default_device)
    x = shared.from_numpy(batch())
    sess = InferenceSession(MODEL, env=env, graph_capture=True)
    binding = sess.io_binding()
    binding.bind_input("X", x)
    binding.bind_output("Y", sess.allocator.empty((BATCH, WIDTH), "float32"))
    graph = sess.capture(binding, graph_id=0)
    graph.replay()
    buffer = x._device_buffer
    assert buffer is not None and buffer.pins == (graph.label,)
    del sess, binding, graph
    gc.collect()
    assert buffer.pins == ()
    x.update_inplace(batch())  # still usable
    x.release()


def test_release_of_a_value_pinned_only_by_unreachable_garbage_succeeds(env: Env) -> None:
    """Without an explicit gc.collect(): the pin of a graph nobody can reach does not hold."""
    x = env.shared_allocator(env.default_device).from_numpy(batch())
    sess = InferenceSession(MODEL, env=env, graph_capture=True)
    binding = sess.io_binding()
    binding.bind_input("X", x)
    binding.bind_output("Y", sess.allocator.empty((BATCH, WIDTH), "float32"))
    sess.capture(binding, graph_id=0)
    del sess, binding  # a reference cycle (graph <-> session) that only the collector frees
    x.release()
    assert x.released


def test_session_dropped_without_close_frees_what_it_owns(env: Env) -> None:
    before = owned_handles(env)
    sess = InferenceSession(MODEL, env=env, graph_capture=True)
    sess.run(None, {"X": batch()})
    binding, x, y = bound(sess)
    sess.capture(binding, graph_id=3)
    assert owned_handles(env) > before
    del sess, binding, x, y
    gc.collect()
    assert owned_handles(env) == before


def test_env_close_after_dropped_session_completes(backend_name: str) -> None:
    """Env.close() with a session and graph dropped (not yet collected) over an Env-shared input: it completes,
    closes the device and leaves no native object (it raised CaptureStateError and left 9 handles alive)."""
    environment = Env(backend=backend_name)
    x = environment.shared_allocator().from_numpy(batch())
    sess = InferenceSession(MODEL, env=environment, graph_capture=True)
    binding = sess.io_binding()
    binding.bind_input("X", x)
    binding.bind_output("Y", sess.allocator.empty((BATCH, WIDTH), "float32"))
    sess.capture(binding, graph_id=0).replay()
    del sess, binding
    environment.close()
    assert environment.closed and environment.devices
    assert all(device.closed for device in environment.devices)
    assert environment.live_handles() == 0
    with pytest.raises(ReleasedValueError):
        x.to_numpy()
    x.release()  # releasing is always allowed


# -- 5. nothing native is reachable through public attributes -------------------------------------------------


def _public_values(obj: object) -> Iterator[tuple[str, object]]:
    for name in dir(obj):
        if name.startswith("_"):
            continue
        try:
            value = getattr(obj, name)
        except Exception:  # noqa: BLE001 - a property that refuses in this state exposes nothing
            continue
        if callable(value):
            continue
        yield name, value


def test_no_public_attribute_exposes_buffers_pins_or_native_devices(session: InferenceSession) -> None:
    binding, x, y = bound(session, shared=True)
    graph = session.capture(binding, graph_id=0)
    for cls in (DeviceBuffer,):
        assert not hasattr(cls, "pin") and not hasattr(cls, "unpin")
    assert not hasattr(x, "buffer") and not hasattr(session.device, "backend_device")
    for obj in (
        x,
        y,
        binding,
        graph.binding,
        graph,
        session,
        session.env,
        session.device,
        session.allocator,
        session.env.shared_allocator(session.device),
        x.provenance,
    ):
        for name, value in _public_values(obj):
            assert not isinstance(value, (DeviceBuffer, BackendDevice)), (
                f"{type(obj).__name__}.{name} exposes {value!r}"
            )
    # Signatures name buffers by generation, never by native address.
    buffer = x._device_buffer
    assert buffer is not None
    assert all(buffer.handle not in row for row in binding.signature)
    graph.release()


def test_frozen_binding_state_cannot_be_replaced(session: InferenceSession) -> None:
    """``graph.binding.__setstate_cython__(...)`` made the binding report one value while the replay used
    another; there is no such hook, and a frozen binding's mappings are copies."""
    binding, x, y = bound(session)
    graph = session.capture(binding, graph_id=0)
    frozen = graph.binding
    assert isinstance(frozen, FrozenIOBinding)
    frozen.inputs()["X"] = session.allocator.empty((BATCH, WIDTH), "float32")
    assert generation(frozen.inputs()["X"]) == generation(x)
    graph.release()


# -- 9. capture racing an ordinary run --------------------------------------------------------------------------


def test_capture_racing_run_uploads_weights_once(session: InferenceSession) -> None:
    """capture() built its program outside the session lock, so a concurrent run uploaded the weights again
    (155 weight buffers leaked in 60 rounds on wgpu); the env fixture's leak check catches any here."""
    binding, x, y = bound(session)
    data = batch()

    def runs(stop: threading.Event) -> None:
        for _ in range(30):
            session.run(None, {"X": data})

    for graph_id in range(6):
        thread, stop, errors = run_in_thread(runs)
        graph = session.capture(binding, graph_id=graph_id)
        thread.join(30)
        assert not errors, errors
        graph.release()
    weights = session._runner.weights
    assert len(weights._buffers) == len(set(weights._buffers.values()))
    session.close()


# -- 10. errors under races and teardown ----------------------------------------------------------------------


def test_replay_racing_release_raises_only_capture_state_error(session: InferenceSession) -> None:
    for _ in range(8):
        binding, x, y = bound(session)
        graph = session.capture(binding, graph_id=0)

        def replays(stop: threading.Event, graph: CapturedGraph = graph) -> None:
            while True:
                try:
                    graph.replay()
                except CaptureStateError:
                    return

        thread, stop, errors = run_in_thread(replays)
        time.sleep(0.005)
        graph.release()
        thread.join(30)
        assert not thread.is_alive() and not errors, errors
        x.release()
        y.release()


def test_huge_cpu_value_is_a_shape_error() -> None:
    with pytest.raises(ShapeError, match="bytes of host memory"):
        OrtValue.ortvalue_from_shape_and_type((2**40, 4), "float32")


def test_releases_after_env_close_always_succeed(backend_name: str) -> None:
    environment = Env(backend=backend_name)
    sess = InferenceSession(MODEL, env=environment, graph_capture=True)
    binding, x, y = bound(sess)
    shared = environment.shared_allocator().from_numpy(batch())
    graph = sess.capture(binding, graph_id=0)
    environment.close()
    assert graph.released  # the session was closed with the Env, its graphs first
    with pytest.raises(CaptureStateError, match=f"its Env {environment.id} was closed; create a new Env"):
        graph.replay()
    assert graph.release() is binding
    sess.close()
    for value in (x, y, shared):
        with pytest.raises(ReleasedValueError):
            value.to_numpy()
        value.release()
    with pytest.raises(ReleasedValueError):
        sess.run(None, {"X": batch()})


def test_releases_after_device_loss_always_succeed() -> None:
    from ortgpu_core import DeviceLostError
    from ortgpu_core.backends.fake import FakeBackend

    backend = FakeBackend()
    environment = Env(backend=backend)
    sess = InferenceSession(MODEL, env=environment, graph_capture=True)
    binding, x, y = bound(sess)
    graph = sess.capture(binding, graph_id=0)
    backend.faults.lose_device_on_submit(1)
    with pytest.raises(DeviceLostError):
        graph.replay()
    assert graph.release() is binding and graph.released
    x.release()
    sess.close()
    environment.close()
    assert environment.live_handles() == 0


def test_operations_cut_off_by_env_close_say_released(backend_name: str) -> None:
    """A thread replaying while another closes the Env gets CaptureStateError (its graph was released) or
    ReleasedValueError (the Env is closed), never DeviceLostError or a validation error."""
    environment = Env(backend=backend_name)
    sess = InferenceSession(MODEL, env=environment, graph_capture=True)
    binding, x, y = bound(sess)
    graph = sess.capture(binding, graph_id=0)
    seen: list[BaseException] = []

    def replays(stop: threading.Event) -> None:
        while True:
            try:
                graph.replay()
                y.to_numpy()
            except (CaptureStateError, ReleasedValueError) as error:
                seen.append(error)
                return

    thread, stop, errors = run_in_thread(replays)
    time.sleep(0.02)
    environment.close()
    thread.join(30)
    assert not errors, [f"{type(e).__name__}: {e}" for e in errors]
    assert seen


def test_replay_after_session_close_says_the_session_is_closed(session: InferenceSession) -> None:
    binding, x, y = bound(session)
    graph = session.capture(binding, graph_id=0)
    session.close()
    with pytest.raises(CaptureStateError, match=f"its session {session.session_id} was closed; create a new session"):
        graph.replay()
    with pytest.raises(CaptureStateError, match="was closed"):
        graph.replay_and_read()


def test_a_numpy_array_where_a_value_is_needed_is_an_ortgpu_error(session: InferenceSession) -> None:
    from ortgpu import ArgumentTypeError, OrtGpuError

    binding = session.io_binding()
    for call in (
        lambda: binding.bind_input("X", batch()),
        lambda: binding.bind_output("Y", batch()),
        lambda: session.run_with_ort_values(None, {"X": batch()}),  # type: ignore[dict-item]
        lambda: session.run(None, {"X": "not an array"}),  # type: ignore[dict-item]
        lambda: session.capture(binding, graph_id=1.5),  # type: ignore[arg-type]
    ):
        with pytest.raises(ArgumentTypeError) as info:
            call()
        assert isinstance(info.value, OrtGpuError) and isinstance(info.value, TypeError)


def test_a_release_from_a_finalizer_inside_a_device_call_waits_for_that_call(env: Env) -> None:
    """The collector may run a finalizer (a DeviceBuffer dying, a session collected unclosed) in the middle of one
    of the device's own calls on the same thread; its free must not change the device's tables under that call.
    Simulated by holding the device's lock (as a call in progress does) while freeing."""
    device = env.default_device._native_device()
    before = device.live_handles()
    buffer = device.create_buffer(64)
    with device._lock:  # a call of this device in progress on this thread
        device.destroy_buffer(buffer)  # what a finalizer would do
        assert device.live_handles() == before + 1, "freed under the call in progress"
        assert device._lock.deferred == 1
    assert device.live_handles() == before and device._lock.deferred == 0


def test_a_value_collected_inside_a_device_call_is_freed_after_it(env: Env) -> None:
    """The same through the core: the last reference to a device value dies while a device call is in progress."""
    device = env.default_device._native_device()
    before = owned_handles(env)
    value = env.shared_allocator(env.default_device).from_numpy(batch())
    with device._lock:
        del value
        gc.collect()
        assert owned_handles(env) == before + 1
    assert owned_handles(env) == before
