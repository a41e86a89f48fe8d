"""Issue 15: device loss mid-run while other threads use (and wait on) the same device, on both backends.

Fake backend: device operations take time outside the fake's lock (``operations.set_latency``), and the loss is a
fault injected into the next submit.  wgpu-native (lavapipe): the device is destroyed under its lock, as a driver
reset would leave it (wgpu-native 29 then calls no device-lost callback: each later native call reports "device
is lost").  Either way, when the loss comes other threads are inside a run, a replay, a read or an async run (their
waits happen outside the device's lock), or queued on a session's lock behind one.  Then:

* every thread's next call on the device raises ``DeviceLostError`` promptly (the threads are joined with a
  timeout: a hang fails the test), and nothing else is raised;
* every later call of every kind, in any thread, raises ``DeviceLostError`` (not a hang, not another error);
* releasing the graphs and values and closing the sessions and the Env works, leaving no native object alive;
* a new Env on the same backend works and gives right results.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from typing import Any, Callable

import models
import numpy as np
import onnxruntime
import pytest

from ortgpu import Env, InferenceSession
from ortgpu_core._errors import DeviceLostError
from ortgpu_core.backends.fake import FakeBackend
from ortgpu_core.backends.wgpu_native import WgpuBackend, load_native

BATCH, WIDTH = 2, 8
MODEL = models.mlp(layers=3, width=WIDTH, batch=BATCH, seed=9).SerializeToString()
_ORT = onnxruntime.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
PROMPT = 10.0  # seconds: every thread must have seen the loss by then


def reference(x: np.ndarray) -> np.ndarray:
    return np.asarray(_ORT.run(None, {"X": x})[0])


def image(*key: int) -> np.ndarray:
    return np.random.default_rng(list(key)).standard_normal((BATCH, WIDTH)).astype(np.float32)


def check(actual: np.ndarray, x: np.ndarray) -> None:
    np.testing.assert_allclose(actual, reference(x), rtol=1e-5, atol=1e-5)


class Worker:
    """Runs ``step(i)`` until it raises; records the error (DeviceLostError expected) and the steps done."""

    def __init__(self, name: str, step: Callable[[int], None], warmed: threading.Barrier) -> None:
        self.name = name
        self.step = step
        self.warmed = warmed
        self.done = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def _loop(self) -> None:
        try:
            while True:
                self.step(self.done)
                self.done += 1
                if self.done == 2:
                    self.warmed.wait(timeout=30)
        except BaseException as error:  # noqa: BLE001 - checked by the test
            self.error = error
            if self.done < 2:
                self.warmed.abort()


def _lose_wgpu_device(env: Env) -> None:
    """Destroy the Env's wgpu device under its lock, behind the library's back (what a driver reset leaves)."""
    opened = env.default_device._native_device()
    device: Any = getattr(opened, "wrapped", opened)  # a SerializedDevice in serialized mode
    _, lib = load_native()
    with device._lock.exclusive():
        lib.wgpuDeviceDestroy(device._device)


@pytest.mark.parametrize("mode", ["concurrent", "serialized"])
@pytest.mark.parametrize(
    "kind", [pytest.param("fake", marks=pytest.mark.fake_only), pytest.param("wgpu", marks=pytest.mark.wgpu_only)]
)
def test_device_loss_with_threads_waiting(mode: str, kind: str) -> None:
    backend: Any
    if kind == "fake":
        backend = FakeBackend()
        backend.operations.set_latency(submit=0.003, write=0.001, read=0.002, allocate=0.001)
    else:
        backend = WgpuBackend()
    env = Env(backend=backend, execution_mode=mode)  # type: ignore[arg-type]
    runs = InferenceSession(MODEL, env=env)
    replays = InferenceSession(MODEL, env=env, graph_capture=True)
    asyncs = InferenceSession(MODEL, env=env)
    shared = env.shared_allocator()
    x_value = replays.allocator.from_numpy(image(0))
    y_value = replays.allocator.empty((BATCH, WIDTH), "float32")
    binding = replays.io_binding()
    binding.bind_input("X", x_value)
    binding.bind_output("Y", y_value)
    graph = replays.capture(binding, graph_id=0)
    read_value = shared.from_numpy(image(1))

    def run(i: int) -> None:  # two threads share this session: one of them waits on its lock
        x = image(2, i)
        check(runs.run(None, {"X": x})[0], x)

    def replay(i: int) -> None:
        x = image(3, i)
        x_value.update_inplace(x)
        graph.replay()
        check(y_value.to_numpy(), x)

    def replay_and_read(i: int) -> None:
        (y,) = graph.replay_and_read()  # its input is the replay thread's, changing: only the shape is known
        assert y.shape == (BATCH, WIDTH)

    def read(i: int) -> None:
        np.testing.assert_array_equal(read_value.to_numpy(), image(1))

    def run_async(i: int) -> None:
        x = image(4, i)

        async def go() -> list[np.ndarray]:
            return await asyncs.run_async(None, {"X": x})

        check(asyncio.run(go())[0], x)

    def allocate(i: int) -> None:
        value = shared.from_numpy(image(5, i))
        try:
            np.testing.assert_array_equal(value.to_numpy(), image(5, i))
        finally:
            value.release()

    steps = {
        "run-1": run,
        "run-2": run,
        "replay": replay,
        "replay_and_read": replay_and_read,
        "read": read,
        "run_async": run_async,
        "allocate": allocate,
    }
    warmed = threading.Barrier(len(steps) + 1)
    workers = [Worker(name, step, warmed) for name, step in steps.items()]
    for worker in workers:
        worker.thread.start()
    warmed.wait(timeout=60)  # every thread has done two steps and is busy again
    time.sleep(0.02)
    if kind == "fake":
        backend.faults.lose_device_on_submit(1)
    else:
        _lose_wgpu_device(env)
    lost_at = time.monotonic()
    for worker in workers:
        worker.thread.join(timeout=max(0.1, lost_at + PROMPT - time.monotonic()))
    hung = [w.name for w in workers if w.thread.is_alive()]
    assert not hung, f"threads still running {PROMPT} s after the device loss: {hung}"
    assert kind != "fake" or not backend.faults.pending
    wrong = {w.name: repr(w.error) for w in workers if not isinstance(w.error, DeviceLostError)}
    assert not wrong, f"threads that ended with another error than DeviceLostError: {wrong}"

    # Every later call, of every kind, raises DeviceLostError, promptly, from any thread.
    later: dict[str, Callable[[], Any]] = {
        "run": lambda: runs.run(None, {"X": image(6)}),
        "run_async": lambda: asyncio.run(_await(lambda: asyncs.run_async(None, {"X": image(6)}))),
        "replay": graph.replay,
        "replay_and_read": graph.replay_and_read,
        "replay_async": lambda: asyncio.run(_await(graph.replay_async)),
        "to_numpy": read_value.to_numpy,
        "update_inplace": lambda: x_value.update_inplace(image(7)),
        "from_numpy": lambda: shared.from_numpy(image(8)),
        "empty": lambda: runs.allocator.empty((BATCH, WIDTH), "float32"),
        "copy_from": lambda: read_value.copy_from(y_value),
        # Creating a session makes no device call (its weights upload on its first run), so it is that run which
        # raises.
        "new session's run": lambda: _new_session_run(env),
    }
    outcomes: dict[str, str] = {}

    def call_all() -> None:
        for name, call in later.items():
            started = time.monotonic()
            try:
                call()
                outcomes[name] = "returned"
            except DeviceLostError:
                outcomes[name] = "lost" if time.monotonic() - started < PROMPT else "slow"
            except BaseException as error:  # noqa: BLE001 - reported below
                outcomes[name] = repr(error)

    caller = threading.Thread(target=call_all, daemon=True)
    caller.start()
    caller.join(timeout=60)
    assert not caller.is_alive(), f"a call after the loss hung; done: {outcomes}"
    assert all(v == "lost" for v in outcomes.values()), {k: v for k, v in outcomes.items() if v != "lost"}
    assert graph.failed and isinstance(graph.failure, DeviceLostError)  # its replay met the loss; release works

    assert graph.release() is binding
    for value in (x_value, y_value, read_value):
        value.release()
    for sess in (runs, replays, asyncs):
        sess.close()
    env.close()
    gc.collect()
    assert backend.live_handles() == 0, backend.describe_live_handles()

    if kind == "fake":
        backend.operations.clear_latency()
    with Env(backend=backend, execution_mode=mode) as fresh:  # type: ignore[arg-type]
        sess = InferenceSession(MODEL, env=fresh, graph_capture=True)
        x = image(9)
        check(sess.run(None, {"X": x})[0], x)
        value = fresh.shared_allocator().from_numpy(x)
        out = sess.allocator.empty((BATCH, WIDTH), "float32")
        b = sess.io_binding()
        b.bind_input("X", value)
        b.bind_output("Y", out)
        with sess.capture(b, graph_id=0) as g:
            g.replay()
            check(out.to_numpy(), x)
        value.release()
        out.release()
        sess.close()
    gc.collect()
    assert backend.live_handles() == 0, backend.describe_live_handles()


def _new_session_run(env: Env) -> None:
    sess = InferenceSession(MODEL, env=env)
    try:
        sess.run(None, {"X": image(10)})
    finally:
        sess.close()


async def _await(make: Callable[[], Any]) -> Any:
    return await make()


def test_a_thread_blocked_on_a_sessions_lock_sees_the_loss() -> None:
    """A thread queued behind a long run of the same session, when that run loses the device, gets
    DeviceLostError as soon as it holds the lock (it does not wait for anything else)."""
    backend = FakeBackend()
    backend.operations.set_latency(submit=0.2)
    env = Env(backend=backend)
    sess = InferenceSession(MODEL, env=env)
    sess.run(None, {"X": image(0)})
    backend.faults.lose_device_on_submit(1)
    errors: list[BaseException | None] = [None, None]

    def call(k: int) -> None:
        try:
            sess.run(None, {"X": image(k)})
        except BaseException as error:  # noqa: BLE001 - checked below
            errors[k] = error

    threads = [threading.Thread(target=call, args=(k,), daemon=True) for k in (0, 1)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=PROMPT)
    assert not any(t.is_alive() for t in threads)
    assert time.monotonic() - started < PROMPT
    assert all(isinstance(e, DeviceLostError) for e in errors), errors
    sess.close()
    env.close()
    gc.collect()
    assert backend.live_handles() == 0, backend.describe_live_handles()
