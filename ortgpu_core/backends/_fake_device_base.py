"""What every part of a :class:`~ortgpu_core.backends.fake.FakeDevice` shares: its state (usable, lost or
destroyed), its counters, and its objects, with the checks that name a stale handle.

The fake device is built in layers: :class:`_FakeDeviceBase` (here), then ``_FakeExecution``
(:mod:`._fake_execution`: queue writes, reads and submitted commands), and ``FakeDevice`` itself
(:mod:`.fake`: creating and freeing objects, lifetime).  :class:`_FakeDeviceBase` owns the object tables
(``_buffers``, ``_pipelines``, ``_bind_groups``, ``_query_sets``), ``_stats``, ``_lost_reason``, ``_destroyed`` and
``_orphaned``, set in :meth:`_FakeDeviceBase._init_base`.

The device is made of parts its backend shares with all its devices, passed in explicitly rather than reached
through the backend: the :class:`~._fake_handles.HandleTable` (handles are numbered across the backend, and their
records kept there to name stale ones), the :class:`~._fake_oplog.OperationLog`, the
:class:`~._fake_faults.FakeFaults` and the lock (``_lock``, one :class:`DeviceLock` for the backend, its devices,
its handle table and its faults), which guards every field here and which the public methods take.  So the device
modules import only what sits below them, never the backend's module.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

from .._errors import DeviceLostError, ReleasedValueError, ValidationError
from ._device_lock import DeviceLock
from ._fake_faults import FakeFaults
from ._fake_handles import (
    FREED_RECORDS_KEPT,
    HandleKind,
    HandleTable,
    _BindGroup,
    _Buffer,
    _describe,
    _Pipeline,
    _QuerySet,
)
from ._fake_oplog import OperationLog
from .protocol import BUFFER_ALIGNMENT, DeviceLimits


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


def _check_aligned(what: str, value: int) -> None:
    if value < 0 or value % BUFFER_ALIGNMENT:
        raise ValidationError(f"{what} is {value}: it must be a non-negative multiple of {BUFFER_ALIGNMENT}")


class _FakeDeviceBase:
    """The device's state, counters and objects, and the checks on them (see the module's docstring for the
    layers, the shared parts and the lock)."""

    limits: DeviceLimits
    _timestamp_queries: bool  # set by FakeDevice from its spec

    def _init_base(
        self,
        *,
        lock: DeviceLock,
        handles: HandleTable,
        operations: OperationLog,
        faults: FakeFaults,
        ordinal: int,
        name: str,
    ) -> None:
        """Set this layer's fields: the backend's shared parts (``lock`` guards ``handles`` and ``faults``; the
        operation log has a lock of its own), then usable, no objects yet, zero counters."""
        self._lock = lock
        self._handles = handles
        self._operations = operations
        self._faults = faults
        self._ordinal = ordinal
        self._name = name
        # Every field below is guarded by the backend's lock.
        self._buffers: dict[int, _Buffer] = {}
        self._pipelines: dict[int, _Pipeline] = {}
        self._bind_groups: dict[int, _BindGroup] = {}
        self._query_sets: dict[int, _QuerySet] = {}
        # The fake GPU clock's last timestamp (nanoseconds): each timestamp write reads perf_counter_ns, at least
        # 1 ns after the previous one, so the work between two writes is timed as the host ran it (twins included).
        self._last_timestamp_ns = 0
        self._stats = FakeDeviceStats()
        self._lost_reason: str | None = None
        self._destroyed = False
        # The handles destroy() freed: freeing one afterwards is harmless (set by destroy; as large as what was
        # live then, and gone with the device).
        self._orphaned: frozenset[int] = frozenset()
        # Buffers whose zero-fill waits for the next submit (only under ``faults.defer_zero_fill()``, the C3 model).
        self._pending_clears: list[int] = []

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
        return self._handles.new(kind, label, self._ordinal, self._name)

    def _stale(self, handle: object, kind: HandleKind, role: str) -> ValidationError:
        record = self._handles.find(handle) if isinstance(handle, int) else None
        if record is None:
            if isinstance(handle, int) and not isinstance(handle, bool) and 0 < handle < self._handles.next_handle():
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

    def _check_timestamps(self, action: str) -> None:
        if not self._timestamp_queries:
            raise ValidationError(f"{action}: {self._name} does not support timestamp queries")

    def _query_set(self, handle: int, role: str) -> _QuerySet:
        query_set = self._query_sets.get(handle)
        if query_set is None:
            raise self._stale(handle, "query set", role)
        return query_set

    def _free(
        self,
        handle: int,
        kind: HandleKind,
        table: dict[int, _Buffer] | dict[int, _Pipeline] | dict[int, _BindGroup] | dict[int, _QuerySet],
    ) -> None:
        if handle in table:
            del table[handle]
            self._handles.retire(handle, "released")
            return
        if handle in self._orphaned:
            return  # freed by destroy(): releasing it afterwards is harmless, as in WebGPU
        raise self._stale(handle, kind, f"freeing a {kind}")

    def live_handles(self) -> int:
        """How many buffers, pipelines, bind groups and query sets are alive on this device."""
        with self._lock:
            return len(self._buffers) + len(self._pipelines) + len(self._bind_groups) + len(self._query_sets)

    def describe_live_handles(self) -> list[str]:
        """One line per live handle (kind, handle, label): for leak-check failure messages."""
        with self._lock:
            tables: list[tuple[HandleKind, Sequence[int]]] = [
                ("buffer", list(self._buffers)),
                ("pipeline", list(self._pipelines)),
                ("bind group", list(self._bind_groups)),
                ("query set", list(self._query_sets)),
            ]
            return [f"{self._name}: {_describe(h, self._handles.live(h))}" for _, handles in tables for h in handles]

    def _check_range(self, buffer: _Buffer, offset: int, size: int, role: str) -> None:
        _check_aligned(f"{role}: offset", offset)
        _check_aligned(f"{role}: size", size)
        if offset + size > buffer.size:
            raise ValidationError(
                f"{role}: range [{offset}, {offset + size}) is outside buffer {buffer.handle} "
                f"({buffer.label!r}) of {buffer.size} bytes"
            )
