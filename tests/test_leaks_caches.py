"""Per-device and per-Env state at module level goes with its device and Env; the fake backend keeps nothing
per handle it ever created (issue 10, item 9).

Before: ``_device_caches._pipeline_caches`` (weak-keyed by device) held a PipelineCache that held its own key,
so no entry was ever freed (201 after 200 Envs); ``_serial_locks`` was keyed by ``env.id`` forever; the fake
backend compiled 2 new pipelines per session of the same model (keyed by twin) and kept them for the device's
life, and kept a record of every handle it ever gave out and every device it ever opened.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import models
import numpy as np
import pytest

import ortgpu
from ortgpu import _device_caches
from ortgpu._pipeline_cache import PipelineCache
from ortgpu_core._errors import ValidationError
from ortgpu_core.backends.fake import FREED_RECORDS_KEPT, FakeBackend
from ortgpu_core.backends.wgpu_native import WgpuBackend

WIDTH = 8


def _model() -> bytes:
    return models.mlp(layers=2, width=WIDTH, batch=1).SerializeToString()


def _backend(name: str) -> WgpuBackend | FakeBackend:
    return WgpuBackend() if name == "wgpu" else FakeBackend()


def _cached_devices() -> list[Any]:
    with _device_caches._pipeline_caches_guard:
        return list(_device_caches._pipeline_caches.keys())


def _run_tiny(env: ortgpu.Env) -> ortgpu.InferenceSession:
    sess = ortgpu.InferenceSession(_model(), env=env)
    x = np.arange(WIDTH, dtype=np.float32).reshape(1, WIDTH)
    (y,) = sess.run(None, {"X": x})
    assert y.shape == (1, WIDTH)
    return sess


@pytest.mark.parametrize("keep", [False, True], ids=["dropped", "kept-closed"])
def test_closed_envs_leave_no_pipeline_cache(backend_name: str, keep: bool) -> None:
    """50 Envs, each running a tiny model, then closed: no cache entry for their devices remains, whether the
    Envs and sessions are dropped (then the devices themselves are freed) or kept, closed, by the caller."""
    gc.collect()
    before = len(_cached_devices())
    kept: list[Any] = []
    devices: list[weakref.ref[Any]] = []
    for _ in range(50):
        env = ortgpu.Env(backend=_backend(backend_name))
        sess = _run_tiny(env)
        device = sess._runner.backend_device  # the backend device the session's pipelines were cached for
        assert any(d is device for d in _cached_devices())
        env.close()
        assert device.destroyed
        assert not any(d is device for d in _cached_devices()), "the entry outlived env.close()"
        devices.append(weakref.ref(device))
        if keep:
            kept.append((env, sess))
        del env, sess, device
    gc.collect()
    cached = _cached_devices()
    assert len(cached) == before
    assert not any(d is ref() for d in cached for ref in devices)
    if not keep:
        assert all(ref() is None for ref in devices), "a closed, unreferenced device is still alive"


def test_pipeline_cache_does_not_keep_its_device_alive(backend_name: str) -> None:
    backend = _backend(backend_name)
    device = backend.open_device(backend.default_adapter_index())
    cache = _device_caches._pipeline_cache(device)
    assert cache.device is device
    device.destroy()
    assert device not in _device_caches._pipeline_caches  # dropped by the destroy callback
    del device
    gc.collect()
    with pytest.raises(ortgpu.ReleasedValueError, match="device of this PipelineCache is gone"):
        cache.device  # noqa: B018
    cache.release()  # nothing to release: the device freed everything
    if isinstance(backend, WgpuBackend):
        backend.close()


def test_serial_locks_go_with_their_envs(backend_name: str) -> None:
    gc.collect()
    before = len(_device_caches._serial_locks)
    envs = []
    for _ in range(20):
        env = ortgpu.Env(backend=_backend(backend_name), execution_mode="serialized")
        _run_tiny(env).close()
        assert env in _device_caches._serial_locks
        env.close()
        envs.append(env)
    # kept but closed: pruned by the next serialized Env's first submit
    with ortgpu.Env(backend=_backend(backend_name), execution_mode="serialized") as live:
        _run_tiny(live).close()
        assert [env for env in _device_caches._serial_locks.keys() if env in envs] == []
    envs.clear()
    del live
    gc.collect()
    assert len(_device_caches._serial_locks) <= before


@pytest.mark.fake_only
def test_fake_pipelines_and_records_return_to_baseline_after_sessions_close() -> None:
    backend = FakeBackend()
    with ortgpu.Env(backend=backend) as env:
        _run_tiny(env).close()  # warm-up: the device is open
        gc.collect()
        (device,) = backend.devices
        baseline = (len(device._pipelines), env.live_handles(), backend._handles.live_count)
        for _ in range(30):
            sess = ortgpu.InferenceSession(_model(), env=env, graph_capture=True)
            x = sess.allocator.from_numpy(np.ones((1, WIDTH), np.float32))
            y = sess.allocator.empty((1, WIDTH), "float32")
            binding = sess.io_binding()
            binding.bind_input("X", x)
            binding.bind_output("Y", y)
            sess.capture(binding, graph_id=0).replay()
            assert len(device._pipelines) > baseline[0]  # this session's pipelines, while it lives
            sess.close()
            del sess, binding, x, y
        gc.collect()
        assert (len(device._pipelines), env.live_handles(), backend._handles.live_count) == baseline
        # freed handles are remembered up to FREED_RECORDS_KEPT of them (to name stale ones), no more
        assert backend.handle_records <= baseline[2] + FREED_RECORDS_KEPT
        cache = _device_caches._pipeline_caches[device]
        assert len(cache) == len(device._pipelines)
    # devices closed: the backend holds no record of a live handle, and no destroyed device nobody references
    assert backend._handles.live_count == 0 and backend.live_handles() == 0
    del device, cache
    gc.collect()
    assert backend.devices == ()


@pytest.mark.fake_only
def test_fake_pipeline_goes_with_the_last_kernel_that_uses_it() -> None:
    """A twin-keyed entry stays while any plan (kernel) uses its pipeline, and goes with the last one."""
    from ortgpu.ops import KernelSpec

    backend = FakeBackend()
    device = backend.open_device(0)
    cache = PipelineCache(device)

    def twin(arrays: Any, grid: Any) -> None:
        pass

    wgsl = "@compute @workgroup_size(1) fn main() {}"
    first = KernelSpec("k", wgsl, (1, 1, 1), (), twin)
    second = KernelSpec("k", wgsl, (1, 1, 1), (), twin)  # another plan's kernel with the same twin
    pipeline = cache.get(first)
    assert cache.get(second) == pipeline and device.live_handles() == 1
    del first
    gc.collect()
    assert len(cache) == 1 and device.live_handles() == 1  # second still uses it
    del second
    gc.collect()
    assert len(cache) == 0 and device.live_handles() == 0
    cache.release()
    device.destroy()


@pytest.mark.fake_only
def test_fake_names_stale_handles_without_keeping_every_record() -> None:
    backend = FakeBackend()
    device = backend.open_device(0)
    first = device.create_buffer(4, label="first")
    device.destroy_buffer(first)
    with pytest.raises(ValidationError, match=rf"buffer {first} \('first'\) was already freed"):
        device.write_buffer(first, 0, bytes(4))
    for _ in range(FREED_RECORDS_KEPT + 10):
        device.destroy_buffer(device.create_buffer(4))
    assert backend.handle_records == FREED_RECORDS_KEPT and device.live_handles() == 0
    # freed too long ago to be described, but still refused as a stale handle, never mistaken for a live one
    with pytest.raises(ValidationError, match=rf"handle {first} was already freed"):
        device.write_buffer(first, 0, bytes(4))
    with pytest.raises(ValidationError, match="not a handle of the fake backend"):
        device.destroy_buffer(10**9)
    # handles freed by destroy() may still be released afterwards, however many there were
    leftovers = [device.create_buffer(4) for _ in range(FREED_RECORDS_KEPT + 10)]
    device.destroy()
    for buffer in leftovers:
        device.destroy_buffer(buffer)
