"""Issue 15's failure states of capture and replay, with faults injected at each step (fake backend).

* A capture that fails (out-of-memory on an allocation, a pipeline that does not compile, a validation error or a
  device loss on the capture run's submit) registers no graph, leaves its binding unlocked (mutable), and the
  session stays usable: the same graph id captures again, other ids and ordinary runs work.
* A replay that fails (a validation error or device loss on its submit, in ``replay()``, ``replay_and_read()``,
  ``replay_async()`` or a profiled replay) leaves the graph ``failed``: every later replay raises
  ``CaptureStateError`` saying it failed and why (the original error chained: ``__cause__``) and to release it, or
  ``DeviceLostError`` when the failure was the device's loss; ``release()`` still works and unfreezes the binding;
  the session stays usable for other graph ids and ordinary runs.
* After each, closing everything leaves no native object alive.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any, Callable

import models
import numpy as np
import onnxruntime
import pytest

from ortgpu import CaptureStateError, Env, InferenceSession, IOBinding, OrtValue
from ortgpu_core._errors import DeviceError, DeviceLostError, OutOfMemoryError, ValidationError
from ortgpu_core.backends.fake import FakeBackend

BATCH, WIDTH = 2, 8
MODEL = models.mlp(layers=2, width=WIDTH, batch=BATCH, seed=5).SerializeToString()
_ORT = onnxruntime.InferenceSession(MODEL, providers=["CPUExecutionProvider"])


def reference(x: np.ndarray) -> np.ndarray:
    return np.asarray(_ORT.run(None, {"X": x})[0])


def image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((BATCH, WIDTH)).astype(np.float32)


def bound(sess: InferenceSession, seed: int) -> tuple[IOBinding, OrtValue[Any], OrtValue[Any]]:
    x = sess.allocator.from_numpy(image(seed))
    y = sess.allocator.empty((BATCH, WIDTH), "float32")
    binding = sess.io_binding()
    binding.bind_input("X", x)
    binding.bind_output("Y", y)
    return binding, x, y


def still_usable(sess: InferenceSession, graph_id: int) -> None:
    """Ordinary runs and a capture under ``graph_id`` work, with right results; everything made is released."""
    x = image(77)
    (y,) = sess.run(None, {"X": x})
    np.testing.assert_allclose(y, reference(x), rtol=1e-5, atol=1e-5)
    binding, x_value, y_value = bound(sess, 78)
    with sess.capture(binding, graph_id=graph_id) as graph:
        assert not graph.failed and graph.state == "live"
        x_value.update_inplace(image(79))
        graph.replay()
        np.testing.assert_allclose(y_value.to_numpy(), reference(image(79)), rtol=1e-5, atol=1e-5)
    x_value.release()
    y_value.release()


def close_all(env: Env, backend: FakeBackend, *values: OrtValue[Any], sess: InferenceSession) -> None:
    for value in values:
        value.release()
    sess.close()
    env.close()
    gc.collect()
    assert backend.live_handles() == 0, backend.describe_live_handles()


# -- capture -----------------------------------------------------------------------------------------------------

CAPTURE_FAULTS = ["allocation", "pipeline", "validation", "device_loss"]


def arm_capture_fault(backend: FakeBackend, sess: InferenceSession, step: str) -> type[Exception]:
    if step == "allocation":
        backend.faults.out_of_memory_on_allocation(1)
        return OutOfMemoryError
    if step == "validation":
        backend.faults.validation_error_on_submit(1)
        return ValidationError
    if step == "device_loss":
        backend.faults.lose_device_on_submit(1)
        return DeviceLostError
    # A pipeline that does not compile: the fake has no scheduled fault for it, so the device's method is wrapped
    # for one call (the session has not run yet: capture plans and compiles its kernels).
    device: Any = sess._runner.backend_device
    original = device.create_compute_pipeline

    def failing(*args: Any, **kwargs: Any) -> Any:
        device.create_compute_pipeline = original
        raise ValidationError("injected shader compilation error")

    device.create_compute_pipeline = failing
    return ValidationError


@pytest.mark.parametrize("step", CAPTURE_FAULTS)
def test_a_failed_capture_registers_nothing_and_unlocks_its_binding(step: str) -> None:
    backend = FakeBackend()
    env = Env(backend=backend)
    sess = InferenceSession(MODEL, env=env, graph_capture=True)
    binding, x, y = bound(sess, 1)
    expected = arm_capture_fault(backend, sess, step)
    with pytest.raises(expected, match="injected"):
        sess.capture(binding, graph_id=0)
    assert not backend.faults.pending, "the fault did not fire during the capture"
    assert sess.captured_graph_ids == []
    with pytest.raises(CaptureStateError, match="no captured graph 0"):
        sess.captured_graph(0)
    binding.bind_input("X", x)  # not locked
    if step == "device_loss":
        with pytest.raises(DeviceLostError):
            sess.capture(binding, graph_id=0)
        with pytest.raises(DeviceLostError):
            sess.run(None, {"X": image(2)})
        binding.bind_output("Y", y)  # a capture refused on a lost device does not lock the binding either
    else:
        still_usable(sess, 1)
        with sess.capture(binding, graph_id=0) as graph:  # the failed capture's id is free again
            graph.replay()
        np.testing.assert_allclose(y.to_numpy(), reference(image(1)), rtol=1e-5, atol=1e-5)
    close_all(env, backend, x, y, sess=sess)


def test_a_capture_failing_on_a_lost_device_frees_its_id_even_if_freeing_raises(monkeypatch: Any) -> None:
    """The rollback of a capture that met a device loss completes even when freeing its program raises (a backend
    may refuse frees on a lost device): no graph registered, the id free, the binding unlocked."""
    from ortgpu._executor import DeviceProgram

    release = DeviceProgram.release

    def release_then_raise(self: Any) -> None:
        release(self)
        raise DeviceLostError("injected: freeing on a lost device")

    backend = FakeBackend()
    env = Env(backend=backend)
    sess = InferenceSession(MODEL, env=env, graph_capture=True)
    binding, x, y = bound(sess, 2)
    backend.faults.lose_device_on_submit(1)
    monkeypatch.setattr(DeviceProgram, "release", release_then_raise)
    with pytest.raises(DeviceLostError, match="injected device loss"):
        sess.capture(binding, graph_id=0)
    monkeypatch.undo()
    assert sess.captured_graph_ids == []
    assert sess._runner.graphs._graphs == {}  # the id is not left reserved
    binding.bind_input("X", x)
    close_all(env, backend, x, y, sess=sess)


@pytest.mark.parametrize("step", ["allocation", "validation"])
def test_a_failed_capture_of_a_frozen_binding_unlocks_its_origin(step: str) -> None:
    backend = FakeBackend()
    env = Env(backend=backend)
    sess = InferenceSession(MODEL, env=env, graph_capture=True)
    binding, x, y = bound(sess, 2)
    frozen = binding.freeze()
    expected = arm_capture_fault(backend, sess, step)
    with pytest.raises(expected, match="injected"):
        sess.capture(frozen, graph_id=3)
    assert sess.captured_graph_ids == []
    binding.bind_input("X", x)  # the origin is not locked
    with sess.capture(binding.freeze(), graph_id=3) as graph:
        graph.replay()
    np.testing.assert_allclose(y.to_numpy(), reference(image(2)), rtol=1e-5, atol=1e-5)
    close_all(env, backend, x, y, sess=sess)


@pytest.mark.parametrize("step", ["allocation", "validation"])
def test_a_failed_capture_through_run_with_iobinding_leaves_the_id_free(step: str) -> None:
    from ortgpu import RunOptions

    backend = FakeBackend()
    env = Env(backend=backend)
    sess = InferenceSession(MODEL, env=env, graph_capture=True)
    binding, x, y = bound(sess, 3)
    expected = arm_capture_fault(backend, sess, step)
    with pytest.raises(expected, match="injected"):
        sess.run_with_iobinding(binding, RunOptions(gpu_graph_id=4))
    assert sess.captured_graph_ids == []
    sess.run_with_iobinding(binding, RunOptions(gpu_graph_id=4))  # captures now
    sess.run_with_iobinding(binding, RunOptions(gpu_graph_id=4))  # replays
    np.testing.assert_allclose(y.to_numpy(), reference(image(3)), rtol=1e-5, atol=1e-5)
    sess.release_captured_graph(4)
    close_all(env, backend, x, y, sess=sess)


# -- replay ------------------------------------------------------------------------------------------------------


def _replay(graph: Any) -> None:
    graph.replay()


def _replay_and_read(graph: Any) -> None:
    graph.replay_and_read()


def _replay_async(graph: Any) -> None:
    async def go() -> None:
        await graph.replay_async()

    asyncio.run(go())


def _replay_verified(graph: Any) -> None:
    graph.replay(verify=True)


REPLAYS: dict[str, Callable[[Any], None]] = {
    "replay": _replay,
    "replay_and_read": _replay_and_read,
    "replay_async": _replay_async,
    "verify": _replay_verified,
}


@pytest.mark.parametrize("profiled", [False, True], ids=["plain", "profiled"])
@pytest.mark.parametrize("how", list(REPLAYS))
@pytest.mark.parametrize("fault", ["validation", "device_loss"])
def test_a_failed_replay_leaves_the_graph_failed(fault: str, how: str, profiled: bool, tmp_path: Any) -> None:
    backend = FakeBackend()
    env = Env(backend=backend)
    sess = InferenceSession(
        MODEL, env=env, graph_capture=True, profile=profiled, profile_file_prefix=str(tmp_path / "trace")
    )
    binding, x, y = bound(sess, 4)
    graph = sess.capture(binding, graph_id=0)
    graph.replay()
    assert graph.state == "live" and not graph.failed and graph.failure is None
    expected: type[DeviceError]
    if fault == "validation":
        backend.faults.validation_error_on_submit(1)
        expected = ValidationError
    else:
        backend.faults.lose_device_on_submit(1)
        expected = DeviceLostError
    with pytest.raises(expected, match="injected"):
        REPLAYS[how](graph)
    assert not backend.faults.pending
    assert graph.failed and graph.state == "failed"
    assert isinstance(graph.failure, expected)
    assert "failed" in repr(graph)
    for again in REPLAYS.values():  # every way of replaying refuses now, saying why
        if fault == "validation":
            with pytest.raises(CaptureStateError, match="failed.*injected.*release") as raised:
                again(graph)
            assert raised.value.__cause__ is graph.failure
        else:
            with pytest.raises(DeviceLostError):
                again(graph)
    if fault == "validation":
        from ortgpu import RunOptions

        with pytest.raises(CaptureStateError, match="failed"):
            sess.run_with_iobinding(binding, RunOptions(gpu_graph_id=0))
        still_usable(sess, 1)  # other ids and ordinary runs work meanwhile
    assert sess.captured_graph(0) is graph  # still registered (its id taken) until released
    assert graph.release() is binding
    assert graph.released and not graph.failed and graph.state != "failed"
    assert sess.captured_graph_ids == []
    binding.bind_input("X", x)  # unfrozen
    if fault == "validation":
        with sess.capture(binding, graph_id=0) as again_graph:  # the id captures again
            x.update_inplace(image(5))
            again_graph.replay()
            np.testing.assert_allclose(y.to_numpy(), reference(image(5)), rtol=1e-5, atol=1e-5)
    if profiled:
        sess.end_profiling()
    close_all(env, backend, x, y, sess=sess)


def test_a_refused_replay_does_not_fail_the_graph() -> None:
    """Refusals before anything is submitted (a closed session, a wrong binding) are not failures of the graph."""
    backend = FakeBackend()
    env = Env(backend=backend)
    sess = InferenceSession(MODEL, env=env, graph_capture=True)
    binding, x, y = bound(sess, 6)
    graph = sess.capture(binding, graph_id=0)
    other, x2, y2 = bound(sess, 7)
    from ortgpu import RunOptions

    with pytest.raises(CaptureStateError, match="another binding"):
        sess.run_with_iobinding(other, RunOptions(gpu_graph_id=0))
    assert graph.state == "live"
    graph.replay()
    sess.close()
    assert graph.released and graph.state != "live" and not graph.failed
    close_all(env, backend, x, y, x2, y2, sess=sess)
