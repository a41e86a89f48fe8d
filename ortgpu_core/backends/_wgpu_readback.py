"""Reading wgpu buffers back to the host, and waiting for the device: staging buffers, mapping, polling.

A read copies its range into a staging buffer (MAP_READ | COPY_DST, from the pool), maps it, and copies
out of the mapping (a large read in chunks, :mod:`._wgpu_chunked_reads`); ``submit_and_read`` appends those copies
to the submission itself (a tail the encode-ahead cache keeps with the list): a run and its reads cost one
submission and one wait.

**Waiting never holds the device's lock.** A read (``read_buffer``, ``read_buffer_into``: ``to_numpy``'s) is four
steps: under the lock, keeping the GIL, the checks and the staging buffer; then, *without* the lock, one C call (the
GIL released once) that encodes and submits the copy and requests the mapping, and another that waits for it
(:mod:`._unlocked_calls`); then, under the lock again, the copy out of the mapping and the unmap.
``submit_and_read``'s copies ride in its submission: it submits and requests the map (a captured graph's command
buffer encoded ahead in one C call after the lock, anything else under it), then waits the same way. Other threads
submit, upload and read meanwhile: K threads each driving a session overlap their host work with the GPU's instead of
queueing behind one another's waits, and no thread gives the GIL away while it holds the device's lock for a native
call of any length.

The waits: one thread at a time polls wgpu-native (the *poll lock*, a :class:`._unlocked_calls.NativeLock`), without
blocking for up to ``spin_wait_us``, then still without blocking but sleeping between polls for ``nap_poll_s``
(:data:`NAP_POLL_S`), then blocking; the callbacks fire inside its polls (or inside another thread's submit) whoever's
requests they complete. A read's wait (:meth:`_Readback._wait_map`) is a C loop without the GIL: its map callback sets
the read's own :class:`._unlocked_calls.MapWait`; while another thread polls it spins (yielding its core), then naps.
``wait_idle`` and the profiling ring's reads wait in Python (:meth:`_Readback._wait_until`): their work-done and map
callbacks are C functions (:class:`._device_calls.Completions`) that queue ``(token, status, message)`` and set the
flag the spinning poller watches; waiters apply the queue (:meth:`_Requests.drain`: each request's status recorded by
token, and that request's waiter woken, an event per thread), while the other waiters sleep (releasing the GIL) until
their own request is complete or the polling thread leaves and hands the polling to one of them (a C wait that ends
drains the queue and hands over too; one poller at a time: see :mod:`._unlocked_calls`). A blocking poll in
wgpu-native 29 holds its fence lock until the GPU is done, so a submission from another thread waits for it: that is
why a wait polls without blocking first, spinning on GPU adapters (their waits for small work end within the spin; CPU
adapters, lavapipe, do not spin: it would take a core from the driver), then sleeping between polls, and blocks only
after ``nap_poll_s``.

Errors: what a submission, a map request or a copy-out reports is raised to the thread that made it (wgpu-native
reports it inside that thread's call: the device's error sink). A wait raises only ``DeviceLostError`` (the device was
lost: every caller should see it), ``ReleasedValueError`` (the device was destroyed while it waited) and
``DeviceError`` when its request failed or never completed. The buffer a read copies from is kept until the read ends,
whoever releases it meanwhile (``_Handle.busy``); the device's destroy closes the gate of the unlocked calls and waits
for those inside before it frees anything.

Staging buffers come from the device's pool (:mod:`._wgpu_staging_pool`); a read gives its buffer back after the
copy-out, and ``read_buffer_mapped`` hands it over mapped instead (:mod:`._wgpu_mapped_reads`).

Ownership: :class:`_Readback` is a layer of ``WgpuDevice`` (after ``_StagingPool`` and ``_EncodeAhead``, through
which it submits; ``_DeviceBase``'s docstring describes the layers). It owns ``spin_wait_us``, the callbacks and their descriptors and tokens (read and changed under the device's lock), and
:class:`_Requests`, the callbacks' record of completed requests, the poll lock and the waiters' events
(:mod:`._wgpu_requests`; written by callbacks in whichever thread completes a request, and by waiters; plain dict and
set operations, atomic under the GIL). ``_destroy_readback`` (called by the device's destroy, under the device's lock)
waits for a poll in progress before the device pointer is released.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from .._errors import DeviceError, InvalidArgumentError, ReleasedValueError, ValidationError
from ._commands import CommandList
from ._device_calls import (
    MAP_CALLBACK,
    WORK_DONE_CALLBACK,
    copy_out,
    map_read,
    request_work_done,
    spin_poll,
)
from ._unlocked_calls import (
    CLOSING,
    DONE,
    NOT_SUBMITTED,
    WAIT_IDLE,
    MapWait,
    UnlockedCalls,
)
from ._wgpu_chunked_reads import CHUNKED_READ_MIN, chunk_sizes, read_in_chunks
from ._wgpu_device_base import _Handle
from ._wgpu_ffi import _address, _enum_suffix
from ._wgpu_requests import _Requests, _Staging
from ._wgpu_staging_pool import _StagingPool
from .protocol import BUFFER_ALIGNMENT, AdapterInfo, host_read_target, mapped_read_range

# A wait makes at most this many blocking polls before giving up on its request.
_MAP_POLL_ATTEMPTS = 10_000
# A waiter that is not polling re-checks at least this often (seconds), whatever it was woken for.
_WAITER_RECHECK_S = 0.002
# Default spin before a blocking wait, on GPU adapters (0 on CPU adapters: there it would take a core from the
# driver's threads); it makes a few small dispatches' submit + wait_idle faster (`python -m bench --overhead`).
DEFAULT_SPIN_WAIT_US = 2000.0
# After the spin, a wait's poller keeps polling without blocking, sleeping 20 us to 200 us between polls, for this
# long (seconds) before it blocks in the driver: a blocking poll holds wgpu-native 29's fence lock until the GPU has
# finished everything submitted before it, so every other thread's submission waits behind it and the GPU runs dry.
# A request that never completes (a device lost without its callback) is found by the blocking polls after this.
NAP_POLL_S = 1.0


# Map requests given up on (their read raised before the callback fired): their callback may still write into them,
# so they are kept for the life of the process (a few bytes each, only after errors).
_ABANDONED_WAITS: list[MapWait] = []


class _Readback(_StagingPool):
    """Staging buffers, reads and waits of a wgpu device (see the module's docstring)."""

    def _init_readback(self, info: AdapterInfo, spin_wait_us: float | None) -> None:
        """Set this layer's fields: no staging buffers yet, the spin before blocking (the backend's, or the
        default for ``info``'s adapter type), and the map and work-done callbacks, which write into ``_requests``."""
        ffi, lib = self._ffi, self._lib
        self._init_staging_pool()
        spin = spin_wait_us
        if spin is None:
            spin = 0.0 if info.adapter_type == "CPU" else DEFAULT_SPIN_WAIT_US
        self.spin_wait_us = float(spin)
        self.nap_poll_s = NAP_POLL_S
        self._requests = _Requests(int(lib.WGPUQueueWorkDoneStatus_Success))
        self._map_success = int(lib.WGPUMapAsyncStatus_Success)
        # The map and work-done callbacks are C functions (:class:`._device_calls.Completions`): they take no GIL,
        # so a thread inside a wgpu-native poll or submit, holding wgpu-native's own locks, never waits for Python
        self._tokens = 0
        self._device_poll_address = _address(ffi.addressof(lib, "wgpuDevicePoll"))
        # The native calls made from C (:mod:`._device_calls`), by name.
        self._native_calls = {
            name: _address(ffi.addressof(lib, name))
            for name in (
                "wgpuBufferMapAsync",
                "wgpuBufferGetConstMappedRange",
                "wgpuBufferGetMappedRange",
                "wgpuBufferUnmap",
                "wgpuQueueOnSubmittedWorkDone",
            )
        }

    def _open_unlocked_calls(self) -> None:
        """(Once the device and its native table exist.)  The native calls made outside the device's lock: a read's
        copy, map request and wait, and the submit of a command buffer encoded ahead (:mod:`._unlocked_calls`)."""
        lib = self._lib
        self._unlocked = UnlockedCalls(
            self._native_table,
            self._requests.poll_lock,
            _address(self._device),
            self._native_calls["wgpuBufferMapAsync"],
            self._device_poll_address,
            self._queue_write_address,
            int(lib.WGPUMapMode_Read),
            int(lib.WGPUCallbackMode_AllowProcessEvents),
            self._sink.reports.lost_address,
        )
        self._lock.gate = self._unlocked  # the lock and the submissions made outside it exclude each other

    @property
    def blocking_polls(self) -> int:
        """Blocking polls the device's waits made so far: each held every other thread's submission until the GPU
        had finished all work submitted before it (a wait makes one only after its spin and its ``nap_poll_s``)."""
        unlocked = getattr(self, "_unlocked", None)
        return 0 if unlocked is None else int(unlocked.blocking_polls)

    def set_nap_poll(self, seconds: float) -> None:
        """How long a wait's poller keeps polling without blocking after its spin, sleeping between polls
        (:data:`NAP_POLL_S` by default; 0: it blocks in the driver right after the spin).
        For the bench's A/B and tests."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < float("inf"):
            raise InvalidArgumentError(f"set_nap_poll takes a finite number of seconds >= 0, not {seconds!r}")
        self.nap_poll_s = float(seconds)

    def _close_unlocked_calls(self) -> None:
        """(Under the lock, first thing in the device's destroy.)  Refuse new unlocked native calls and wait for
        those in progress: after this, nothing outside the lock uses the device's pointers or staging buffers."""
        unlocked = getattr(self, "_unlocked", None)
        if unlocked is not None:
            unlocked.close()

    def _destroy_readback(self) -> bool:
        """The device is being destroyed (under its lock): stop the waiters, wait for a poll in progress, free the
        staging buffers but those still held by a view (their views release them).  True when some are."""
        requests = self._requests
        requests.closing = True
        with requests.poll_lock:  # a poll in progress uses the device pointer: let it return first
            held = self._free_staging_pool()
            sentinel, self._sentinel = self._sentinel, None  # _DeviceBase._check_not_lost's buffer
            self._sentinel_address = 0
            if sentinel is not None:
                self._free_buffer(sentinel)
        requests.wake_all()
        return held

    # -- reads -----------------------------------------------------------------------------
    def read_buffer(self, buffer: int, offset: int, size: int) -> bytes:
        """Wait for submitted work, then copy ``size`` bytes from ``offset`` out (through a staging buffer)."""
        action = f"read_buffer({buffer:#x}, offset={offset}, size={size})"
        self._check_aligned(action, offset=offset, size=size)
        out = bytearray(size)
        self._read_into(buffer, offset, out, action)
        return bytes(out)

    def read_buffer_into(self, buffer: int, offset: int, out: Any) -> None:
        """Like :meth:`read_buffer`, into ``out`` (a writable C-contiguous buffer of any size; the device-side copy
        covers it rounded up to 4 bytes), straight from the mapped staging buffers."""
        self._read_into(buffer, offset, out, f"read_buffer_into({buffer:#x}, offset={offset})")

    def read_buffer_mapped(self, buffer: int, offset: int, size: int) -> Any:
        """Wait for submitted work, then return ``size`` bytes at ``offset`` as a writable buffer object that is the
        staging buffer they were copied into, mapped: no host copy (:mod:`._wgpu_mapped_reads`)."""
        action = f"read_buffer_mapped({buffer:#x}, offset={offset}, size={size})"
        padded = mapped_read_range(offset, size, action)
        with self._lock:
            self._check_open()
            self._checked_read(buffer, offset, padded, action)
            if padded == 0:
                return bytearray()
            staging = self._take_staging(padded, held=True)
            source = self._handles[buffer]
            source.busy += 1  # a release of the buffer meanwhile is done when this read ends (see destroy_buffer)
        wait = self._copy_and_wait(buffer, offset, staging, padded, source, action)
        with self._lock:
            self._unbusy(source)
            self._check_mapped(staging, wait.status, None, action)
            try:
                # void *wgpuBufferGetMappedRange(WGPUBuffer buffer, size_t offset, size_t size)
                pointer = self._lib.wgpuBufferGetMappedRange(staging.pointer, 0, padded)
                if pointer == self._ffi.NULL:
                    raise DeviceError(f"{action}: the staging buffer's mapped range is NULL")
                self._raise_pending(action)
            except BaseException:
                self._free_staging(staging)  # mapped, and neither held nor free: freed (which unmaps it)
                raise
            return self._mappings.hand_over(pointer, size, staging)

    def _read_into(self, buffer: int, offset: int, out: Any, action: str) -> None:
        """The read (``to_numpy``'s; see the module's docstring for its steps).  ``action`` names it in errors."""
        with self._lock:
            self._check_open()
            view = memoryview(out)
            source = self._handles.get(buffer)
            padded = -(-view.nbytes // BUFFER_ALIGNMENT) * BUFFER_ALIGNMENT
            if (  # the checks of _read_target, in one test; it names what failed
                view.readonly
                or not view.c_contiguous
                or source is None
                or source.kind != "buffer"
                or source.uniform
                or offset < 0
                or offset % BUFFER_ALIGNMENT
                or offset + padded > source.size
            ):
                self._read_target(buffer, offset, out, action)
                raise ValidationError(f"{action}: the read was refused")  # (_read_target raised first)
            if padded == 0:
                return
            view = view.cast("B")
            # a large read goes in chunks: the host copies one out while the next is on the bus
            chunks = [self._take_staging(n) for n in chunk_sizes(padded)] if padded >= CHUNKED_READ_MIN else []
            staging = chunks[0] if chunks else self._take_staging(padded)
            source.busy += 1  # a release of the buffer meanwhile is done when this read ends (see destroy_buffer)
        if chunks:
            return read_in_chunks(self, buffer, offset, view, padded, chunks, source, action)
        wait = self._copy_and_wait(buffer, offset, staging, padded, source, action)
        target = self._ffi.from_buffer(view, require_writable=True)
        self._copy_out_mapped(
            staging, wait.status, padded, action, [(self._address_of(target), view.nbytes, 0)], source
        )

    def _copy_and_wait(
        self, buffer: int, offset: int, staging: _Staging, padded: int, source: _Handle, action: str
    ) -> MapWait:
        """(Outside the lock; ``staging`` taken and ``source`` marked busy under it.)  Copy ``padded`` bytes at
        ``offset`` of ``buffer`` into ``staging``, request its mapping and wait for it (one C call each); a read that
        fails there is ended (:meth:`_abandon_read`) and raises its typed error."""
        wait = MapWait()
        code = CLOSING
        try:
            code = self._unlocked.copy_and_map(buffer, offset, staging.address, padded, wait)
            if code == DONE:
                code = self._wait_map(wait, action)
        finally:
            self._after_wait()
            if code != DONE:
                self._abandon_read(staging, wait, code, source)
        if code != DONE:
            self._raise_failed_read(code, action)
        return wait

    def _read_target(self, buffer: int, offset: int, out: Any, action: str) -> tuple[memoryview, int]:
        """``out`` as a byte view and the device range of the read (checked against ``buffer``)."""
        view, padded = host_read_target(out, action)
        self._check_aligned(action, offset=offset)
        self._checked_read(buffer, offset, padded, action)
        return view, padded

    def _checked_read(self, buffer: int, offset: int, size: int, action: str) -> int:
        record = self._lookup(buffer, "buffer", action)
        if offset + size > record.size:
            raise ValidationError(f"{action}: the read ends at {offset + size}, past the buffer's {record.size} bytes")
        if record.uniform:
            raise ValidationError(f"{action}: uniform buffers are write-only (no COPY_SRC usage)")
        return size

    def _note_writes(self, commands: CommandList) -> bool:
        """(Under the lock, before ``commands`` is submitted.)  Whether it writes a buffer read ahead (then marked
        stale; the submission must be made under the lock): the read-ahead layer (:mod:`._wgpu_read_ahead`)
        overrides this."""
        return False

    def submit_and_read(self, commands: CommandList, reads: Sequence[tuple[int, int, Any]]) -> None:
        """:meth:`submit` ``commands``, then :meth:`read_buffer_into` each ``(buffer, offset, out)``, as one
        command buffer (the copies to the staging buffer follow the commands in it) and one wait (in C, as a
        read's: :meth:`_wait_map`)."""
        action = f"submit_and_read ({len(commands)} commands, {len(reads)} reads)"
        regions: list[tuple[int, int, int, memoryview]] = []  # (buffer, offset, padded size, view)
        wait = MapWait()
        with self._lock:
            self._check_open()
            for index, (buffer, offset, out) in enumerate(reads):
                view, padded = self._read_target(
                    buffer, offset, out, f"submit_and_read: read {index} ({buffer:#x}, offset={offset})"
                )
                regions.append((buffer, offset, padded, view))
            self._validate_for_submit(commands)
            total = sum(padded for _, _, padded, _ in regions)
            # the staging buffer of this list's last read, so that what was encoded ahead with it can be used
            staging = self._take_staging(max(total, BUFFER_ALIGNMENT), self._list_staging.get(id(commands), 0))
            if commands.frozen:
                self._list_staging[id(commands)] = staging.address
            job = None
            requested = False
            try:
                tail = CommandList()
                cursor = 0
                for buffer, offset, padded, _ in regions:
                    if padded:
                        tail.add_copy(buffer, offset, staging.address, cursor, padded)
                    cursor += padded
                # a command buffer encoded ahead (a replay's) is submitted, and its map requested, after the lock
                locked = self._note_writes(commands)
                job, ready = self._encode_and_submit(commands, tail, action, defer=total > 0 and not locked)
                if total == 0:
                    self._give_back_staging(staging)
                elif not ready:
                    self._unlocked.request_map(staging.address, total, wait)  # keeping the GIL (short)
                    requested = True
                    self._raise_pending(action)
            except BaseException:
                self._cancel_job(job)
                if requested:  # its map may still complete (into ``wait``): never pooled again
                    _ABANDONED_WAITS.append(wait)
                    self._free_staging(staging)
                else:
                    self._give_back_staging(staging)
                raise
        if ready:
            try:
                self._submit_unlocked(commands, tail, ready, job, action, (staging.address, total, wait))
            except BaseException:
                self._abandon_read(staging, wait, CLOSING, None)  # its map may have been requested
                raise
        self._encode_ahead(job)  # the next replay's command buffer, encoded while this one runs
        if total == 0:
            return
        targets = [self._ffi.from_buffer(view, require_writable=True) for _, _, _, view in regions]  # kept alive
        copies: list[tuple[int, int, int]] = []
        at = 0
        for target, (_, _, padded, view) in zip(targets, regions):
            copies.append((self._address_of(target), view.nbytes, at))
            at += padded
        code = CLOSING
        try:
            code = self._wait_map(wait, action)
        finally:
            self._after_wait()
            if code != DONE:
                self._abandon_read(staging, wait, code, None)
        if code != DONE:
            self._raise_failed_read(code, action)
        self._copy_out_mapped(staging, wait.status, total, action, copies, None)

    def _wait_map(self, wait: MapWait, action: str, blocked: bool = False) -> int:
        """Wait, in C without the GIL or the device's lock, for ``wait``'s map request (spinning for
        ``spin_wait_us``, then polling with naps for ``nap_poll_s``, then blocking; ``blocked``: a blocking poll
        already completed everything submitted without completing it, so this blocks at once); a blocking poll that
        completes nothing is checked for a lost device.  Returns an :mod:`._unlocked_calls` code (DONE, CLOSING,
        LOST, or WAIT_IDLE once the polls are spent)."""
        spin, nap = (0.0, 0.0) if blocked else (self.spin_wait_us * 1e-6, self.nap_poll_s)
        blocking_polls = 0
        while True:
            code = self._unlocked.wait(wait, spin, nap)
            if code != WAIT_IDLE:
                return code
            blocking_polls += 1
            with self._lock:
                self._check_open()
                self._check_not_lost(action)
            if blocking_polls >= _MAP_POLL_ATTEMPTS:
                return code
            spin = nap = 0.0

    def _after_wait(self) -> None:
        """A C wait ended: apply what its polls completed for the Python waits (``wait_idle``, the profiling ring)
        and, if one sleeps, hand it the polling (a C wait never sets a Python waiter's event itself)."""
        requests = self._requests
        requests.drain()
        if requests.sleeping:
            requests.hand_over()

    def _abandon_read(self, staging: _Staging, wait: MapWait, code: int, source: _Handle | None) -> None:
        """A read whose C part returned ``code`` (not DONE), or raised: end it under the lock."""
        if code != NOT_SUBMITTED:
            _ABANDONED_WAITS.append(wait)  # its callback may still fire, into this object
        with self._lock:
            if source is not None:
                self._unbusy(source)
            self._drop_staging(staging, reusable=code == NOT_SUBMITTED)

    def _raise_failed_read(self, code: int, action: str) -> None:
        """The typed error of a read whose C part returned ``code`` (not DONE)."""
        with self._lock:
            self._check_open()  # destroyed (CLOSING) or lost (LOST)
            self._check_not_lost(action)
            self._raise_pending(action)  # what wgpu-native reported for the copy or the request
        if code == NOT_SUBMITTED:
            raise DeviceError(f"{action}: wgpu-native could not encode the copy to the staging buffer")
        if code == CLOSING:
            raise ReleasedValueError(f"{action}: the device was destroyed during the read; open a new one")
        raise DeviceError(f"{action}: the device did not complete the request ({_MAP_POLL_ATTEMPTS} waits)")

    def _copy_out_mapped(
        self,
        staging: _Staging,
        status: int,
        size: int,
        action: str,
        copies: list[tuple[int, int, int]],
        source: _Handle | None,
    ) -> None:
        """(A map request of ``staging`` completed with ``status``.)  Under the lock, keeping the GIL: end the read
        of ``source`` (if any), copy each ``(destination address, bytes, offset in the mapping)`` out of the mapped
        range, unmap, and give the buffer back to the pool."""
        with self._lock:
            if source is not None:
                self._unbusy(source)
            self._copy_out_locked(staging, status, None, size, action, copies)

    def _check_mapped(self, staging: _Staging, status: int, message: str | None, action: str) -> None:
        """(Under the lock; ``staging``'s map request completed with ``status``.)  Raise if the device was destroyed
        or lost meanwhile (the staging buffer went with it), or if the request failed (the buffer is then freed)."""
        self._check_open()
        self._check_not_lost(action)
        if status != self._map_success:
            self._free_staging(staging)
            name = _enum_suffix("WGPUMapAsyncStatus", status) if status > 0 else str(status)
            raise DeviceError(
                f"{action}: mapping the staging buffer failed ({name}){': ' + message if message else ''}"
            )

    def _copy_out_locked(
        self,
        staging: _Staging,
        status: int,
        message: str | None,
        size: int,
        action: str,
        copies: list[tuple[int, int, int]],
        give_back: bool = True,
    ) -> None:
        """(Under the lock; ``staging``'s map request completed with ``status``, and ``message`` if its callback
        gave one.)  Keeping the GIL: copy each ``(destination address, bytes, offset in the mapping)`` out of the
        mapped range, unmap, and give the buffer back to the pool (unless not ``give_back``: a read ahead's own); a
        failed request frees the buffer instead."""
        self._check_mapped(staging, status, message, action)
        try:
            calls = self._native_calls
            # wgpuBufferGetConstMappedRange, the copies, wgpuBufferUnmap
            if not copy_out(
                calls["wgpuBufferGetConstMappedRange"], calls["wgpuBufferUnmap"], staging.address, size, copies
            ):
                raise DeviceError(f"{action}: the staging buffer's mapped range is NULL")
        finally:
            if give_back:
                self._give_back_staging(staging)
        self._raise_pending(action)

    def _address_of(self, cdata: Any) -> int:
        return int(self._ffi.cast("uintptr_t", cdata))

    def _request_map(self, staging: _Staging, size: int, action: str) -> int:
        """(Under the lock.)  Ask for the first ``size`` bytes of ``staging`` mapped (wgpuBufferMapAsync, called
        keeping the GIL: :mod:`._device_calls`), reported to the Python waits by token: the profiling ring's
        reads (:mod:`._wgpu_timestamps`), which look for it without waiting.  Returns the request's token."""
        self._tokens += 1
        token = self._tokens
        self._requests.own(token)
        lib = self._lib
        map_read(
            self._native_calls["wgpuBufferMapAsync"],
            staging.address,
            lib.WGPUMapMode_Read,
            size,
            lib.WGPUCallbackMode_AllowProcessEvents,
            MAP_CALLBACK,
            token,
            self._requests.completions.address,
        )
        self._raise_pending(action)
        return token

    def _finish_read(
        self, staging: _Staging, token: int, size: int, action: str, copies: list[tuple[int, int, int]]
    ) -> None:
        """(The profiling ring's reads.)  Wait (without the lock) for the map request ``token`` of ``staging``, then
        copy out under the lock (:meth:`_copy_out_locked`)."""
        requests = self._requests
        try:
            self._wait_until(lambda: token in requests.map_results, action)
        except BaseException:
            with self._lock:  # its map may still be pending: never reuse it
                requests.map_results.pop(token, None)
                requests.owners.pop(token, None)
                if self._device is not None and staging.address in self._staging_all:
                    self._free_staging(staging)
            raise
        with self._lock:
            status, message = requests.map_results.pop(token)
            self._copy_out_locked(staging, status, message, size, action, copies)

    # -- waits -----------------------------------------------------------------------------
    def wait_idle(self) -> None:
        """Block until all work submitted so far is done (spinning first for up to ``spin_wait_us``), without
        holding the device's lock meanwhile."""
        lib, requests = self._lib, self._requests
        with self._lock:
            self._check_open()
            # wgpuDevicePoll's "queue empty" answer can come before the GPU has finished (seen on NVIDIA's driver), so
            # the wait is for a work-done callback registered after everything submitted so far.
            self._tokens += 1
            token = self._tokens
            requests.own(token)
            # wgpuQueueOnSubmittedWorkDone(queue, {callback, token, the completions}), keeping the GIL
            request_work_done(
                self._native_calls["wgpuQueueOnSubmittedWorkDone"],
                self._queue_address,
                lib.WGPUCallbackMode_AllowProcessEvents,
                WORK_DONE_CALLBACK,
                token,
                requests.completions.address,
            )
            self._raise_pending("wait_idle")
        self._wait_until(lambda: requests.work_done_token >= token, "wait_idle")
        failure = requests.work_done_failures.pop(token, None)
        if failure is not None:
            raise DeviceError(f"wait_idle: waiting for the submitted work failed: {failure}")

    def _wait_until(self, applied: Callable[[], bool], action: str) -> None:
        """Wait, without the device's lock, until ``applied()`` (a callback fired by someone's poll completed the
        request): poll while no other thread does, else sleep until the poller reports (module docstring)."""
        requests = self._requests

        def done() -> bool:  # what the callbacks recorded so far, applied first
            requests.drain()
            return applied()

        event = requests.event()
        deadline = time.perf_counter() + self.spin_wait_us * 1e-6
        nap_deadline = deadline + self.nap_poll_s
        blocking_polls = 0
        while not done():
            self._check_waitable(action)
            if requests.poll_lock.acquire(blocking=False):
                try:
                    polls, idle = self._poll_while(done, deadline, action, nap_deadline)
                finally:
                    requests.poll_lock.release()
                    requests.hand_over()  # a sleeping waiter takes over the polling
                blocking_polls += polls
                if idle and not done():
                    # A blocking poll waits for all submitted work, this request's included: completing nothing,
                    # it points at a device lost without a callback (see _check_not_lost)
                    with self._lock:
                        self._check_open()
                        self._check_not_lost(action)
                if blocking_polls >= _MAP_POLL_ATTEMPTS and not done():
                    raise DeviceError(f"{action}: the device did not complete the request ({blocking_polls} waits)")
                continue
            # Sleep until this request completes or the poller hands over.  Registered as sleeping first, then
            # checked again: a completion or a hand-over after these checks sets the event, so none is missed.
            event.clear()
            requests.sleeping.add(event)
            try:
                if not done() and requests.poll_lock.locked() and not requests.closing:
                    event.wait(_WAITER_RECHECK_S)
            finally:
                requests.sleeping.discard(event)

    def _poll_while(
        self, done: Callable[[], bool], deadline: float, action: str, nap_deadline: float | None = None
    ) -> tuple[int, bool]:
        """(Holding the poll lock.)  Poll until ``done()``, the device is lost or destroyed, or the blocking-poll
        budget is spent: until ``deadline`` without blocking, in C with the GIL released (:mod:`._device_calls`; it
        returns to check ``done()`` whenever a callback fired), then until ``nap_deadline`` (default: ``deadline``)
        still without blocking but sleeping between polls, then blocking.  Returns the blocking polls made, and
        whether it stopped because a blocking poll completed nothing."""
        requests, lib, null = self._requests, self._lib, self._ffi.NULL
        blocking = 0
        while not done() and blocking < _MAP_POLL_ATTEMPTS:
            device = self._device
            if device is None or requests.closing or self._sink.lost is not None:
                return blocking, False
            left = deadline - time.perf_counter()
            requests.completions.clear_fired()
            if done():  # a callback fired in another thread's call before the flag was cleared
                break
            if left > 0:
                spin_poll(self._device_poll_address, _address(device), requests.fired_address, left)
                continue
            napping = (nap_deadline or deadline) - time.perf_counter()
            if napping > 0:
                spin_poll(self._device_poll_address, _address(device), requests.fired_address, napping, True)
                continue
            # WGPUBool wgpuDevicePoll(WGPUDevice, WGPUBool wait, WGPUSubmissionIndex const *): its "queue empty"
            # answer is not trusted (see wait_idle); done() reads what the fired callbacks recorded
            self._unlocked.blocking_polls += 1
            lib.wgpuDevicePoll(device, 1, null)
            blocking += 1
            if not requests.completions.fired:
                return blocking, True
        return blocking, False

    def _check_waitable(self, action: str) -> None:
        """Raise if the device was destroyed or lost while a request was outstanding (read without the lock: both
        are one-way changes, and ``_check_open`` raises the typed error for each)."""
        if self._device is None or self._sink.lost is not None or self._requests.closing:
            if self._device is not None and self._sink.lost is None:
                raise DeviceError(f"{action}: the device is being destroyed")
            self._check_open()
