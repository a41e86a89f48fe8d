"""The staging buffers a wgpu device reads through: a pool of MAP_READ | COPY_DST buffers, and those handed over
mapped to an array (:mod:`._wgpu_mapped_reads`).

Which buffer a read takes: ``submit_and_read`` of a frozen list the buffer that list's last read used when it is
free (its command buffer encoded ahead names that buffer, whichever thread reads), any read the free buffer its thread
used last (so a captured graph replayed and read by one thread keeps naming the same buffer), else any free one large
enough, else a new one (a power of two in size) that replaces a free one (never more buffers than reads at once, plus
those held by arrays: a read handed over mapped takes a free buffer of at most twice its size that no frozen list
names, else a new one of its size, and frees none).  A buffer whose request did not complete is freed, not returned.  Replacing a buffer releases
the command buffers encoded ahead that copy into it.

Ownership: :class:`_StagingPool` is a layer of ``WgpuDevice`` (after ``_EncodeAhead``; ``_Readback`` reads through
it).  ``_staging_free`` and ``_staging_all`` are read and changed under the device's lock; ``_mappings`` has a lock
of its own (its finalizers run in any thread).
"""

from __future__ import annotations

import threading

from ._wgpu_encode_ahead import _EncodeAhead
from ._wgpu_ffi import _address
from ._wgpu_mapped_reads import HELD_ROUNDING, POOLED_LARGE, HeldMappings
from ._wgpu_requests import _Staging
from .protocol import MAPPED_READ_MIN

_STAGING_MINIMUM = 1 << 16


class _StagingPool(_EncodeAhead):
    """The staging pool of a wgpu device (see the module's docstring)."""

    def _init_staging_pool(self) -> None:
        """Set this layer's fields: no staging buffers yet, none held."""
        self._staging_free: list[_Staging] = []
        self._staging_all: dict[int, _Staging] = {}  # by address, free or in use
        self._mappings = HeldMappings(self._ffi, self._lib, self._sink.reports)  # those handed over mapped

    @property
    def _staging_size(self) -> int:
        """The size of the largest staging buffer (0: none yet)."""
        return max((staging.size for staging in list(self._staging_all.values())), default=0)

    def _take_staging(self, size: int, prefer: int = 0, held: bool = False) -> _Staging:
        """A free staging buffer of at least ``size`` bytes for the calling thread (see the module's docstring):
        the one at address ``prefer`` when it is free and large enough.  ``held``: for a read handed over mapped,
        which keeps it for the array's life: a free buffer of at most twice ``size`` that no frozen list's read
        names, else a new one of ``size`` rounded up to :data:`HELD_ROUNDING` (none freed to make room)."""
        if self._mappings.returned:
            self._return_mappings()
        thread = threading.get_ident()
        free = self._staging_free
        if held:
            named = set(self._list_staging.values())
            free = [s for s in free if size <= s.size <= 2 * size and s.address not in named]
        chosen = next((s for s in free if s.address == prefer and s.size >= size), None) if prefer else None
        if chosen is None:
            chosen = next((s for s in free if s.owner == thread and s.size >= size), None)
        if chosen is None:
            chosen = next((s for s in free if s.size >= size), None)
        if chosen is None:
            # every free one is too small: one is replaced (this thread's, else the smallest), so the pool only
            # grows while all its buffers are in use (one per read at once, and those held by arrays)
            victim = None
            if not held:
                victim = next((s for s in free if s.owner == thread), None) or min(
                    free, key=lambda s: s.size, default=None
                )
            if victim is not None:
                free.remove(victim)
                self._free_staging(victim)
            capacity = max(_STAGING_MINIMUM, 1 << (size - 1).bit_length())
            if held:
                capacity = -(-size // HELD_ROUNDING) * HELD_ROUNDING
            capacity = min(capacity, max(size, self.limits.max_buffer_size - self.limits.max_buffer_size % 4))
            lib = self._lib
            pointer = self._native_buffer(
                capacity, lib.WGPUBufferUsage_MapRead | lib.WGPUBufferUsage_CopyDst, "ortgpu staging", "staging"
            )
            chosen = _Staging(pointer, _address(pointer), capacity, thread)
            self._staging_all[chosen.address] = chosen
        else:
            self._staging_free.remove(chosen)
        chosen.owner = thread
        return chosen

    def _give_back_staging(self, staging: _Staging) -> None:
        if self._device is not None and staging.address in self._staging_all:
            self._staging_free.append(staging)

    def _free_staging(self, staging: _Staging) -> None:
        """Free a staging buffer, and the command buffers encoded ahead whose copies target it."""
        self._staging_all.pop(staging.address, None)
        address = staging.address
        self._release_ahead(lambda key: any(r[0] == "copy" and r[3] == address for r in key[1]))
        self._free_buffer(staging.pointer)

    def _return_mappings(self) -> None:
        """(Under the lock.)  Unmap the staging buffers whose views were collected and take them back into the
        pool, keeping at most :data:`POOLED_LARGE` free ones of ``MAPPED_READ_MIN`` bytes or more (the rest are freed)."""
        for staging in self._mappings.take_returned():
            if self._device is None or staging.address not in self._staging_all:
                continue
            large = sum(1 for free in self._staging_free if free.size >= MAPPED_READ_MIN)
            if large >= POOLED_LARGE:
                self._free_staging(staging)  # (destroying a mapped buffer unmaps it)
                continue
            # void wgpuBufferUnmap(WGPUBuffer buffer)
            self._lib.wgpuBufferUnmap(staging.pointer)
            self._give_back_staging(staging)

    def _drop_staging(self, staging: _Staging, reusable: bool) -> None:
        """(Under the lock.)  A read that did not complete: its staging buffer goes back to the pool if nothing
        was requested of it, else it is freed (its map may still be pending)."""
        if self._device is None or staging.address not in self._staging_all:
            return  # freed with the device
        if reusable:
            self._give_back_staging(staging)
        else:
            self._free_staging(staging)

    def _free_staging_pool(self) -> bool:
        """(The device's destroy, under its lock.)  Free the staging buffers but those still held by a view (their
        views release them); True when some are."""
        held = self._mappings.close()
        for staging in list(self._staging_all.values()):
            if staging.address not in held:
                self._free_buffer(staging.pointer)
        self._staging_all.clear()
        self._staging_free.clear()
        return bool(held)
