"""Large reads handed over mapped: the host array of a read is the staging memory the GPU copied into.

Why: a read of a decoder's logits (16 MB) spent most of its time in the host's copy out of the mapped staging
buffer (bench/RESULTS.md, "Copies"), not on the bus.  PyTorch's reads end with the data in pinned host memory, which
the caller uses in place; :meth:`_Readback.read_buffer_mapped` does the same: the range is copied into a staging
buffer of its own, mapped, and the mapping itself is returned as a writable buffer object (``np.frombuffer`` makes
an array of it with no copy).

Safety: while the object or any view of it lives, its staging buffer stays mapped, and a mapped buffer is never in
the staging pool, so nothing the device submits can name it: the array holds what the buffer held at the read, and
later runs never change it (they copy into other staging buffers).  When the last view is collected, the object's
finalizer (cffi's ``ffi.gc``, in whichever thread drops it) only queues the buffer (:class:`HeldMappings`: it may
run anywhere, even inside the device's lock in the same thread); the device unmaps the queued buffers and takes
them back into its pool (at most :data:`POOLED_LARGE` large ones: the rest are freed) at its next read, and at its
destroy.  A buffer still held when the device is destroyed is left to its view: the device skips it, and the view's
finalizer releases it (wgpu-native keeps the device's memory alive while a buffer refers to it), so an array may
outlive its device.

Costs: a held array keeps its staging buffer for its life (a free one of its size to twice it, else a new one of its
size rounded up to 64 KiB); host memory is about a copied array's.  Reads below :data:`MAPPED_READ_MIN` keep copying out: small reads are cheap to copy, ride in a
replay's submission (:mod:`._wgpu_read_ahead`), and would each pin a buffer.
"""

from __future__ import annotations

import threading
from collections import deque
from functools import partial
from typing import Any

from ._wgpu_requests import _Staging

#: At most this many free staging buffers of at least ``MAPPED_READ_MIN`` bytes stay in the pool once their views
#: are collected (a step reading a new array while the last one's is still alive needs two); the rest are freed.
POOLED_LARGE = 2
#: New staging buffers for held reads are their read's size rounded up to this (not to a power of two).
HELD_ROUNDING = 1 << 16


class HeldMappings:
    """The staging buffers handed over mapped (see the module's docstring): ``held`` by address until their view is
    collected, then ``returned`` (queued for the device); after the device's :meth:`close`, a collected view
    releases its buffer itself.  Its lock is reentrant and guards only these containers and ``open``: a finalizer
    may run in a thread that is inside one of these methods."""

    def __init__(self, ffi: Any, lib: Any, keep_alive: object) -> None:
        self._ffi = ffi
        self._lib = lib
        # the device's error record (``_sink.reports``): its C struct is where wgpu-native's callbacks write, and the
        # native device lives on while a view holds a buffer of it (see ``WgpuDevice._destroy_native``)
        self._keep_alive = keep_alive
        self._lock = threading.RLock()
        self.open = True
        self.held: dict[int, _Staging] = {}
        self.returned: deque[_Staging] = deque()

    def hand_over(self, pointer: Any, size: int, staging: _Staging) -> Any:
        """A writable buffer object of ``size`` bytes at ``pointer`` (``staging``'s mapped range) whose collection
        returns ``staging``."""
        with self._lock:
            self.held[staging.address] = staging
        owner = self._ffi.gc(self._ffi.cast("uint8_t *", pointer), partial(self._collected, staging))
        return self._ffi.buffer(owner, size)

    def _collected(self, staging: _Staging, _pointer: Any) -> None:
        """(The finalizer: the last view of ``staging``'s mapping was collected.)"""
        with self._lock:
            if self.open:
                self.returned.append(staging)
                return
            self.held.pop(staging.address, None)
        # the device was destroyed meanwhile and skipped this buffer: its last user releases it (dropping a mapped
        # buffer unmaps it); void wgpuBufferRelease(WGPUBuffer buffer)
        self._lib.wgpuBufferRelease(staging.pointer)

    def take_returned(self) -> list[_Staging]:
        """The buffers whose views were collected since the last call (no longer held)."""
        returned = []
        with self._lock:
            while self.returned:  # one at a time: a finalizer may append meanwhile, in this very thread
                staging = self.returned.popleft()
                self.held.pop(staging.address, None)
                returned.append(staging)
        return returned

    def close(self) -> set[int]:
        """(The device's destroy.)  The addresses of the buffers still held (the device must not free them: their
        views release them); those returned and not yet taken are the device's to free with its pool."""
        with self._lock:
            self.take_returned()
            self.open = False
            return set(self.held)
