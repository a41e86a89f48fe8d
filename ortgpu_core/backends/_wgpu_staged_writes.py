"""Large uploads through staging buffers the device keeps mapped: the host copy split across threads, and the
copy engine moving one chunk while the host fills the next.

``wgpuQueueWriteBuffer`` copies the caller's data into a staging buffer it allocates for the call, on the calling
thread, and the GPU's copy engine moves it at the next submission: one core's ``memcpy`` (10-15 GB/s) and the bus
transfer one after the other set the pace of a 16 MB upload.  A write of at least :data:`STAGED_WRITE_MIN` bytes
goes here instead when the host copies may use threads (:func:`stages`), in chunks of at most :data:`CHUNK` bytes.
Each chunk takes a staging buffer of the pool (``MAP_WRITE | COPY_SRC``, :data:`CHUNK` bytes, created mapped) that is mapped now, and in one C call without the GIL
(``UnlockedCalls.staged_write``) is copied into it by several threads (:mod:`._host_copy`), unmapped, copied into
place by a submission of its own, and the staging buffer's mapping for writing requested again: that request
completes once the copy has run, inside whichever thread's poll sees it (a read's wait, ``wait_idle``), and the
buffer is mapped for the next write.  Chunks are submitted one by one, so the copy engine moves one while the host
fills the next.

A chunk that finds no mapped staging buffer (all in flight, and the pool at :data:`POOL_CHUNKS`) is written through
``wgpuQueueWriteBuffer``.  The order of writes and submissions holds either way: wgpu-native runs the queue's pending
writes before the commands of its next submission, and each chunk's copy is a submission in queue order.

Ownership: this layer owns the pool (``_upload_ready``: mapped, ``_upload_pending``: map requested), read and changed
under the device's lock; a pending request's :class:`._unlocked_calls.MapWait` is written by its callback in
whichever thread completes it, and is kept alive until then (at the destroy, for the life of the process).
"""

from __future__ import annotations

from typing import Any

from .._errors import DeviceError
from . import _host_copy
from ._unlocked_calls import DONE, MapWait
from ._wgpu_ffi import _address
from ._wgpu_readback import _ABANDONED_WAITS
from ._wgpu_timestamps import _Timestamps

# Writes of at least this many bytes are staged here, when the host copies run on at least STAGING_THREADS threads.
# On a discrete GPU (an H100) 16 and 64 MB uploads went 1.2-1.6x faster staged with 2-4 threads, as fast as
# wgpuQueueWriteBuffer with one, and 1 MB ones 10-20% slower; on lavapipe, where the bus is another host copy,
# staging one thread's copies was 1.5x slower.  4 MiB: a copy splits into 4 slices of at least 1 MiB from there.
STAGED_WRITE_MIN = 4 << 20
STAGING_THREADS = 2
# The size of a staging buffer of the pool, and so of a chunk.
CHUNK = 4 << 20
# Staging buffers the pool holds at most (CHUNK each): enough for two 16 MB writes in flight.
POOL_CHUNKS = 8


def stages(size: int) -> bool:
    """Whether a write of ``size`` bytes goes through the upload pool (see :data:`STAGED_WRITE_MIN`)."""
    return size >= STAGED_WRITE_MIN and _host_copy.copy_threads() >= STAGING_THREADS


class _UploadStaging:
    """A staging buffer of the upload pool: ``wait`` is None while it is mapped for writing, else its map request."""

    __slots__ = ("pointer", "address", "wait")

    def __init__(self, pointer: Any, address: int) -> None:
        self.pointer = pointer
        self.address = address
        self.wait: MapWait | None = None


class _StagedWrites(_Timestamps):
    """The upload pool and the staged writes of a wgpu device (see the module's docstring)."""

    def _init_staged_writes(self) -> None:
        self._upload_ready: list[_UploadStaging] = []
        self._upload_pending: list[_UploadStaging] = []
        self.staged_writes = 0  # chunks written through the pool (for tests and the bench)

    def _take_upload_staging(self, action: str) -> _UploadStaging | None:
        """(Under the lock.)  A staging buffer mapped for writing: one whose request completed, else a new one if the
        pool has room, else None."""
        self._collect_uploads()
        if self._upload_ready:
            return self._upload_ready.pop()
        if len(self._upload_pending) >= POOL_CHUNKS:
            return None
        lib = self._lib
        pointer = self._native_buffer(
            CHUNK, lib.WGPUBufferUsage_MapWrite | lib.WGPUBufferUsage_CopySrc, "ortgpu upload", action, mapped=True
        )
        return _UploadStaging(pointer, _address(pointer))

    def _collect_uploads(self) -> None:
        """(Under the lock.)  Move the staging buffers whose map request completed to the ready list (a failed one
        is freed)."""
        pending = self._upload_pending
        if not pending:
            return
        success = self._map_success
        for staging in list(pending):
            wait = staging.wait
            status = 0 if wait is None else wait.status
            if status == 0:
                continue
            pending.remove(staging)
            staging.wait = None
            if status == success:
                self._upload_ready.append(staging)
            else:
                self._free_buffer(staging.pointer)

    def _write_staged(self, target: Any, offset: int, data: int, size: int, action: str) -> None:
        """(Under the lock; the write was checked.)  Write ``size`` bytes at address ``data`` into the buffer
        ``target`` (a native pointer) at ``offset``, chunk by chunk (see the module's docstring)."""
        self._check_not_lost(action)  # a staging buffer of a lost device aborts the process when its range is taken
        unlocked, calls = self._unlocked, self._native_calls
        target_address = _address(target)
        write_mode = int(self._lib.WGPUMapMode_Write)
        done = 0
        while done < size:
            count = min(CHUNK, size - done)
            staging = self._take_upload_staging(action)
            if staging is None:
                unlocked.queue_write(target_address, offset + done, data + done, count)
                done += count
                continue
            wait = MapWait()
            code = unlocked.staged_write(
                staging.address,
                calls["wgpuBufferGetMappedRange"],
                calls["wgpuBufferUnmap"],
                data + done,
                count,
                target_address,
                offset + done,
                write_mode,
                CHUNK,
                wait,
            )
            if code != DONE:
                # Unmapped, nothing requested (or the gate closed): the buffer is of no further use
                self._free_buffer(staging.pointer)
                self._raise_pending(action)
                raise DeviceError(f"{action}: wgpu-native could not submit the copy from a staging buffer")
            staging.wait = wait
            self._upload_pending.append(staging)
            self.staged_writes += 1
            done += count
        self._raise_pending(action)

    def _destroy_staged_writes(self) -> None:
        """(The device's destroy, under its lock.)  Free the pool; a request still pending may complete into its
        MapWait during or after the free, so those are kept for the life of the process."""
        for staging in self._upload_ready + self._upload_pending:
            self._free_buffer(staging.pointer)
            if staging.wait is not None:
                _ABANDONED_WAITS.append(staging.wait)
        self._upload_ready.clear()
        self._upload_pending.clear()
