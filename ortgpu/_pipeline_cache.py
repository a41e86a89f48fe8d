"""The compute pipelines of one device, keyed by their WGSL text and shared by every session on the device
(compiling is the expensive part on lavapipe).  Devices that run numpy twins instead of WGSL (the fake backend)
key by the twin too, since a twin is specific to its node.  The registry of one cache per device is
:mod:`ortgpu._device_caches`; programs (:mod:`ortgpu._executor`) get their pipelines here.
"""

from __future__ import annotations

import functools
import threading
import warnings
import weakref
from collections import OrderedDict
from typing import Any, Hashable

from ortgpu_core._errors import ReleasedValueError
from ortgpu_core.backends.protocol import BackendDevice

from .ops import KernelSpec

__all__ = ["DEFAULT_MAX_IDLE_PIPELINES", "PipelineCache"]


#: Pipelines a device's cache keeps when no plan uses them any more (see :class:`PipelineCache`).
DEFAULT_MAX_IDLE_PIPELINES = 256


class PipelineCache:
    """Compute pipelines of one device, keyed by WGSL text; shared by sessions.

    The cache owns its pipelines until :meth:`release` (or until its device is destroyed, which frees them).  It
    holds its device weakly, so a registry keyed by the device (:mod:`ortgpu._device_caches`) does not keep
    the device, or itself, alive.

    Each entry knows the :class:`KernelSpec` objects that asked for it (weakly).  When the last one is garbage, no
    plan uses the pipeline any more (plans hold their kernels; programs and captured graphs hold their plans):

    * on devices that run numpy twins (the fake backend), a pipeline is specific to its twin, which is specific to
      one node of one plan (the key is the WGSL text and the twin), so no later plan can hit it: it is released;
    * elsewhere the entry turns *idle*: kept for later sessions of the same model, up to ``max_idle`` idle
      entries, the least recently used released past that.  WGSL carries the shapes, so a session fed a new shape
      on every call would otherwise add pipelines without bound.

    A pipeline is released at once when the cache's lock is free, else at the next :meth:`get`, :meth:`collect`
    or :meth:`release`.
    """

    def __init__(self, device: BackendDevice, max_idle: int = DEFAULT_MAX_IDLE_PIPELINES) -> None:
        self._device = weakref.ref(device)
        self._twins_key = device.runs_numpy_twins
        self._pipelines: dict[Hashable, int] = {}
        # Twin-keyed caches: per key, weak references to the kernels that use its pipeline, by id (each one's
        # callback queues (key, id) in _dead; the entry goes with its last kernel).  The twin's id is part of
        # the key: a pipeline holds its twin, so the id is not reused while the entry lives.
        self._users: dict[Hashable, dict[int, weakref.ref[Any]]] = {}
        self._dead: list[tuple[Hashable, int]] = []
        # Entries no live kernel uses (not on twin devices), least recently used first.
        self._idle: OrderedDict[Hashable, None] = OrderedDict()
        self.max_idle = max_idle
        self._released = False
        self.hits = 0
        self.misses = 0
        # Sessions on several threads share the cache: one lock makes look-up-or-compile atomic, so two
        # threads never both compile a kernel and orphan one of the pipelines.
        self._lock = threading.Lock()

    @property
    def device(self) -> BackendDevice:
        device = self._device()
        if device is None:
            raise ReleasedValueError("the device of this PipelineCache is gone")
        return device

    def get(self, kernel: KernelSpec) -> int:
        """The pipeline for ``kernel``, compiling it on first use."""
        key: Hashable = (kernel.wgsl, id(kernel.twin)) if self._twins_key else kernel.wgsl
        with self._lock:
            if self._released:
                raise ReleasedValueError("this PipelineCache was released; create a new one for the device")
            self._release_dead()
            pipeline = self._pipelines.get(key)
            if pipeline is not None:
                self.hits += 1
                self._idle.pop(key, None)
            else:
                self.misses += 1
                pipeline = self.device.create_compute_pipeline(kernel.wgsl, twin=kernel.twin, label=kernel.name)
                self._pipelines[key] = pipeline
            users = self._users.setdefault(key, {})
            known = users.get(id(kernel))
            if known is None or known() is not kernel:
                users[id(kernel)] = weakref.ref(
                    kernel, functools.partial(_kernel_died, weakref.ref(self), key, id(kernel))
                )
            return pipeline

    @property
    def idle(self) -> int:
        """Entries no live kernel uses, kept for reuse (at most ``max_idle``)."""
        return len(self._idle)

    def __len__(self) -> int:
        return len(self._pipelines)

    def collect(self) -> None:
        """Handle the kernels that died: release or idle their pipelines (see the class)."""
        with self._lock:
            self._release_dead()

    def _release_dead(self) -> None:
        # Under self._lock.  Pops each entry before releasing its pipeline, so nothing is released twice.
        while self._dead:
            key, kernel_id = self._dead.pop()
            users = self._users.get(key)
            if users is None:
                continue
            ref = users.get(kernel_id)
            if ref is not None and ref() is None:
                del users[kernel_id]
            if users:
                continue
            del self._users[key]
            if not self._twins_key:
                self._idle[key] = None
                if len(self._idle) <= self.max_idle:
                    continue
                key, _ = self._idle.popitem(last=False)
            pipeline = self._pipelines.pop(key, None)
            device = self._device()
            if pipeline is not None and device is not None and not getattr(device, "destroyed", False):
                device.release_pipeline(pipeline)

    def release(self) -> None:
        """Release every pipeline.  Idempotent; programs using them must be released first."""
        with self._lock:
            pipelines, self._pipelines = self._pipelines, {}
            self._users = {}
            self._dead = []
            self._idle.clear()
            self._released = True
        device = self._device()
        if device is None or getattr(device, "destroyed", False):
            return  # the device freed them
        for pipeline in pipelines.values():
            device.release_pipeline(pipeline)

    def forget(self) -> None:
        """The device was destroyed (which freed every pipeline): drop the entries without releasing them."""
        with self._lock:
            self._pipelines = {}
            self._users = {}
            self._dead = []
            self._idle.clear()
            self._released = True


def _kernel_died(cache_ref: "weakref.ref[PipelineCache]", key: Hashable, kernel_id: int, _ref: object) -> None:
    """A kernel that used an entry is garbage: queue it, and release (or idle) the entry's pipeline now if that
    was its last kernel and the cache is free.

    Called by the garbage collector or when the last reference goes, maybe while this thread holds the cache's
    lock (then the release waits for the next get/collect/release)."""
    cache = cache_ref()
    if cache is None:
        return
    cache._dead.append((key, kernel_id))
    if cache._lock.acquire(blocking=False):
        try:
            cache._release_dead()
        except Exception as error:  # noqa: BLE001 - never raise into the collector; the device frees it at the latest
            try:
                warnings.warn(
                    f"releasing a pipeline of a collected kernel failed: {error}", ResourceWarning, stacklevel=2
                )
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass
        finally:
            cache._lock.release()
