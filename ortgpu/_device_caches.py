"""State shared by every session on a device or an Env, kept at module level.

* the pipeline cache of each backend device: compiled pipelines are shared by all sessions on
  the device and live as long as the device does (a weak-keyed registry; the cache holds its
  device weakly, so the entry goes with the device object, and at once when the device is
  destroyed: ``Env.close()`` destroys its devices);
* the serial lock of each Env, which ``execution_mode == "serialized"`` takes around every submit
  (weak-keyed by the Env; dropped when the Env is collected, or closed).

Tests read ``_pipeline_caches`` (under ``_pipeline_caches_guard``) to tell cached pipelines from leaks.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any

from ortgpu_core import Env
from ortgpu_core.backends.protocol import BackendDevice

from ._pipeline_cache import PipelineCache

_serial_locks: "weakref.WeakKeyDictionary[Env, threading.RLock]" = weakref.WeakKeyDictionary()
_serial_locks_guard = threading.Lock()
_pipeline_caches: "weakref.WeakKeyDictionary[Any, PipelineCache]" = weakref.WeakKeyDictionary()
# Reentrant: a device destroyed while this thread holds the guard (say, collected) runs its callback here.
_pipeline_caches_guard = threading.RLock()


def _pipeline_cache(device: BackendDevice) -> PipelineCache:
    """The pipeline cache of a backend device, shared by every session on it."""
    with _pipeline_caches_guard:
        dropped = _drop_destroyed()
        cache = _pipeline_caches.get(device)
        if cache is None:
            cache = _pipeline_caches[device] = PipelineCache(device)
            # The backends of ortgpu_core call back when the device is destroyed; for others, the entry goes
            # with the device object, or at the next call here once the device says it is destroyed.
            at_destroy = getattr(device, "add_destroy_callback", None)
            if at_destroy is not None:
                at_destroy(functools.partial(_forget_device, weakref.ref(device)))
    for stale in dropped:  # outside the guard: forget() takes the cache's own lock
        stale.forget()
    return cache


def _forget_device(device_ref: "weakref.ref[Any]") -> None:
    """Drop the pipeline cache of a destroyed device (the device freed its pipelines)."""
    device = device_ref()
    if device is None:
        return
    with _pipeline_caches_guard:
        cache = _pipeline_caches.pop(device, None)
    if cache is not None:
        cache.forget()


def _drop_destroyed() -> list[PipelineCache]:
    """Drop the entries of devices that are destroyed but still referenced (under the guard); their caches."""
    dropped = []
    for device in [device for device in list(_pipeline_caches.keys()) if getattr(device, "destroyed", False)]:
        cache = _pipeline_caches.pop(device, None)
        if cache is not None:
            dropped.append(cache)
    return dropped


def _serial_lock(env: Env) -> threading.RLock:
    with _serial_locks_guard:
        for closed in [other for other in list(_serial_locks.keys()) if other.closed and other is not env]:
            _serial_locks.pop(closed, None)
        lock = _serial_locks.get(env)
        if lock is None:
            lock = _serial_locks[env] = threading.RLock()
        return lock
