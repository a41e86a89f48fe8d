"""The fake device backend: WebGPU's rules in numpy, deterministic, with fault injection.

The fake backend lets users (and ortgpu's own tests) run everything above the
backend protocol without a GPU, and makes the mistakes that matter for safety
visible:

* **Ordering.**  ``write_buffer`` applies at once (the fake executes submitted
  work at submit time, so "in queue order" is "now"); a :class:`CommandList`
  executes only at ``submit``; ``read_buffer`` returns the state after every
  submitted command.  An upload recorded but not submitted before a read shows
  up as a wrong value, as it would on a GPU.
* **Validation** mirroring WebGPU: sizes and offsets multiples of 4, ranges
  inside buffers, copy source != destination, buffer usages (uniform buffers
  are ``UNIFORM | COPY_DST`` only), bind-group offsets aligned, binding sizes,
  dispatch grids and buffer sizes within the device limits, writable bindings
  that alias another binding of the same dispatch, and handles of the right
  kind, alive, on this device.  Handles come from a counter and are never
  reused, so a stale handle is always detected and named.  Errors are raised
  in the caller's frame as :class:`ValidationError`; an invalid command list
  raises at ``submit`` and executes nothing.
* **Kernels** are never compiled: a pipeline runs its numpy twin
  (:data:`~ortgpu_core.backends.protocol.KernelTwin`).  The WGSL is still read
  for what it declares (group-0 bindings and their address space / access
  mode, compute entry points, literal workgroup sizes) so a bind group that
  would not match the shader is rejected; WGSL the fake cannot parse (or
  ``""``) skips those checks.
* **Faults** on demand: out-of-memory on the n-th allocation, device loss on
  the n-th submit or at once, a validation error on the n-th submit
  (:class:`FakeFaults`, :meth:`FakeDevice.lose`).
* **Operations by thread** for concurrency tests: ``backend.operations.enable()`` records every device
  operation (kind, thread, start, end) in a bounded ring, ``backend.operation_log()`` returns it, and
  ``backend.operations.set_latency(submit=0.002)`` makes operations of a kind take time, outside the lock
  (:mod:`._fake_oplog`).
* **Accounting** for tests: :meth:`FakeDevice.live_handles`,
  :meth:`FakeBackend.live_handles`, :attr:`FakeDevice.stats`.  Nothing grows
  with the number of handles ever created: the backend keeps a record of each
  live handle, and of the last :data:`FREED_RECORDS_KEPT` freed ones (to name
  a stale handle); destroyed devices are held only while referenced.

The default backend has one adapter, :data:`DEFAULT_FAKE_DEVICE`: vendor
``0xFA4E``, device ``0x0001``, ``"Fake WebGPU device"``, adapter type
``"CPU"``, backend type ``"Fake"``, features ``{"shader-f16"}`` and
:data:`DEFAULT_FAKE_LIMITS`.

Timestamp queries (``create_query_set``, ``create_query_resolve_buffer``, and the command list's timestamp and
resolve records) are supported unless the spec says ``timestamp_queries=False`` (the profiler then falls back to
host timing).  The fake GPU's clock is the host's ``perf_counter_ns``, read when a timestamp record executes (at
least 1 ns after the previous one), so the time between two timestamps is the time the records between them took
to execute on the host; the period is 1 ns per tick.  The spec's ``features`` do not list ``timestamp-query``:
``timestamp_queries`` alone decides.

Thread safety: one lock per backend guards every handle table, counter and
fault schedule; twins run under it.

The backend's parts, by job: :mod:`._fake_handles` (the objects' records and the handle table, at the bottom),
:mod:`._fake_device_base` (a device's state, counters and objects, and the checks that name a stale handle),
:mod:`._fake_execution` (queue writes, reads, and submitted commands run with numpy), :mod:`._fake_wgsl` (what
the WGSL declares, and the checks against it), :mod:`._fake_faults` (fault injection) and :mod:`._fake_oplog`
(the operation log).  A device is given the backend's shared parts (lock, handle table, operation log, faults)
when it is opened, so none of those modules imports this one.  This module keeps
the specs, :class:`FakeDevice` (creating and freeing objects, lifetime) and :class:`FakeBackend`.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Final, Sequence

import numpy as np
import numpy.typing as npt

from .._errors import InvalidArgumentError, OutOfMemoryError, ValidationError
from ._commands import CommandList
from ._device_lock import DeviceLock
from ._fake_device_base import FakeDeviceStats, _check_aligned
from ._fake_execution import _FakeExecution
from ._fake_faults import FakeFaults, InjectedFault
from ._fake_handles import FREED_RECORDS_KEPT, HandleTable, _BindGroup, _BoundRange, _Buffer, _Pipeline, _QuerySet
from ._fake_oplog import FakeOperation, OperationLog
from ._fake_wgsl import _COMMENTS, _check_entry_point, _declared_bindings, _writable_aliasing
from .protocol import (
    MAX_QUERIES,
    AdapterInfo,
    BindingEntry,
    DeviceLimits,
    ForeignKind,
    KernelTwin,
    host_read_target,
)

__all__ = [
    "FAKE_VENDOR_ID",
    "FAKE_DEVICE_ID",
    "DEFAULT_FAKE_LIMITS",
    "DEFAULT_FAKE_DEVICE",
    "fake_adapters",
    "fake_limits",
    "FakeDeviceSpec",
    "FakeDeviceStats",
    "InjectedFault",
    "FakeFaults",
    "FakeDevice",
    "FakeBackend",
    "FakeOperation",
    "OperationLog",
    "FREED_RECORDS_KEPT",
]

#: PCI-style vendor id of fake adapters (no real vendor uses it).
FAKE_VENDOR_ID: Final = 0xFA4E
#: Device id of the default fake adapter.
FAKE_DEVICE_ID: Final = 0x0001

#: Limits of the default fake device: buffer sizes like a software (lavapipe)
#: adapter, everything else at WebGPU's defaults, so a kernel that runs on the
#: fake fits any adapter.
DEFAULT_FAKE_LIMITS: Final = DeviceLimits(
    max_buffer_size=1 << 30,  # 1 GiB
    max_storage_buffer_binding_size=1 << 28,  # 256 MiB
    max_uniform_buffer_binding_size=1 << 16,  # 64 KiB
    max_storage_buffers_per_shader_stage=8,
    max_compute_workgroups_per_dimension=65535,
    max_compute_invocations_per_workgroup=256,
    max_compute_workgroup_size_x=256,
    max_compute_workgroup_size_y=256,
    max_compute_workgroup_size_z=64,
    max_compute_workgroup_storage_size=16384,
    min_storage_buffer_offset_alignment=256,
    min_uniform_buffer_offset_alignment=256,
)


class _FakeAsyncRead:
    """A read started by :meth:`FakeDevice.read_async`: its bytes (read at submit), how often it was asked about,
    and whether it is over."""

    __slots__ = ("data", "asked", "closed")

    def __init__(self, data: npt.NDArray[np.uint8]) -> None:
        self.data = data
        self.asked = 0
        self.closed = False


def fake_limits(**overrides: int) -> DeviceLimits:
    """:data:`DEFAULT_FAKE_LIMITS` with the named limits replaced.

    ``fake_limits(max_buffer_size=1 << 20)``; an unknown name raises ``TypeError``.
    """
    return dataclasses.replace(DEFAULT_FAKE_LIMITS, **overrides)


@dataclass(frozen=True)
class FakeDeviceSpec:
    """One fake adapter: what it reports, its limits and features, and its memory size.

    ``memory_size`` is the device memory in bytes: an allocation that would take
    the bytes of live buffers over it raises :class:`OutOfMemoryError` (``None``:
    only ``limits.max_buffer_size`` bounds allocations).
    """

    vendor_id: int = FAKE_VENDOR_ID
    device_id: int = FAKE_DEVICE_ID
    name: str = "Fake WebGPU device"
    driver: str = "ortgpu fake backend (numpy)"
    adapter_type: str = "CPU"
    backend_type: str = "Fake"
    features: frozenset[str] = frozenset({"shader-f16"})
    limits: DeviceLimits = DEFAULT_FAKE_LIMITS
    memory_size: int | None = None
    #: Whether the device supports timestamp queries (``FakeDevice.timestamps_supported``).
    timestamp_queries: bool = True


#: The adapter a ``FakeBackend()`` offers when no specs are given.
DEFAULT_FAKE_DEVICE: Final = FakeDeviceSpec()


def fake_adapters(count: int) -> tuple[FakeDeviceSpec, ...]:
    """``count`` fake adapters with one vendor id and device ids 1, 2, ... (``FakeBackend(fake_adapters(2))``: an
    Env with two devices that share their vendor, as the Vulkan and OpenGL adapters of one GPU do)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InvalidArgumentError(f"count must be an int >= 1, not {count!r}")
    return tuple(
        dataclasses.replace(DEFAULT_FAKE_DEVICE, device_id=FAKE_DEVICE_ID + i, name=f"Fake WebGPU device {i}")
        for i in range(count)
    )


class FakeDevice(_FakeExecution):
    """An opened fake device and its queue (a :class:`~ortgpu_core.backends.protocol.BackendDevice`).

    Made by :meth:`FakeBackend.open_device`.  Owns every buffer, pipeline and
    bind group created on it until they are freed or the device is destroyed.

    Built in layers: ``_FakeDeviceBase`` (state, counters, objects), ``_FakeExecution`` (writes, reads,
    submit), and this class (creating and freeing objects, lifetime); and from the parts its backend shares with
    all its devices, passed in: the lock, the handle table, the operation log and the faults, plus
    ``on_destroyed``, called under the lock when the device is destroyed (the backend stops counting it as open).
    Every field is guarded by the backend's lock, except the destroy callbacks', which have a lock of their own
    (``_callbacks_lock``).
    """

    #: No native replay table: the core's replay loop interprets command lists through ``submit``.
    native_table: None = None
    #: Dispatches run the kernels' numpy twins (see ``BackendDevice.runs_numpy_twins``).
    runs_numpy_twins: bool = True

    def __init__(
        self,
        *,
        lock: DeviceLock,
        handles: HandleTable,
        operations: OperationLog,
        faults: FakeFaults,
        on_destroyed: Callable[[FakeDevice], None],
        ordinal: int,
        info: AdapterInfo,
        spec: FakeDeviceSpec,
    ) -> None:
        self.info: AdapterInfo = info
        self.limits: DeviceLimits = spec.limits
        self.features: frozenset[str] = spec.features
        self._init_base(
            lock=lock,
            handles=handles,
            operations=operations,
            faults=faults,
            ordinal=ordinal,
            name=f"fake device #{ordinal} ({info.name})",
        )
        self._on_destroyed = on_destroyed
        self._memory_size = spec.memory_size
        self._timestamp_queries = spec.timestamp_queries
        self._destroy_callbacks: list[Callable[[], None]] = []
        self._callbacks_lock = threading.Lock()
        self._callbacks_done = False

    def __repr__(self) -> str:
        state = "destroyed" if self._destroyed else "lost" if self._lost_reason is not None else "open"
        return f"<FakeDevice {self._name}, {state}, {self.live_handles()} live handles>"

    # -- buffers ---------------------------------------------------------------
    def create_buffer(self, size: int, *, uniform: bool = False, label: str = "") -> int:
        """A zero-filled buffer of ``size`` bytes (a multiple of 4).

        Storage buffers are STORAGE | COPY_SRC | COPY_DST, uniform buffers
        UNIFORM | COPY_DST.  Raises :class:`ValidationError` when ``size`` is
        unaligned or over ``limits.max_buffer_size``, :class:`OutOfMemoryError`
        when the device memory (``FakeDeviceSpec.memory_size``) is exhausted or
        a fault was injected.
        """
        with self._operations.operation("allocate", self._ordinal), self._lock:
            self._check_usable()
            _check_aligned(f"buffer {label!r}: size", size)
            if size > self.limits.max_buffer_size:
                raise ValidationError(
                    f"buffer {label!r}: size {size} exceeds the device's max_buffer_size "
                    f"{self.limits.max_buffer_size}; split the tensor or use a device with larger limits"
                )
            fault = self._faults._next_allocation()
            if fault is not None:
                raise OutOfMemoryError(
                    f"{self._name}: cannot allocate {size} bytes for buffer {label!r} ({fault.message}, "
                    f"allocation #{fault.at} of the backend)"
                )
            live = self._stats.live_buffer_bytes
            if self._memory_size is not None and live + size > self._memory_size:
                raise OutOfMemoryError(
                    f"{self._name}: cannot allocate {size} bytes for buffer {label!r}: {live} of "
                    f"{self._memory_size} bytes are in use; free buffers or cached blocks and retry"
                )
            deferred = self._faults._defer_zero_fill
            try:
                data = np.full(size, 0xCD, dtype=np.uint8) if deferred else np.zeros(size, dtype=np.uint8)
            except MemoryError as error:
                raise OutOfMemoryError(f"{self._name}: host memory exhausted allocating {size} bytes") from error
            handle = self._new_handle("buffer", label)
            if deferred:
                self._pending_clears.append(handle)  # the C3 model: zero-filled by the next submit, not now
            self._buffers[handle] = _Buffer(handle, label, size, uniform, data)
            stats = self._stats
            stats.buffers_created += 1
            stats.live_buffer_bytes += size
            stats.peak_buffer_bytes = max(stats.peak_buffer_bytes, stats.live_buffer_bytes)
            return handle

    def destroy_buffer(self, buffer: int) -> None:
        """Free the buffer now.  Bind groups that use it stay alive but can no longer be dispatched.

        Freeing works on a lost device (releasing is always valid in WebGPU),
        and freeing a handle that ``destroy()`` already freed does nothing, so
        cleanup paths need no special case; freeing a handle twice otherwise
        raises :class:`ValidationError`.
        """
        with self._operations.operation("release", self._ordinal), self._lock:
            if self._lock.defer_if_nested(lambda: self.destroy_buffer(buffer)):
                return  # a finalizer run inside another call of this device: freed when that call returns
            freed = self._buffers.get(buffer)
            self._free(buffer, "buffer", self._buffers)
            if freed is not None:
                self._stats.live_buffer_bytes -= freed.size

    def buffer_size(self, buffer: int) -> int:
        """The size in bytes of a live buffer."""
        with self._lock:
            return self._buffer(buffer, "buffer_size").size

    # -- timestamp queries ----------------------------------------------------------
    @property
    def timestamps_supported(self) -> bool:
        """Whether command lists may write timestamps here (``FakeDeviceSpec.timestamp_queries``)."""
        return self._timestamp_queries

    #: Nanoseconds per tick of resolved timestamps (the fake's clock counts nanoseconds).
    timestamp_period_ns: float = 1.0

    def create_query_set(self, count: int, *, label: str = "") -> int:
        """A timestamp query set of ``count`` queries (1..4096)."""
        with self._operations.operation("allocate", self._ordinal), self._lock:
            self._check_usable()
            action = f"query set {label!r}"
            self._check_timestamps(action)
            if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_QUERIES:
                raise ValidationError(f"{action}: count must be an int in 1..{MAX_QUERIES}, not {count!r}")
            handle = self._new_handle("query set", label)
            self._query_sets[handle] = _QuerySet(handle, label, np.zeros(count, dtype=np.uint64))
            return handle

    def release_query_set(self, query_set: int) -> None:
        """Free the query set (as :meth:`destroy_buffer`: allowed when lost, harmless after ``destroy()``)."""
        with self._operations.operation("release", self._ordinal), self._lock:
            if not self._lock.defer_if_nested(lambda: self.release_query_set(query_set)):
                self._free(query_set, "query set", self._query_sets)

    def create_query_resolve_buffer(self, size: int, *, label: str = "") -> int:
        """A zero-filled buffer usable as a resolve destination and read back (QUERY_RESOLVE | COPY_SRC); a
        buffer handle (``destroy_buffer`` frees it)."""
        self._check_timestamps(f"query-resolve buffer {label!r}")
        handle = self.create_buffer(size, label=label)
        with self._lock:
            self._buffer(handle, "create_query_resolve_buffer").query_resolve = True
        return handle

    # -- reads nobody waits for (BackendDevice's optional read_async) ---------------------
    def read_async(self, commands: CommandList, buffer: int, offset: int, size: int) -> _FakeAsyncRead:
        """Submit ``commands`` and read ``size`` bytes of ``buffer`` at ``offset`` after them; the fake executes at
        once and keeps the bytes, but models a read still in flight: :meth:`read_async_done` says False the first
        time it is asked about it (True after, or once the device is lost or destroyed)."""
        with self._operations.operation("submit", self._ordinal), self._lock:
            action = f"read_async from buffer {buffer}"
            self._readable(buffer, offset, size, size, action, count=False)  # checked before anything is submitted
            if size == 0:
                raise ValidationError(f"{action}: size must be > 0")
            self.submit(commands)
            return _FakeAsyncRead(self._readable(buffer, offset, size, size, action).copy())

    def read_async_done(self, read: _FakeAsyncRead) -> bool:
        """Whether :meth:`read_async_finish` of ``read`` would not wait (see :meth:`read_async`)."""
        read.asked += 1
        return read.asked > 1 or self.lost

    def read_async_finish(self, read: _FakeAsyncRead, out: Any) -> None:
        """Copy ``read``'s bytes into ``out`` (at most the read's size); raises as a read would on a lost or
        destroyed device.  The read is over either way."""
        if read.closed:
            raise ValidationError("read_async_finish: this read was already finished or cancelled")
        view, _ = host_read_target(out, "read_async_finish")
        if view.nbytes > read.data.size:
            raise ValidationError(f"read_async_finish: out holds {view.nbytes} bytes, more than {read.data.size}")
        read.closed = True
        with self._operations.operation("read", self._ordinal), self._lock:
            self._check_usable()
            np.frombuffer(view, np.uint8)[:] = read.data[: view.nbytes]

    def read_async_cancel(self, read: _FakeAsyncRead) -> None:
        """Drop ``read`` unfinished (harmless when lost or destroyed, or already over)."""
        read.closed = True

    # -- kernels ---------------------------------------------------------------
    def create_compute_pipeline(
        self, wgsl: str, *, entry_point: str = "main", twin: KernelTwin | None = None, label: str = ""
    ) -> int:
        """A pipeline that runs ``twin`` in place of ``wgsl`` (which is read, never compiled).

        Raises :class:`ValidationError` when there is no twin, when the WGSL
        lacks ``entry_point``, or when its literal ``@workgroup_size`` exceeds
        the device limits.
        """
        with self._operations.operation("pipeline", self._ordinal), self._lock:
            self._check_usable()
            if twin is None:
                raise ValidationError(
                    f"pipeline {label!r}: the kernel must provide a numpy twin for the fake backend "
                    "(pass twin=...; the fake never compiles WGSL)"
                )
            if not callable(twin):
                raise InvalidArgumentError(f"pipeline {label!r}: twin must be callable, got {type(twin).__name__}")
            source = _COMMENTS.sub("", wgsl)
            _check_entry_point(source, entry_point, self.limits, label)
            handle = self._new_handle("pipeline", label)
            self._pipelines[handle] = _Pipeline(handle, label, twin, _declared_bindings(source))
            return handle

    def release_pipeline(self, pipeline: int) -> None:
        """Free the pipeline (its bind groups stay valid objects, but dispatching needs a live pipeline)."""
        with self._operations.operation("release", self._ordinal), self._lock:
            if not self._lock.defer_if_nested(lambda: self.release_pipeline(pipeline)):
                self._free(pipeline, "pipeline", self._pipelines)

    def create_bind_group(self, pipeline: int, entries: Sequence[BindingEntry]) -> int:
        """A bind group for group 0 of ``pipeline``.

        Each entry binds a range of a live buffer of this device; uniform
        buffers bind as uniform bindings, storage buffers as storage bindings.
        When the pipeline's WGSL declares its group-0 bindings, the entries
        must match them one to one (number and address space).
        """
        with self._operations.operation("bind_group", self._ordinal), self._lock:
            self._check_usable()
            owner = self._pipeline(pipeline, "create_bind_group")
            role = f"bind group for pipeline {pipeline} ({owner.label!r})"
            ranges: list[_BoundRange] = []
            storage_count = 0
            for entry in entries:
                where = f"{role}, binding {entry.binding}"
                if entry.binding < 0 or any(r.binding == entry.binding for r in ranges):
                    raise ValidationError(f"{where}: binding numbers must be distinct and non-negative")
                buffer = self._buffer(entry.buffer, where)
                if buffer.uniform:
                    alignment = self.limits.min_uniform_buffer_offset_alignment
                    limit, limit_name = self.limits.max_uniform_buffer_binding_size, "max_uniform_buffer_binding_size"
                else:
                    storage_count += 1
                    alignment = self.limits.min_storage_buffer_offset_alignment
                    limit, limit_name = self.limits.max_storage_buffer_binding_size, "max_storage_buffer_binding_size"
                if entry.offset < 0 or entry.offset % alignment:
                    raise ValidationError(f"{where}: offset {entry.offset} is not a multiple of {alignment}")
                if entry.size <= 0:
                    raise ValidationError(f"{where}: size {entry.size} must be positive")
                self._check_range(buffer, entry.offset, entry.size, where)
                if entry.size > limit:
                    raise ValidationError(f"{where}: size {entry.size} exceeds the device's {limit_name} {limit}")
                declared = owner.declared.get(entry.binding)
                if owner.declared and declared is None:
                    raise ValidationError(f"{where}: the shader declares no @group(0) @binding({entry.binding})")
                if declared is not None and declared.uniform != buffer.uniform:
                    wanted = "uniform" if declared.uniform else "storage"
                    raise ValidationError(
                        f"{where}: the shader declares a {wanted} binding but buffer {buffer.handle} "
                        f"({buffer.label!r}) has no {wanted.upper()} usage"
                    )
                ranges.append(_BoundRange(entry.binding, entry.buffer, entry.offset, entry.size))
            missing = sorted(set(owner.declared) - {r.binding for r in ranges})
            if missing:
                raise ValidationError(f"{role}: no entry for the shader's binding(s) {missing}")
            if storage_count > self.limits.max_storage_buffers_per_shader_stage:
                raise ValidationError(
                    f"{role}: {storage_count} storage bindings exceed the device's "
                    f"max_storage_buffers_per_shader_stage {self.limits.max_storage_buffers_per_shader_stage}"
                )
            ranges.sort(key=lambda r: r.binding)
            handle = self._new_handle("bind group", owner.label)
            self._bind_groups[handle] = _BindGroup(
                handle, pipeline, owner.label, tuple(ranges), _writable_aliasing(ranges, owner.declared)
            )
            return handle

    def release_bind_group(self, bind_group: int) -> None:
        """Free the bind group."""
        with self._operations.operation("release", self._ordinal), self._lock:
            if not self._lock.defer_if_nested(lambda: self.release_bind_group(bind_group)):
                self._free(bind_group, "bind group", self._bind_groups)

    # -- lifetime ----------------------------------------------------------------
    def add_destroy_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once, right after the device is destroyed (at once if it already is): for state
        that layers above keep per device, such as the pipeline cache, to go with it."""
        # A lock of their own, never held while calling out: registering never waits for the backend's lock.
        with self._callbacks_lock:
            if not self._callbacks_done:
                self._destroy_callbacks.append(callback)
                return
        callback()

    def destroy(self) -> None:
        """Free everything the device still owns and make it unusable, then call the destroy callbacks (outside
        the backend's lock).  Idempotent; works when lost."""
        with self._operations.operation("destroy", self._ordinal), self._lock:
            if self._destroyed:
                return
            self._destroyed = True
            orphaned: list[int] = []
            for table in (self._buffers, self._pipelines, self._bind_groups, self._query_sets):
                orphaned.extend(table)
                table.clear()
            self._orphaned = frozenset(orphaned)
            for handle in orphaned:
                self._handles.retire(handle, "orphaned")
            self._stats.live_buffer_bytes = 0
            self._on_destroyed(self)
        with self._callbacks_lock:
            callbacks, self._destroy_callbacks = self._destroy_callbacks, []
            self._callbacks_done = True
        for callback in callbacks:
            callback()


class FakeBackend:
    """A source of fake adapters and devices (a :class:`~ortgpu_core.backends.protocol.Backend`).

    ``FakeBackend()`` offers one adapter, :data:`DEFAULT_FAKE_DEVICE`;
    ``FakeBackend(devices=[FakeDeviceSpec(...), ...])`` offers one adapter per
    spec, in order.  Opening an adapter twice gives two distinct devices.
    Handles are unique across all devices of the backend and never reused.
    """

    name: str = "fake"

    def __init__(self, devices: Sequence[FakeDeviceSpec] | None = None) -> None:
        specs = tuple(devices) if devices is not None else (DEFAULT_FAKE_DEVICE,)
        if not specs:
            raise InvalidArgumentError("a FakeBackend needs at least one FakeDeviceSpec")
        for spec in specs:
            if not isinstance(spec, FakeDeviceSpec):
                raise InvalidArgumentError(f"devices must be FakeDeviceSpec, got {type(spec).__name__}")
        self._specs = specs
        self._lock = DeviceLock()  # one for the backend, its devices, its handle table and its faults
        # Guarded by _lock: every handle's number, and the record of every live one and of the last
        # FREED_RECORDS_KEPT freed ones, shared by the devices (handles are unique across the backend).
        self._handles = HandleTable()
        # Guarded by _lock: open devices by ordinal, and destroyed ones while something else references them.
        self._ordinals = itertools.count()
        self._devices: dict[int, FakeDevice] = {}
        self._destroyed_devices: weakref.WeakValueDictionary[int, FakeDevice] = weakref.WeakValueDictionary()
        self.faults: FakeFaults = FakeFaults(self._lock)
        #: The record of device operations by thread, and the latency each kind is given (off by default).
        self.operations: OperationLog = OperationLog()

    def __repr__(self) -> str:
        opened = len(self._devices) + len(self._destroyed_devices)
        return f"<FakeBackend {len(self._specs)} adapter(s), {opened} device(s) opened>"

    def _device_destroyed(self, device: FakeDevice) -> None:
        """Hold a destroyed device only while something else references it (under _lock)."""
        if self._devices.pop(device._ordinal, None) is device:
            self._destroyed_devices[device._ordinal] = device

    def operation_log(self) -> list[FakeOperation]:
        """The device operations recorded since ``operations.enable()`` (at most its capacity, oldest first):
        kind, device, thread, start and end.  Empty while recording is off (the default)."""
        return self.operations.records()

    @property
    def handle_records(self) -> int:
        """How many handle records the backend keeps: one per live handle, plus up to
        :data:`FREED_RECORDS_KEPT` freed ones."""
        with self._lock:
            return len(self._handles)

    def foreign_kinds(self) -> tuple[ForeignKind, ...]:
        """Tensor kinds of other runtimes this backend brings (registered in the core's route table when an Env
        is created on it): the fake "other GPU" (:mod:`._fake_foreign`), for routing tests."""
        from ._fake_foreign import FAKE_OTHER_GPU_KIND

        return (FAKE_OTHER_GPU_KIND,)

    def enumerate_adapters(self) -> list[AdapterInfo]:
        """One :class:`AdapterInfo` per spec, ``index`` being its position."""
        return [self._info(index, spec) for index, spec in enumerate(self._specs)]

    def default_adapter_index(self) -> int:
        """The adapter a caller without a preference should open: the first."""
        return 0

    def open_device(self, adapter_index: int) -> FakeDevice:
        """Open a new device on adapter ``adapter_index``."""
        if (
            isinstance(adapter_index, bool)
            or not isinstance(adapter_index, int)
            or not 0 <= adapter_index < len(self._specs)
        ):
            # ValidationError, as the wgpu backend raises.
            raise ValidationError(
                f"adapter index {adapter_index!r} is out of range: the fake backend has {len(self._specs)} adapter(s)"
            )
        spec = self._specs[adapter_index]
        with self._lock:
            ordinal = next(self._ordinals)
            device = FakeDevice(
                lock=self._lock,
                handles=self._handles,
                operations=self.operations,
                faults=self.faults,
                on_destroyed=self._device_destroyed,
                ordinal=ordinal,
                info=self._info(adapter_index, spec),
                spec=spec,
            )
            self._devices[ordinal] = device
            return device

    @property
    def devices(self) -> tuple[FakeDevice, ...]:
        """Every device opened so far, in opening order: the open ones, and the destroyed ones that are still
        referenced elsewhere (the backend does not keep destroyed devices alive)."""
        with self._lock:
            opened = dict(self._destroyed_devices.items())
            opened.update(self._devices)
            return tuple(opened[ordinal] for ordinal in sorted(opened))

    def live_handles(self) -> int:
        """Live buffers, pipelines and bind groups over every device this backend opened."""
        with self._lock:
            return sum(device.live_handles() for device in self._devices.values())

    def describe_live_handles(self) -> list[str]:
        """One line per live handle over every device: for leak-check failure messages."""
        with self._lock:
            return [line for device in self._devices.values() for line in device.describe_live_handles()]

    def close(self) -> None:
        """Destroy every device this backend opened.  Idempotent; the backend can still open new devices."""
        with self._lock:
            devices = list(self._devices.values())
        for device in devices:
            device.destroy()

    @staticmethod
    def _info(index: int, spec: FakeDeviceSpec) -> AdapterInfo:
        return AdapterInfo(
            index=index,
            vendor_id=spec.vendor_id,
            device_id=spec.device_id,
            name=spec.name,
            driver=spec.driver,
            backend_type=spec.backend_type,
            adapter_type=spec.adapter_type,
        )
