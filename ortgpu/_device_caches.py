"""State shared by every session on a device or an Env, kept at module level.

* the pipeline cache of each backend device: compiled pipelines are shared by all sessions on
  the device and live as long as the device does (a weak-keyed registry);
* the serial lock of each Env, which ``execution_mode == "serialized"`` takes around every submit.

Tests read ``_pipeline_caches`` (under ``_pipeline_caches_guard``) to tell cached pipelines from leaks.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from ortgpu_core import Env
from ortgpu_core.backends.protocol import BackendDevice

from ._executor import PipelineCache

_serial_locks: dict[int, threading.RLock] = {}
_serial_locks_guard = threading.Lock()
_pipeline_caches: "weakref.WeakKeyDictionary[Any, PipelineCache]" = weakref.WeakKeyDictionary()
_pipeline_caches_guard = threading.Lock()


def _pipeline_cache(device: BackendDevice) -> PipelineCache:
    """The pipeline cache of a backend device, shared by every session on it."""
    with _pipeline_caches_guard:
        cache = _pipeline_caches.get(device)
        if cache is None:
            cache = _pipeline_caches[device] = PipelineCache(device)
        return cache


def _serial_lock(env: Env) -> threading.RLock:
    with _serial_locks_guard:
        lock = _serial_locks.get(env.id)
        if lock is None:
            lock = _serial_locks[env.id] = threading.RLock()
        return lock
