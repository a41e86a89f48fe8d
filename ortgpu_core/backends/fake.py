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
* **Accounting** for tests: :meth:`FakeDevice.live_handles`,
  :meth:`FakeBackend.live_handles`, :attr:`FakeDevice.stats`.  Nothing grows
  with the number of handles ever created: the backend keeps a record of each
  live handle, and of the last :data:`FREED_RECORDS_KEPT` freed ones (to name
  a stale handle); destroyed devices are held only while referenced.

The default backend has one adapter, :data:`DEFAULT_FAKE_DEVICE`: vendor
``0xFA4E``, device ``0x0001``, ``"Fake WebGPU device"``, adapter type
``"CPU"``, backend type ``"Fake"``, features ``{"shader-f16"}`` and
:data:`DEFAULT_FAKE_LIMITS`.

Thread safety: one lock per backend guards every handle table, counter and
fault schedule; twins run under it.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import re
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Final, Literal, Sequence

import numpy as np
import numpy.typing as npt

from .._errors import DeviceLostError, InvalidArgumentError, OutOfMemoryError, ReleasedValueError, ValidationError
from ._device_lock import DeviceLock
from ._commands import CommandList
from .protocol import BUFFER_ALIGNMENT, AdapterInfo, BindingEntry, DeviceLimits, KernelTwin, host_read_target

__all__ = [
    "FAKE_VENDOR_ID",
    "FAKE_DEVICE_ID",
    "DEFAULT_FAKE_LIMITS",
    "DEFAULT_FAKE_DEVICE",
    "fake_limits",
    "FakeDeviceSpec",
    "FakeDeviceStats",
    "InjectedFault",
    "FakeFaults",
    "FakeDevice",
    "FakeBackend",
    "FREED_RECORDS_KEPT",
]

#: How many freed handles the backend still describes by kind and label when one is used again (older stale
#: handles are still rejected, and named as freed, without their kind and label).
FREED_RECORDS_KEPT: Final = 1024

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


#: The adapter a ``FakeBackend()`` offers when no specs are given.
DEFAULT_FAKE_DEVICE: Final = FakeDeviceSpec()


@dataclass
class FakeDeviceStats:
    """Counters of one fake device (``FakeDevice.stats`` returns a copy).

    Only work that took effect is counted: a submit that raised counts nothing.
    """

    submits: int = 0
    dispatches: int = 0  # dispatch commands executed (a twin runs for each non-empty grid)
    copies: int = 0
    clears: int = 0
    writes: int = 0  # write_buffer calls
    reads: int = 0  # read_buffer calls
    bytes_written: int = 0  # by write_buffer
    bytes_read: int = 0  # by read_buffer
    bytes_copied: int = 0  # by copy commands
    buffers_created: int = 0
    live_buffer_bytes: int = 0
    peak_buffer_bytes: int = 0


FaultKind = Literal["out_of_memory_on_allocation", "lose_device_on_submit", "validation_error_on_submit"]


@dataclass(frozen=True)
class InjectedFault:
    """A scheduled fault: it fires on the ``at``-th allocation or submit of the backend (1-based, from its creation)."""

    kind: FaultKind
    at: int
    message: str


class FakeFaults:
    """Fault injection for one :class:`FakeBackend` (``backend.faults``).

    Counts run over every device of the backend.  An allocation is counted when
    a ``create_buffer`` call passes validation; a submit when ``submit`` is
    called on a device that is not lost.  Each fault fires once; ``n`` is
    1-based and counts from the call that schedules it (``n=1``: the next one).
    """

    def __init__(self, lock: DeviceLock) -> None:
        self._lock = lock
        self._scheduled: list[InjectedFault] = []
        self._allocations = 0  # guarded by _lock
        self._submits = 0  # guarded by _lock

    def out_of_memory_on_allocation(self, n: int = 1) -> None:
        """The ``n``-th future buffer allocation raises :class:`OutOfMemoryError` and allocates nothing."""
        with self._lock:
            self._schedule("out_of_memory_on_allocation", self._allocations, n, "injected out-of-memory")

    def lose_device_on_submit(self, n: int = 1, *, reason: str = "injected device loss") -> None:
        """The ``n``-th future submit loses its device: it raises :class:`DeviceLostError`,
        executes nothing, and every later call on that device raises too."""
        with self._lock:
            self._schedule("lose_device_on_submit", self._submits, n, reason)

    def validation_error_on_submit(self, n: int = 1, *, message: str = "injected validation error") -> None:
        """The ``n``-th future submit raises :class:`ValidationError` and executes nothing."""
        with self._lock:
            self._schedule("validation_error_on_submit", self._submits, n, message)

    def clear(self) -> None:
        """Cancel every fault that has not fired."""
        with self._lock:
            self._scheduled.clear()

    @property
    def pending(self) -> tuple[InjectedFault, ...]:
        """The faults that have not fired yet, in scheduling order."""
        with self._lock:
            return tuple(self._scheduled)

    def _schedule(self, kind: FaultKind, count: int, n: int, message: str) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidArgumentError(f"n must be a positive integer (1 = the next one), got {n!r}")
        self._scheduled.append(InjectedFault(kind, count + n, message))

    def _take(self, kinds: tuple[FaultKind, ...], count: int) -> list[InjectedFault]:
        fired = [f for f in self._scheduled if f.kind in kinds and f.at == count]
        if fired:
            self._scheduled = [f for f in self._scheduled if f not in fired]
        return fired

    def _next_allocation(self) -> InjectedFault | None:
        self._allocations += 1
        fired = self._take(("out_of_memory_on_allocation",), self._allocations)
        return fired[0] if fired else None

    def _next_submit(self) -> list[InjectedFault]:
        self._submits += 1
        return self._take(("lose_device_on_submit", "validation_error_on_submit"), self._submits)


# -- what the WGSL declares ---------------------------------------------------

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_BINDING = re.compile(
    r"@(group|binding)\s*\(\s*(\d+)\s*\)\s*@(group|binding)\s*\(\s*(\d+)\s*\)\s*"
    r"var\s*<\s*(uniform|storage)\s*(?:,\s*(read_write|read)\s*)?>"
)
_ENTRY_POINT = re.compile(r"@compute\b(.*?)\bfn\s+([A-Za-z_]\w*)", re.DOTALL)
_WORKGROUP_SIZE = re.compile(r"@workgroup_size\s*\(([^)]*)\)")


@dataclass(frozen=True)
class _DeclaredBinding:
    uniform: bool
    writable: bool


def _declared_bindings(wgsl: str) -> dict[int, _DeclaredBinding]:
    bindings: dict[int, _DeclaredBinding] = {}
    for match in _BINDING.finditer(wgsl):
        numbers = {match.group(1): int(match.group(2)), match.group(3): int(match.group(4))}
        if numbers.get("group") != 0 or "binding" not in numbers:
            continue
        uniform = match.group(5) == "uniform"
        bindings[numbers["binding"]] = _DeclaredBinding(uniform, not uniform and match.group(6) == "read_write")
    return bindings


def _check_entry_point(wgsl: str, entry_point: str, limits: DeviceLimits, label: str) -> None:
    entry_points = {m.group(2): m.group(1) for m in _ENTRY_POINT.finditer(wgsl)}
    if not entry_points:
        return  # nothing the fake can read: trust the twin
    if entry_point not in entry_points:
        raise ValidationError(
            f"pipeline {label!r}: the WGSL has no compute entry point {entry_point!r} "
            f"(it declares {sorted(entry_points)})"
        )
    size = _WORKGROUP_SIZE.search(entry_points[entry_point])
    if size is None:
        return
    parts = [p.strip() for p in size.group(1).split(",") if p.strip()]
    if not all(p.rstrip("iu").isdigit() for p in parts):
        return  # overridable or constant-expression sizes: not checked
    dims = [int(p.rstrip("iu")) for p in parts] + [1] * (3 - len(parts))
    maxima = (limits.max_compute_workgroup_size_x, limits.max_compute_workgroup_size_y, limits.max_compute_workgroup_size_z)
    if any(d > m for d, m in zip(dims, maxima)) or dims[0] * dims[1] * dims[2] > limits.max_compute_invocations_per_workgroup:
        raise ValidationError(
            f"pipeline {label!r}: @workgroup_size{tuple(dims)} exceeds the device limits "
            f"(per dimension {maxima}, {limits.max_compute_invocations_per_workgroup} invocations)"
        )


# -- device objects -----------------------------------------------------------

HandleKind = Literal["buffer", "pipeline", "bind group"]


@dataclass(eq=False)
class _Buffer:
    handle: int
    label: str
    size: int
    uniform: bool
    data: npt.NDArray[np.uint8]


@dataclass(eq=False)
class _Pipeline:
    handle: int
    label: str
    twin: KernelTwin
    declared: dict[int, _DeclaredBinding]  # empty when the WGSL declares nothing the fake can read


@dataclass(frozen=True)
class _BoundRange:
    binding: int
    buffer: int
    offset: int
    size: int


@dataclass(eq=False)
class _BindGroup:
    handle: int
    pipeline: int
    label: str
    ranges: tuple[_BoundRange, ...]  # in binding order
    aliasing: str | None  # why a dispatch with this group is invalid (writable aliasing), if it is


@dataclass
class _HandleRecord:
    """What the backend remembers of a live or recently freed handle, to name stale ones.

    Names its device (not a reference to it), so records of freed handles keep no device alive."""

    kind: HandleKind
    label: str
    device: int  # the device's ordinal
    device_name: str
    state: Literal["live", "released", "orphaned"]  # orphaned: freed by device.destroy()


def _describe(handle: int, record: _HandleRecord) -> str:
    label = f" ({record.label!r})" if record.label else ""
    return f"{record.kind} {handle}{label}"


def _check_aligned(what: str, value: int) -> None:
    if value < 0 or value % BUFFER_ALIGNMENT:
        raise ValidationError(f"{what} is {value}: it must be a non-negative multiple of {BUFFER_ALIGNMENT}")


_Step = tuple[Literal["dispatch"], _Pipeline, _BindGroup, tuple[int, int, int]] | tuple[
    Literal["copy"], _Buffer, int, _Buffer, int, int
] | tuple[Literal["clear"], _Buffer, int, int]


class FakeDevice:
    """An opened fake device and its queue (a :class:`~ortgpu_core.backends.protocol.BackendDevice`).

    Made by :meth:`FakeBackend.open_device`.  Owns every buffer, pipeline and
    bind group created on it until they are freed or the device is destroyed.
    """

    #: No native replay table: the core's replay loop interprets command lists through ``submit``.
    native_table: None = None

    def __init__(self, backend: FakeBackend, ordinal: int, info: AdapterInfo, spec: FakeDeviceSpec) -> None:
        self.info: AdapterInfo = info
        self.limits: DeviceLimits = spec.limits
        self.features: frozenset[str] = spec.features
        self._backend = backend
        self._lock = backend._lock
        self._ordinal = ordinal
        self._name = f"fake device #{ordinal} ({info.name})"
        self._memory_size = spec.memory_size
        # Every field below is guarded by the backend's lock.
        self._buffers: dict[int, _Buffer] = {}
        self._pipelines: dict[int, _Pipeline] = {}
        self._bind_groups: dict[int, _BindGroup] = {}
        self._stats = FakeDeviceStats()
        self._lost_reason: str | None = None
        self._destroyed = False
        # The handles destroy() freed: freeing one afterwards is harmless (set by destroy; as large as what was
        # live then, and gone with the device).
        self._orphaned: frozenset[int] = frozenset()
        self._destroy_callbacks: list[Callable[[], None]] = []
        self._callbacks_lock = threading.Lock()
        self._callbacks_done = False

    def __repr__(self) -> str:
        state = "destroyed" if self._destroyed else "lost" if self._lost_reason is not None else "open"
        return f"<FakeDevice {self._name}, {state}, {self.live_handles()} live handles>"

    # -- state ---------------------------------------------------------------
    @property
    def lost(self) -> bool:
        """Whether the device is lost (or destroyed)."""
        return self._destroyed or self._lost_reason is not None

    @property
    def destroyed(self) -> bool:
        """Whether ``destroy()`` was called."""
        return self._destroyed

    @property
    def lost_reason(self) -> str | None:
        """Why the device was lost, or ``None`` while it is usable."""
        if self._destroyed:
            return "the device was destroyed"
        return self._lost_reason

    @property
    def stats(self) -> FakeDeviceStats:
        """A copy of the device's counters."""
        with self._lock:
            return dataclasses.replace(self._stats)

    def reset_stats(self) -> None:
        """Zero the counters (``live_buffer_bytes`` keeps its value; the peak restarts from it)."""
        with self._lock:
            live = self._stats.live_buffer_bytes
            self._stats = FakeDeviceStats(live_buffer_bytes=live, peak_buffer_bytes=live)

    def lose(self, reason: str = "device lost (injected)") -> None:
        """Lose the device now: every later call except the frees, ``destroy`` and the accessors
        raises :class:`DeviceLostError` carrying ``reason``.  Handles stay counted until freed."""
        with self._lock:
            if self._lost_reason is None:
                self._lost_reason = reason

    def _check_usable(self) -> None:
        if self._destroyed:
            raise ReleasedValueError(f"{self._name} was destroyed (closed with its Env); open a new device")
        if self._lost_reason is not None:
            raise DeviceLostError(f"{self._name} is lost: {self._lost_reason}; every value on it is gone")

    # -- handles ---------------------------------------------------------------
    def _new_handle(self, kind: HandleKind, label: str) -> int:
        self._backend._last_handle += 1
        handle = self._backend._last_handle
        self._backend._records[handle] = _HandleRecord(kind, label, self._ordinal, self._name, "live")
        return handle

    def _stale(self, handle: object, kind: HandleKind, role: str) -> ValidationError:
        backend = self._backend
        record = None
        if isinstance(handle, int):
            record = backend._records.get(handle) or backend._freed.get(handle)
        if record is None:
            if isinstance(handle, int) and not isinstance(handle, bool) and 0 < handle < backend._next_handle():
                return ValidationError(
                    f"{role}: handle {handle} was already freed (a stale handle; freed more than "
                    f"{FREED_RECORDS_KEPT} frees ago, so its kind and label are no longer known)"
                )
            return ValidationError(f"{role}: {handle!r} is not a handle of the fake backend (expected a {kind})")
        described = _describe(handle, record)  # type: ignore[arg-type]
        if record.kind != kind:
            return ValidationError(f"{role}: {described} is a {record.kind}, not a {kind}")
        if record.device != self._ordinal:
            return ValidationError(f"{role}: {described} belongs to {record.device_name}, not to {self._name}")
        if record.state == "orphaned":
            return ValidationError(f"{role}: {described} was freed when its device was destroyed")
        return ValidationError(f"{role}: {described} was already freed (a stale handle)")

    def _buffer(self, handle: int, role: str) -> _Buffer:
        buffer = self._buffers.get(handle)
        if buffer is None:
            raise self._stale(handle, "buffer", role)
        return buffer

    def _pipeline(self, handle: int, role: str) -> _Pipeline:
        pipeline = self._pipelines.get(handle)
        if pipeline is None:
            raise self._stale(handle, "pipeline", role)
        return pipeline

    def _bind_group(self, handle: int, role: str) -> _BindGroup:
        bind_group = self._bind_groups.get(handle)
        if bind_group is None:
            raise self._stale(handle, "bind group", role)
        return bind_group

    def _free(self, handle: int, kind: HandleKind, table: dict[int, _Buffer] | dict[int, _Pipeline] | dict[int, _BindGroup]) -> None:
        if handle in table:
            del table[handle]
            self._backend._retire(handle, "released")
            return
        if handle in self._orphaned:
            return  # freed by destroy(): releasing it afterwards is harmless, as in WebGPU
        raise self._stale(handle, kind, f"freeing a {kind}")

    def live_handles(self) -> int:
        """How many buffers, pipelines and bind groups are alive on this device."""
        with self._lock:
            return len(self._buffers) + len(self._pipelines) + len(self._bind_groups)

    def describe_live_handles(self) -> list[str]:
        """One line per live handle (kind, handle, label): for leak-check failure messages."""
        with self._lock:
            tables: list[tuple[HandleKind, Sequence[int]]] = [
                ("buffer", list(self._buffers)),
                ("pipeline", list(self._pipelines)),
                ("bind group", list(self._bind_groups)),
            ]
            return [
                f"{self._name}: {_describe(h, self._backend._records[h])}" for _, handles in tables for h in handles
            ]

    # -- buffers ---------------------------------------------------------------
    def create_buffer(self, size: int, *, uniform: bool = False, label: str = "") -> int:
        """A zero-filled buffer of ``size`` bytes (a multiple of 4).

        Storage buffers are STORAGE | COPY_SRC | COPY_DST, uniform buffers
        UNIFORM | COPY_DST.  Raises :class:`ValidationError` when ``size`` is
        unaligned or over ``limits.max_buffer_size``, :class:`OutOfMemoryError`
        when the device memory (``FakeDeviceSpec.memory_size``) is exhausted or
        a fault was injected.
        """
        with self._lock:
            self._check_usable()
            _check_aligned(f"buffer {label!r}: size", size)
            if size > self.limits.max_buffer_size:
                raise ValidationError(
                    f"buffer {label!r}: size {size} exceeds the device's max_buffer_size "
                    f"{self.limits.max_buffer_size}; split the tensor or use a device with larger limits"
                )
            fault = self._backend.faults._next_allocation()
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
            try:
                data = np.zeros(size, dtype=np.uint8)
            except MemoryError as error:
                raise OutOfMemoryError(f"{self._name}: host memory exhausted allocating {size} bytes") from error
            handle = self._new_handle("buffer", label)
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
        with self._lock:
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

    def _check_range(self, buffer: _Buffer, offset: int, size: int, role: str) -> None:
        _check_aligned(f"{role}: offset", offset)
        _check_aligned(f"{role}: size", size)
        if offset + size > buffer.size:
            raise ValidationError(
                f"{role}: range [{offset}, {offset + size}) is outside buffer {buffer.handle} "
                f"({buffer.label!r}) of {buffer.size} bytes"
            )

    def write_buffer(self, buffer: int, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` at ``offset`` (a queue write: it applies after all work submitted so far)."""
        with self._lock:
            self._check_usable()
            target = self._buffer(buffer, "write_buffer")
            view = memoryview(data)
            raw = view.cast("B") if view.c_contiguous else view.tobytes()  # bytes in C order, like bytes(view)
            source = np.frombuffer(raw, dtype=np.uint8)
            self._check_range(target, offset, source.size, f"write_buffer into buffer {buffer}")
            target.data[offset : offset + source.size] = source
            self._stats.writes += 1
            self._stats.bytes_written += source.size

    def read_buffer(self, buffer: int, offset: int, size: int) -> bytes:
        """The bytes of ``[offset, offset + size)`` after all submitted work.

        The buffer needs COPY_SRC usage: uniform buffers cannot be read back.
        """
        with self._lock:
            return self._readable(buffer, offset, size, size, "read_buffer").tobytes()

    def read_buffer_into(self, buffer: int, offset: int, out: Any) -> None:
        """:meth:`read_buffer` of ``len(out)`` bytes (any size, rounded up to 4 for the range check) into ``out``."""
        view, padded = host_read_target(out, "read_buffer_into")
        with self._lock:
            source = self._readable(buffer, offset, view.nbytes, padded, "read_buffer_into")
            np.frombuffer(view, np.uint8)[:] = source

    def submit_and_read(self, commands: CommandList, reads: Sequence[tuple[int, int, Any]]) -> None:
        """:meth:`submit`, then :meth:`read_buffer_into` each ``(buffer, offset, out)``; every read is checked
        before anything is submitted."""
        with self._lock:
            views = []
            for index, (buffer, offset, out) in enumerate(reads):
                action = f"submit_and_read: read {index}"
                view, padded = host_read_target(out, action)
                self._readable(buffer, offset, view.nbytes, padded, action, count=False)
                views.append(view)
            self.submit(commands)
            for (buffer, offset, _), view in zip(reads, views):
                self.read_buffer_into(buffer, offset, view)

    def _readable(
        self, buffer: int, offset: int, size: int, checked: int, action: str, *, count: bool = True
    ) -> npt.NDArray[np.uint8]:
        """The ``size`` bytes at ``offset`` of a buffer that may be read, after checking ``checked`` bytes' range."""
        self._check_usable()
        source = self._buffer(buffer, action)
        if source.uniform:
            raise ValidationError(
                f"{action}: buffer {buffer} ({source.label!r}) is a uniform buffer (UNIFORM | COPY_DST), "
                "which cannot be read back"
            )
        self._check_range(source, offset, checked, f"{action} from buffer {buffer}")
        if count:
            self._stats.reads += 1
            self._stats.bytes_read += checked
        return source.data[offset : offset + size]

    # -- kernels ---------------------------------------------------------------
    def create_compute_pipeline(
        self, wgsl: str, *, entry_point: str = "main", twin: KernelTwin | None = None, label: str = ""
    ) -> int:
        """A pipeline that runs ``twin`` in place of ``wgsl`` (which is read, never compiled).

        Raises :class:`ValidationError` when there is no twin, when the WGSL
        lacks ``entry_point``, or when its literal ``@workgroup_size`` exceeds
        the device limits.
        """
        with self._lock:
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
        with self._lock:
            if not self._lock.defer_if_nested(lambda: self.release_pipeline(pipeline)):
                self._free(pipeline, "pipeline", self._pipelines)

    def create_bind_group(self, pipeline: int, entries: Sequence[BindingEntry]) -> int:
        """A bind group for group 0 of ``pipeline``.

        Each entry binds a range of a live buffer of this device; uniform
        buffers bind as uniform bindings, storage buffers as storage bindings.
        When the pipeline's WGSL declares its group-0 bindings, the entries
        must match them one to one (number and address space).
        """
        with self._lock:
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
        with self._lock:
            if not self._lock.defer_if_nested(lambda: self.release_bind_group(bind_group)):
                self._free(bind_group, "bind group", self._bind_groups)

    # -- submission ------------------------------------------------------------
    def validate_commands(self, commands: CommandList) -> None:
        """Raise :class:`ValidationError` if ``submit(commands)`` would reject a record; execute nothing.

        The same checks ``submit`` makes (handles live, ranges, usages, grid
        limits, layouts, aliasing), without counting a submit for fault injection.
        """
        with self._lock:
            self._check_usable()
            for index, record in enumerate(commands.records()):
                self._validate(index, record)

    def submit(self, commands: CommandList) -> None:
        """Validate every record of ``commands``, then execute them in order.

        Atomic for validation: if any record is invalid, :class:`ValidationError`
        is raised and nothing executes.  (An exception raised by a twin
        propagates as is, after the records before it have executed.)
        """
        with self._lock:
            self._check_usable()
            fired = self._backend.faults._next_submit()
            for fault in fired:  # a loss wins over a validation error injected for the same submit
                if fault.kind == "lose_device_on_submit":
                    self.lose(fault.message)
                    self._check_usable()
            if fired:
                fault = fired[0]
                raise ValidationError(f"{self._name}: {fault.message} (submit #{fault.at} of the backend)")
            steps = [self._validate(index, record) for index, record in enumerate(commands.records())]
            for step in steps:
                self._execute(step)
            self._stats.submits += 1

    def _validate(self, index: int, record: tuple[object, ...]) -> _Step:
        role = f"command {index} ({record[0]})"
        if record[0] == "dispatch":
            _, pipeline_handle, bind_group_handle, grid = record
            assert isinstance(pipeline_handle, int) and isinstance(bind_group_handle, int) and isinstance(grid, tuple)
            pipeline = self._pipeline(pipeline_handle, role)
            bind_group = self._bind_group(bind_group_handle, role)
            if bind_group.pipeline != pipeline_handle:
                raise ValidationError(
                    f"{role}: bind group {bind_group_handle} was created for pipeline {bind_group.pipeline}, "
                    f"not for pipeline {pipeline_handle} ({pipeline.label!r}); automatic layouts are not shared"
                )
            for bound in bind_group.ranges:
                if bound.buffer not in self._buffers:
                    raise ValidationError(
                        f"{role}: bind group {bind_group_handle} ({bind_group.label!r}) uses buffer {bound.buffer} "
                        f"at binding {bound.binding}, which was destroyed"
                    )
            if bind_group.aliasing is not None:
                raise ValidationError(f"{role}: bind group {bind_group_handle}: {bind_group.aliasing}")
            limit = self.limits.max_compute_workgroups_per_dimension
            if any(d > limit for d in grid):
                raise ValidationError(
                    f"{role}: grid {grid} exceeds max_compute_workgroups_per_dimension {limit}; split the dispatch"
                )
            return ("dispatch", pipeline, bind_group, (int(grid[0]), int(grid[1]), int(grid[2])))
        if record[0] == "copy":
            _, source_handle, source_offset, destination_handle, destination_offset, size = record
            assert isinstance(source_handle, int) and isinstance(destination_handle, int)
            assert isinstance(source_offset, int) and isinstance(destination_offset, int) and isinstance(size, int)
            source = self._buffer(source_handle, role + " source")
            destination = self._buffer(destination_handle, role + " destination")
            if source is destination:
                raise ValidationError(f"{role}: source and destination are both buffer {source_handle}")
            if source.uniform:
                raise ValidationError(f"{role}: source buffer {source_handle} is a uniform buffer (no COPY_SRC usage)")
            self._check_range(source, source_offset, size, role + " source")
            self._check_range(destination, destination_offset, size, role + " destination")
            return ("copy", source, source_offset, destination, destination_offset, size)
        _, buffer_handle, offset, size = record
        assert isinstance(buffer_handle, int) and isinstance(offset, int) and isinstance(size, int)
        buffer = self._buffer(buffer_handle, role)
        self._check_range(buffer, offset, size, role)
        return ("clear", buffer, offset, size)

    def _execute(self, step: _Step) -> None:
        stats = self._stats
        if step[0] == "dispatch":
            _, pipeline, bind_group, grid = step
            stats.dispatches += 1
            if grid[0] * grid[1] * grid[2] == 0:
                return  # an empty dispatch runs no invocation
            views = [
                self._buffers[r.buffer].data[r.offset : r.offset + r.size] for r in bind_group.ranges
            ]
            pipeline.twin(views, grid)
        elif step[0] == "copy":
            _, source, source_offset, destination, destination_offset, size = step
            destination.data[destination_offset : destination_offset + size] = source.data[
                source_offset : source_offset + size
            ]
            stats.copies += 1
            stats.bytes_copied += size
        else:
            _, buffer, offset, size = step
            buffer.data[offset : offset + size] = 0
            stats.clears += 1

    def wait_idle(self) -> None:
        """Nothing to wait for (work executes at submit); raises :class:`DeviceLostError` if lost."""
        with self._lock:
            self._check_usable()

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
        with self._lock:
            if self._destroyed:
                return
            self._destroyed = True
            orphaned: list[int] = []
            for table in (self._buffers, self._pipelines, self._bind_groups):
                orphaned.extend(table)
                table.clear()
            self._orphaned = frozenset(orphaned)
            for handle in orphaned:
                self._backend._retire(handle, "orphaned")
            self._stats.live_buffer_bytes = 0
            self._backend._device_destroyed(self)
        with self._callbacks_lock:
            callbacks, self._destroy_callbacks = self._destroy_callbacks, []
            self._callbacks_done = True
        for callback in callbacks:
            callback()


def _writable_aliasing(ranges: Sequence[_BoundRange], declared: dict[int, _DeclaredBinding]) -> str | None:
    # A read_write storage binding is an exclusive usage of its buffer within a
    # dispatch.  wgpu-native tracks usages per *buffer*, so it rejects two
    # bindings of one buffer even on disjoint ranges (the WebGPU spec only
    # forbids overlapping ones); the fake follows wgpu-native, which is what
    # ortgpu runs on.  Only checked when the WGSL says which bindings are writable.
    for i, first in enumerate(ranges):
        for second in ranges[i + 1 :]:
            writable = any(b in declared and declared[b].writable for b in (first.binding, second.binding))
            if first.buffer == second.buffer and writable:
                return (
                    f"bindings {first.binding} and {second.binding} both use buffer {first.buffer} and one is "
                    "read_write storage, an exclusive usage within a dispatch (wgpu-native rejects it even for "
                    "disjoint ranges); use a separate buffer"
                )
    return None


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
        self._lock = DeviceLock()  # one for the backend, its devices and its faults
        self._last_handle = 0  # handles count up from 1 and are never reused (0 stays the null handle)
        # Guarded by _lock: the record of every live handle, and of the last FREED_RECORDS_KEPT freed ones.
        self._records: dict[int, _HandleRecord] = {}
        self._freed: collections.OrderedDict[int, _HandleRecord] = collections.OrderedDict()
        # Guarded by _lock: open devices by ordinal, and destroyed ones while something else references them.
        self._ordinals = itertools.count()
        self._devices: dict[int, FakeDevice] = {}
        self._destroyed_devices: weakref.WeakValueDictionary[int, FakeDevice] = weakref.WeakValueDictionary()
        self.faults: FakeFaults = FakeFaults(self._lock)

    def __repr__(self) -> str:
        opened = len(self._devices) + len(self._destroyed_devices)
        return f"<FakeBackend {len(self._specs)} adapter(s), {opened} device(s) opened>"

    def _next_handle(self) -> int:
        """The handle the next object will get (every smaller positive handle was given out)."""
        return self._last_handle + 1

    def _retire(self, handle: int, state: Literal["released", "orphaned"]) -> None:
        """Move a freed handle's record to the bounded list of recently freed ones (under _lock)."""
        record = self._records.pop(handle)
        record.state = state
        self._freed[handle] = record
        while len(self._freed) > FREED_RECORDS_KEPT:
            self._freed.popitem(last=False)

    def _device_destroyed(self, device: FakeDevice) -> None:
        """Hold a destroyed device only while something else references it (under _lock)."""
        if self._devices.pop(device._ordinal, None) is device:
            self._destroyed_devices[device._ordinal] = device

    @property
    def handle_records(self) -> int:
        """How many handle records the backend keeps: one per live handle, plus up to
        :data:`FREED_RECORDS_KEPT` freed ones."""
        with self._lock:
            return len(self._records) + len(self._freed)

    def enumerate_adapters(self) -> list[AdapterInfo]:
        """One :class:`AdapterInfo` per spec, ``index`` being its position."""
        return [self._info(index, spec) for index, spec in enumerate(self._specs)]

    def default_adapter_index(self) -> int:
        """The adapter a caller without a preference should open: the first."""
        return 0

    def open_device(self, adapter_index: int) -> FakeDevice:
        """Open a new device on adapter ``adapter_index``."""
        if isinstance(adapter_index, bool) or not isinstance(adapter_index, int) or not 0 <= adapter_index < len(self._specs):
            # ValidationError, as the wgpu backend raises.
            raise ValidationError(
                f"adapter index {adapter_index!r} is out of range: the fake backend has {len(self._specs)} adapter(s)"
            )
        spec = self._specs[adapter_index]
        with self._lock:
            ordinal = next(self._ordinals)
            device = FakeDevice(self, ordinal, self._info(adapter_index, spec), spec)
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
