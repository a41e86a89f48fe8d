"""Large reads in chunks: the host copies one chunk out while the GPU's copy engine moves the next.

A read of one staging buffer is three steps one after the other: the GPU copies the range into host-visible memory,
the map request completes, the host copies out of the mapping.  For a read of at least :data:`CHUNKED_READ_MIN` bytes
(a decoder's logits, say) :func:`read_in_chunks` splits the range into chunks of :data:`READ_CHUNK` bytes, each in
a staging buffer of its own: every chunk's copy is submitted and its map requested up front, in order (one C call
each, ``UnlockedCalls.copy_and_map``, outside the device's lock); then each chunk in turn is waited for and copied
out (split across threads, :mod:`._host_copy`) while the later chunks are still on the bus.  What is left of the
three steps is roughly the longer of the transfer and the host copy, plus one chunk of the other.

Errors end the read as one of one staging buffer does (:meth:`_Readback._abandon_read`): a chunk not requested goes
back to the pool, one requested and not copied out is freed (its map may still complete, into a ``MapWait`` kept for
the life of the process); the first failure is raised as the read's typed error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ._device_lock import DeviceLock
from ._unlocked_calls import DONE, NOT_SUBMITTED, MapWait, UnlockedCalls
from ._wgpu_requests import _Staging

if TYPE_CHECKING:
    from ._wgpu_device_base import _Handle

#: Reads of at least this many bytes go in chunks.
CHUNKED_READ_MIN = 8 << 20
#: Bytes per chunk (a multiple of 4, as copies need).
READ_CHUNK = 4 << 20


class ChunkReader(Protocol):
    """What :func:`read_in_chunks` uses of the device (``_Readback`` provides it; named here rather than imported,
    since ``_Readback`` imports this module)."""

    _ffi: Any
    _unlocked: UnlockedCalls
    _lock: DeviceLock

    def _address_of(self, cdata: Any) -> int: ...
    def _wait_map(self, wait: MapWait, action: str, blocked: bool = False) -> int: ...
    def _after_wait(self) -> None: ...
    def _copy_out_locked(
        self,
        staging: _Staging,
        status: int,
        message: str | None,
        size: int,
        action: str,
        copies: list[tuple[int, int, int]],
        give_back: bool = True,
    ) -> None: ...
    def _abandon_read(self, staging: _Staging, wait: MapWait, code: int, source: _Handle | None) -> None: ...
    def _unbusy(self, record: _Handle) -> None: ...
    def _raise_failed_read(self, code: int, action: str) -> None: ...


def chunk_sizes(padded: int) -> list[int]:
    """The sizes of the chunks of a ``padded``-byte read (all :data:`READ_CHUNK` but the last)."""
    return [min(READ_CHUNK, padded - start) for start in range(0, padded, READ_CHUNK)]


def read_in_chunks(
    device: ChunkReader,
    buffer: int,
    offset: int,
    view: memoryview,
    padded: int,
    stagings: list[_Staging],
    source: _Handle,
    action: str,
) -> None:
    """(Outside the lock; ``stagings`` taken, one per chunk of :func:`chunk_sizes`, and ``source`` marked busy under
    it.)  Read ``view.nbytes`` bytes (``padded``: rounded up to 4) at ``offset`` of ``buffer`` into ``view``, one
    chunk per staging buffer (see the module's docstring)."""
    sizes = chunk_sizes(padded)
    target_cdata: Any = device._ffi.from_buffer(view, require_writable=True)  # kept alive until the copies end
    target = device._address_of(target_cdata)
    waits = [MapWait() for _ in sizes]
    codes = [NOT_SUBMITTED] * len(sizes)
    owned = [True] * len(sizes)  # still this read's to end (not yet handed to a copy-out)
    failure = DONE
    try:
        for index, (staging, size) in enumerate(zip(stagings, sizes)):
            codes[index] = device._unlocked.copy_and_map(
                buffer, offset + index * READ_CHUNK, staging.address, size, waits[index]
            )
            if codes[index] != DONE:
                failure = codes[index]
                break
        for index, (staging, size) in enumerate(zip(stagings, sizes)):
            if failure != DONE:
                break
            try:
                code = device._wait_map(waits[index], action)
            finally:
                device._after_wait()
            if code != DONE:
                codes[index] = failure = code
                break
            start = index * READ_CHUNK
            count = min(size, view.nbytes - start)
            owned[index] = False
            with device._lock:
                device._copy_out_locked(staging, waits[index].status, None, size, action, [(target + start, count, 0)])
    finally:
        for index, staging in enumerate(stagings):
            if owned[index]:
                device._abandon_read(staging, waits[index], codes[index], None)
        with device._lock:
            device._unbusy(source)
    if failure != DONE:
        device._raise_failed_read(failure, action)
