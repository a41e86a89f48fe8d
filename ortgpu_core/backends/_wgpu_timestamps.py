"""GPU timestamp queries on a wgpu device: query sets, query-resolve buffers, and the checks on timestamp and
resolve records before they reach wgpu-native.

A :class:`~ortgpu_core.backends._commands.CommandList` records ``("timestamp", query_set, index)`` (encoded as
``wgpuComputePassEncoderWriteTimestamp`` inside the open compute pass where the device has wgpu-native's
``timestamp-query-inside-passes``, else as ``wgpuCommandEncoderWriteTimestamp`` on the encoder after ending the
pass: ``timestamp-query-inside-encoders``) and ``("resolve", query_set, first, count, destination, offset)``
(``wgpuCommandEncoderResolveQuerySet``: ``count`` uint64 values into a buffer made by
:meth:`_Timestamps.create_query_resolve_buffer`).  The resolved values are in the GPU's ticks:
:attr:`_Timestamps.timestamp_period_ns` (``wgpuQueueGetTimestampPeriod``, nanoseconds per tick; 1.0 on lavapipe)
converts them.  A device supports this (:attr:`_Timestamps.timestamps_supported`) when it has both
``timestamp-query`` and ``timestamp-query-inside-encoders`` (requested at device creation whenever the adapter
has them); adapters with only ``timestamp-query`` (pass-level ``timestampWrites``) are not used: the profiler
falls back to host timing there.

wgpu-native aborts the process on some invalid query use, so every record is checked here first: the query set
is a live query set of this device, indices are below its count, the destination is a live query-resolve buffer,
the offset is a multiple of 256 and the values fit.  A bad record raises ``ValidationError`` and nothing is
submitted.

Ownership: :class:`_Timestamps` is a layer of ``WgpuDevice`` (after ``_ReadAheads``; ``_DeviceBase``'s docstring
describes the layers).  Query sets are handles of kind ``"query_set"`` in the base's handle table (counted by
``live_handles``, released with the device); this layer owns ``_resolve_buffers`` (the buffers made with
QUERY_RESOLVE usage), ``_timestamp_period``, and the reads started by :meth:`_Timestamps.read_async` that are not
finished (``_async_staging``: the staging buffer each source buffer's last such read used; ``_async_cancelled``: the
tokens of cancelled reads whose map callback may still come), read and changed under the device's lock.

**Reads that nobody waits for** (:meth:`_Timestamps.read_async`: the profiler's ring of timestamps): the commands
(the resolves) and a copy of the range into a staging buffer are one submission, and the staging buffer's mapping
is requested, as ``submit_and_read`` does, but the call returns at once with an :class:`_AsyncRead`.  Its map
callback fires in a later poll or submit, whoever makes it (:meth:`read_async_done` applies what the callbacks
recorded and says whether it came, without polling or waiting); :meth:`read_async_finish` waits for it if it has not
(the waits of ``_Readback``, outside the lock), copies the range out and gives the staging buffer back;
:meth:`read_async_cancel` frees the staging buffer of a read that will not be finished (its mapping may still be
pending: the buffer is never reused).  The staging buffer is held meanwhile, so the pool has one more buffer while
such a read is in flight.
"""

from __future__ import annotations

from typing import Any

from .._errors import ValidationError
from ._commands import CommandList
from ._wgpu_device_base import _Handle, _serialized
from ._wgpu_ffi import _string_view
from ._wgpu_read_ahead import _ReadAheads
from ._wgpu_requests import _Staging
from .protocol import MAX_QUERIES, QUERY_RESOLVE_ALIGNMENT, host_read_target

# At most this many source buffers' staging preferences and cancelled reads' tokens are remembered (then forgotten
# all at once: a preference only saves re-encoding, and a forgotten token only leaves one stale map result).
_ASYNC_MEMORY = 256


class _AsyncRead:
    """A read started by :meth:`_Timestamps.read_async`: its staging buffer, map request, size, and whether it was
    finished or cancelled (``closed``)."""

    __slots__ = ("staging", "token", "size", "action", "closed")

    def __init__(self, staging: _Staging, token: int, size: int, action: str) -> None:
        self.staging = staging
        self.token = token
        self.size = size
        self.action = action
        self.closed = False


class _Timestamps(_ReadAheads):
    """Query sets, query-resolve buffers and the checks on timestamp/resolve records (see the module docstring)."""

    features: frozenset[str]  # set by WgpuDevice once the device is open

    def _init_timestamps(self) -> None:
        """Set this layer's fields: no resolve buffers; the period is read once the queue exists."""
        self._resolve_buffers: set[int] = set()
        self._timestamp_period = 1.0
        self._async_staging: dict[int, int] = {}  # source buffer -> address of its last async read's staging buffer
        self._async_cancelled: set[int] = set()  # tokens of cancelled async reads (their map result may still come)

    def _read_timestamp_period(self) -> None:
        # float wgpuQueueGetTimestampPeriod(WGPUQueue queue)
        period = float(self._lib.wgpuQueueGetTimestampPeriod(self._queue))
        self._timestamp_period = period if period > 0 else 1.0

    @property
    def timestamps_supported(self) -> bool:
        """Whether command lists on this device may write timestamps (``timestamp-query`` and wgpu-native's
        ``timestamp-query-inside-encoders`` are both enabled)."""
        return "timestamp-query" in self.features and "timestamp-query-inside-encoders" in self.features

    @property
    def timestamp_period_ns(self) -> float:
        """Nanoseconds per tick of the resolved timestamp values."""
        return self._timestamp_period

    def _check_timestamps(self, action: str) -> None:
        if not self.timestamps_supported:
            raise ValidationError(
                f"{action}: {self.info.name} does not support timestamp queries inside command encoders "
                f"(features: {', '.join(sorted(self.features)) or 'none'})"
            )

    @_serialized
    def create_query_set(self, count: int, *, label: str = "") -> int:
        """A timestamp query set of ``count`` queries (1..4096)."""
        self._check_open()
        action = f"create_query_set({count}, label={label!r})"
        self._check_timestamps(action)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_QUERIES:
            raise ValidationError(f"{action}: count must be an int in 1..{MAX_QUERIES}")
        ffi, lib = self._ffi, self._lib
        keep: list[object] = []
        descriptor = ffi.new("WGPUQuerySetDescriptor *")
        descriptor.label = _string_view(label, keep)
        descriptor.type = lib.WGPUQueryType_Timestamp
        descriptor.count = count
        # WGPUQuerySet wgpuDeviceCreateQuerySet(WGPUDevice device, WGPUQuerySetDescriptor const * descriptor)
        pointer = self._created(lib.wgpuDeviceCreateQuerySet(self._device, descriptor), lib.wgpuQuerySetRelease, action)
        if pointer == ffi.NULL:
            raise ValidationError(f"{action}: wgpu-native returned no query set")
        handle = self._new_handle(pointer)
        self._handles[handle] = _Handle("query_set", pointer, size=count, label=label)
        return handle

    @_serialized
    def release_query_set(self, query_set: int) -> None:
        """Free the query set (always allowed, as ``destroy_buffer``)."""
        if self._lock.defer_if_nested(lambda: self.release_query_set(query_set)) or self._device is None:
            return
        record = self._lookup(query_set, "query_set", "release_query_set")
        del self._handles[query_set]
        self._forget_validation(query_set)
        self._free_query_set(record.pointer)

    def _free_query_set(self, pointer: object) -> None:
        # void wgpuQuerySetRelease(WGPUQuerySet querySet).  Not wgpuQuerySetDestroy first: in wgpu-native 29 it
        # already drops the query set from the registry, and the release after it panics (aborting the process).
        self._lib.wgpuQuerySetRelease(pointer)

    @_serialized
    def create_query_resolve_buffer(self, size: int, *, label: str = "") -> int:
        """A zero-filled buffer of ``size`` bytes usable as a resolve destination and read back
        (QUERY_RESOLVE | COPY_SRC); a buffer handle (``destroy_buffer`` frees it)."""
        self._check_open()
        action = f"create_query_resolve_buffer({size}, label={label!r})"
        self._check_timestamps(action)
        self._check_aligned(action, size=size)
        if size == 0 or size > self.limits.max_buffer_size:
            raise ValidationError(f"{action}: size must be in 1..{self.limits.max_buffer_size} bytes")
        lib = self._lib
        pointer = self._native_buffer(
            size, lib.WGPUBufferUsage_QueryResolve | lib.WGPUBufferUsage_CopySrc, label, action
        )
        handle = self._new_handle(pointer)
        self._handles[handle] = _Handle("buffer", pointer, size=size, label=label)
        self._resolve_buffers.add(handle)
        return handle

    # -- reads nobody waits for (see the module docstring) ----------------------------------
    def read_async(self, commands: CommandList, buffer: int, offset: int, size: int) -> _AsyncRead:
        """Submit ``commands`` and a copy of ``size`` bytes of ``buffer`` at ``offset`` into a staging buffer after
        them (one submission), and request the staging buffer's mapping; returns at once (nothing waits)."""
        action = f"read_async ({len(commands)} commands, {size} bytes of {buffer:#x} at {offset})"
        with self._lock:
            self._check_open()
            self._check_aligned(action, offset=offset, size=size)
            if size == 0:
                raise ValidationError(f"{action}: size must be > 0")
            self._checked_read(buffer, offset, size, action)
            self._validate_for_submit(commands)
            requests = self._requests
            if self._async_cancelled:  # cancelled reads whose map result came after all: forget it
                for token in [t for t in self._async_cancelled if t in requests.map_results]:
                    requests.map_results.pop(token, None)
                    self._async_cancelled.discard(token)
                if len(self._async_cancelled) > _ASYNC_MEMORY:
                    self._async_cancelled.clear()
            staging = self._take_staging(size, self._async_staging.get(buffer, 0))
            job = None
            try:
                tail = CommandList()
                tail.add_copy(buffer, offset, staging.address, 0, size)
                self._note_writes(commands)
                job, _ = self._encode_and_submit(commands, tail, action)
                token = self._request_map(staging, size, action)
            except BaseException:
                self._cancel_job(job)
                self._give_back_staging(staging)
                raise
            requests.owners.pop(token, None)  # nobody waits for it now (read_async_finish registers its waiter)
            if len(self._async_staging) > _ASYNC_MEMORY:
                self._async_staging.clear()
            self._async_staging[buffer] = staging.address
        self._encode_ahead(job)
        return _AsyncRead(staging, token, size, action)

    def read_async_done(self, read: _AsyncRead) -> bool:
        """Whether :meth:`read_async_finish` of ``read`` would not wait: its mapping completed (as the callbacks
        fired so far report; nothing is polled), or the device is lost or destroyed (finishing raises then)."""
        requests = self._requests
        requests.drain()
        return read.token in requests.map_results or self._device is None or self._sink.lost is not None

    def read_async_finish(self, read: _AsyncRead, out: Any) -> None:
        """Wait (outside the lock) for ``read``'s mapping if it has not completed, then copy the range out into
        ``out`` (a writable C-contiguous buffer of at most the read's size) and give the staging buffer back.
        Raises what the read's wait raises (``DeviceLostError``, ``ReleasedValueError``, ``DeviceError``); the
        read is over either way."""
        if read.closed:
            raise ValidationError(f"{read.action}: this read was already finished or cancelled")
        view, _ = host_read_target(out, read.action)
        if view.nbytes > read.size:
            raise ValidationError(f"{read.action}: out holds {view.nbytes} bytes, more than the read's {read.size}")
        read.closed = True
        requests, token = self._requests, read.token
        requests.own(token)  # this thread waits for it (if it completed already, the next lines drop this again)
        requests.drain()
        try:
            target = self._ffi.from_buffer(view, require_writable=True)
            self._finish_read(read.staging, token, read.size, read.action, [(self._address_of(target), view.nbytes, 0)])
        finally:
            requests.owners.pop(token, None)

    def read_async_cancel(self, read: _AsyncRead) -> None:
        """Drop ``read`` unfinished: its staging buffer is freed (never reused: its mapping may still be pending).
        Harmless on a lost or destroyed device, and for a read already finished or cancelled."""
        with self._lock:
            if read.closed or self._lock.defer_if_nested(lambda: self.read_async_cancel(read)):
                return  # (inside another call of this device, from a finalizer: done when that call returns)
            read.closed = True
            requests = self._requests
            requests.owners.pop(read.token, None)
            if requests.map_results.pop(read.token, None) is None:
                self._async_cancelled.add(read.token)
            if self._device is not None and read.staging.address in self._staging_all:
                self._free_staging(read.staging)

    # -- checks -------------------------------------------------------------------------
    def validate_commands(self, commands: CommandList) -> None:
        """The base checks, plus those of timestamp and resolve records (see the module docstring)."""
        if commands.query_count == 0:
            super().validate_commands(commands)
            return
        for index, record in enumerate(commands.records()):
            where = f"submit, command {index} ({record[0]})"
            if record[0] == "timestamp":
                self._check_timestamps(where)
                query_set = self._lookup(record[1], "query_set", where)
                if record[2] >= query_set.size:
                    raise ValidationError(
                        f"{where}: query index {record[2]} is out of range (the query set holds {query_set.size})"
                    )
            elif record[0] == "resolve":
                _, handle, first, count, destination, offset = record
                self._check_timestamps(where)
                query_set = self._lookup(handle, "query_set", where)
                if count == 0 or first + count > query_set.size:
                    raise ValidationError(
                        f"{where}: queries {first}..{first + count - 1} are not within the query set's {query_set.size}"
                    )
                target = self._lookup(destination, "buffer", where)
                if destination not in self._resolve_buffers:
                    raise ValidationError(
                        f"{where}: buffer {destination:#x} was not made by create_query_resolve_buffer "
                        "(no QUERY_RESOLVE usage)"
                    )
                if offset % QUERY_RESOLVE_ALIGNMENT:
                    raise ValidationError(f"{where}: offset {offset} is not a multiple of {QUERY_RESOLVE_ALIGNMENT}")
                if offset + 8 * count > target.size:
                    raise ValidationError(
                        f"{where}: {count} values at offset {offset} run past the buffer's {target.size} bytes"
                    )
        super().validate_commands(commands.without_queries())

    def _remember_validation(self, commands: CommandList) -> None:
        super()._remember_validation(commands)
        if commands.query_count == 0:
            return
        list_id = id(commands)
        for record in commands.records():
            if record[0] == "resolve":
                self._validated_by_handle.setdefault(record[4], set()).add(list_id)
