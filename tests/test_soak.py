"""Bounded soak tests: repeated capture/replay/release, session and Env cycles leak no native memory.

Native leaks are invisible to ``live_handles()`` (which counts what ortgpu created), so these tests read the
process's resident set size (``/proc/self/statm``) after a warm-up (caches filled, allocator arenas grown) and
assert that what one more stretch of cycles adds, extrapolated to 1000 cycles, stays under a bound, and that the
live handles come back to their starting value.

Figures on lavapipe (wgpu-native 29), MB per 1000 cycles, before -> after the fixes of issue 10:

* capture, 2 replays, a read, release on one session:       +95.6 -> 0.0  (encode-ahead off: 0.0)
* session create, capture, replay, read, close on one Env:   +106  -> -0.4 (encode-ahead off: -0.3)
* Env create, session, capture, replay, read, Env close:     +1805 -> 0.2

Before, each graph released with a command buffer encoded ahead leaked that buffer inside wgpu-native (about
90 KB on lavapipe, with the Arc of its wgpu-core device, so whole devices leaked with closed Envs); see
``NativeTable.submitted_flag_offset``.  The bound, 10 MB per 1000 cycles (25 for Env cycles, measured over fewer
cycles), is an order of magnitude under the leaks it guards against and far over the noise measured (< 1 MB).
"""

from __future__ import annotations

import gc
import os
from typing import Callable

import numpy as np
import pytest

import models
import ortgpu
from ortgpu_core.backends.fake import FakeBackend
from ortgpu_core.backends.wgpu_native import WgpuBackend

WIDTH = 16
BATCH = 2


def rss_mb() -> float:
    """This process's resident set size in MiB (the second field of /proc/self/statm, in pages)."""
    with open("/proc/self/statm", encoding="ascii") as statm:
        resident_pages = int(statm.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGESIZE") / 2**20


def growth_per_1000(cycle: Callable[[], None], warm_up: int, cycles: int, env_of: Callable[[], ortgpu.Env] | None = None) -> tuple[float, int, int]:
    """Run ``cycle`` ``warm_up`` times, then ``cycles`` times; the RSS growth of the second stretch per 1000
    cycles, and the live handles (of ``env_of()``) before and after it."""
    for _ in range(warm_up):
        cycle()
    gc.collect()
    handles_before = env_of().live_handles() if env_of is not None else 0
    before = rss_mb()
    for _ in range(cycles):
        cycle()
    gc.collect()
    after = rss_mb()
    handles_after = env_of().live_handles() if env_of is not None else 0
    return (after - before) / cycles * 1000, handles_before, handles_after


def _model() -> bytes:
    return models.mlp(layers=2, width=WIDTH, batch=BATCH).SerializeToString()


def _backend(name: str) -> WgpuBackend | FakeBackend:
    return WgpuBackend() if name == "wgpu" else FakeBackend()


def _check(name: str, what: str, per_1000: float, bound: float) -> None:
    # RSS is asserted on both backends: the fake's handle records and pipelines used to grow with every session.
    print(f"{what} on {name}: {per_1000:+.1f} MB RSS per 1000 cycles")  # shown by pytest -s
    assert per_1000 < bound, f"{what} on {name}: RSS grew {per_1000:.1f} MB per 1000 cycles (bound {bound} MB)"


def test_capture_replay_release_cycles_on_one_session(backend_name: str) -> None:
    model = _model()
    env = ortgpu.Env(backend=_backend(backend_name))
    try:
        if backend_name == "wgpu":
            assert env.default_device._native_device().encode_ahead  # the leak was in encode-ahead
        sess = ortgpu.InferenceSession(model, env=env, graph_capture=True)
        x = sess.allocator.from_numpy(np.ones((BATCH, WIDTH), np.float32))
        y = sess.allocator.empty((BATCH, WIDTH), "float32")
        binding = sess.io_binding()
        binding.bind_input("X", x)
        binding.bind_output("Y", y)
        reference = sess.run(None, {"X": np.ones((BATCH, WIDTH), np.float32)})[0]
        step = [0]

        def cycle() -> None:
            graph = sess.capture(binding, graph_id=0)
            graph.replay()
            graph.replay()
            step[0] += 1
            if step[0] % 50 == 0:  # the replays still compute (the encoded-ahead buffer is the right one)
                np.testing.assert_allclose(y.to_numpy(), reference, rtol=1e-5, atol=1e-6)
            else:
                y.to_numpy()
            graph.release()

        per_1000, handles_before, handles_after = growth_per_1000(cycle, warm_up=40, cycles=400, env_of=lambda: env)
        assert handles_after == handles_before
        _check(backend_name, "capture/replay/release", per_1000, 10.0)
        sess.close()
    finally:
        env.close()


def test_session_create_capture_close_cycles(backend_name: str) -> None:
    model = _model()
    env = ortgpu.Env(backend=_backend(backend_name))
    data = np.arange(BATCH * WIDTH, dtype=np.float32).reshape(BATCH, WIDTH) / 10

    def cycle() -> None:
        sess = ortgpu.InferenceSession(model, env=env, graph_capture=True)
        x = sess.allocator.from_numpy(data)
        y = sess.allocator.empty((BATCH, WIDTH), "float32")
        binding = sess.io_binding()
        binding.bind_input("X", x)
        binding.bind_output("Y", y)
        graph = sess.capture(binding, graph_id=0)
        graph.replay()
        (out,) = graph.replay_and_read()
        assert out.shape == (BATCH, WIDTH)
        sess.close()

    try:
        per_1000, handles_before, handles_after = growth_per_1000(cycle, warm_up=20, cycles=250, env_of=lambda: env)
        assert handles_after == handles_before
        _check(backend_name, "session create/capture/close", per_1000, 10.0)
    finally:
        env.close()


def test_env_create_capture_close_cycles(backend_name: str) -> None:
    model = _model()
    data = np.ones((BATCH, WIDTH), np.float32)

    def cycle() -> None:
        env = ortgpu.Env(backend=_backend(backend_name))
        sess = ortgpu.InferenceSession(model, env=env, graph_capture=True)
        x = sess.allocator.from_numpy(data)
        y = sess.allocator.empty((BATCH, WIDTH), "float32")
        binding = sess.io_binding()
        binding.bind_input("X", x)
        binding.bind_output("Y", y)
        graph = sess.capture(binding, graph_id=0)
        graph.replay()
        y.to_numpy()
        env.close()
        assert env.live_handles() == 0

    per_1000, _, _ = growth_per_1000(cycle, warm_up=8, cycles=60)
    _check(backend_name, "Env create/capture/close", per_1000, 25.0)
