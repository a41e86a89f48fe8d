"""Reads ahead: a captured graph's outputs copied to the host-visible side in the replay's own submission, so that
``to_numpy()`` after ``replay()`` costs no submission of its own, and never returns anything but the buffer's
current contents.

Why: a threaded step of ``update_inplace`` + ``replay()`` + ``to_numpy()`` made two submissions (the replay's, then
the read's copy); the same step's native work with the copy riding in the replay's submission came close to the
GPU's ceiling at K=4 threads, and with its own submission stayed far below it (bench/RESULTS.md, threads).

How: ``submit(commands, read_ahead=[(buffer, offset, size), ...])`` names the ranges a read may ask for next.
Each such buffer gets a :class:`_ReadAhead`: a staging buffer of its own (MAP_READ | COPY_DST), and whether that
staging buffer holds the buffer's current contents (``fresh``).  The submission then ends with copies of the ranges
into their staging buffers (a tail, encoded ahead with the list as ``submit_and_read``'s is), and those become
fresh.  A read of a fresh range maps its staging buffer (no copy, no submission), waits, copies out and unmaps.

Staleness, the safety part: every way this device writes a buffer marks a read ahead of it stale, under the
device's lock, before the write is made: ``write_buffer``, and every submission (``submit``, ``submit_and_read``,
``read_async``), whose command list's writes are known (:meth:`CommandList.written_among`: the buffers its
dispatches' bind groups bind writable, and copy, clear and resolve destinations).  A submission that writes a
watched buffer without refreshing it is made under the lock (never from the unlocked path), so its marking and
its place in the queue are one step: a refresh marked fresh later is also submitted later, and the staging copy,
made in the same submission as the refresh's writes, equals the buffer after it.  A refresh is submitted outside
the lock (the point of all this), so until its submit returned (``pending``) a read of that range takes the ordinary
path; a read holds its staging buffer (``busy``) until it unmapped it, and a refresh that finds it busy leaves that
range out (and marks it stale).

Which ranges are copied: those a read asked for since the range's last refresh (``wanted``; new ranges start
wanted), so replays that nobody reads in between copy nothing after the first.  Ranges over
:data:`READ_AHEAD_MAX_BYTES` are not read ahead.  Costs: a read ahead (and its staging buffer, as large as the range)
lives as long as its buffer, also after the graph that asked for it was released (its copy stays valid for reads
until the buffer is written); while any read ahead exists, every submission's command list is scanned for the
buffers it writes (a C loop over its records; cached per frozen list).

Ownership: :class:`_ReadAheads` is a layer of ``WgpuDevice`` (after ``_Readback``, whose staging buffers and waits it
uses); ``_aheads`` (buffer handle -> :class:`_ReadAhead`), ``_bind_group_writes`` and ``_list_writes`` are changed
under the device's lock; a read that hits takes only the read ahead's own lock (``_ReadAhead.lock``, which guards
``busy``, ``pending``, ``dropped`` and ``freed``, and which a refresh takes to check ``busy``).  Releasing the buffer
drops its read ahead; its staging buffer is freed by whoever ends its last use (a read that maps it, a refresh
submitted outside the lock that copies into it); the device's destroy frees the staging buffers with the pool's.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Sequence

from .._errors import DeviceError, ValidationError
from ._commands import CommandList
from ._unlocked_calls import CLOSING, DONE, LOST, MAP_FAILED, NOT_SUBMITTED, WAIT_IDLE, MapWait
from ._wgpu_chunked_reads import CHUNKED_READ_MIN
from ._wgpu_readback import _ABANDONED_WAITS, _Readback
from ._wgpu_requests import _Staging
from .protocol import BUFFER_ALIGNMENT, padded

#: Ranges larger than this are not read ahead.  A read that large goes in chunks (:mod:`._wgpu_chunked_reads`), whose
#: host copy of one chunk overlaps the bus's transfer of the next; read ahead into one staging buffer, the whole range
#: crosses the bus before the host copies a byte.  On an H100 a decoder's 16 MB logits read back after a replay made
#: its end-to-end step about 20% faster in chunks than read ahead (bench/RESULTS.md); and a staging buffer that large
#: kept for the buffer's life would double the output's memory.
READ_AHEAD_MAX_BYTES = CHUNKED_READ_MIN - 1
# At most this many frozen lists' watched writes are remembered.
_LIST_MEMORY = 4096


class _ReadAhead:
    """One buffer's read ahead: the range ``[start, start + size)`` (size padded to 4 bytes) and its staging
    buffer; ``fresh`` when the staging buffer holds the range's current contents; ``wanted`` when a read asked
    for the buffer since the last refresh; ``pending`` the tokens of refreshes not submitted yet; ``busy`` while a
    read maps the staging buffer; ``dropped`` once the buffer was released or a read of it failed (the staging
    buffer is then freed by whoever ends its last use: ``freed``)."""

    __slots__ = ("buffer", "start", "size", "staging", "fresh", "wanted", "pending", "busy", "dropped", "freed", "lock")

    def __init__(self, buffer: int, start: int, size: int, staging: _Staging) -> None:
        self.buffer = buffer
        self.start = start
        self.size = size
        self.staging = staging
        self.fresh = False
        self.wanted = True
        self.pending: list[object] = []
        self.busy = False
        self.dropped = False
        self.freed = False  # its staging buffer was freed (once dropped and unused)
        # guards busy and dropped, and the check a read makes before it takes the staging buffer (the device's lock
        # is not taken by a read that hits: see _ReadAheads._read_into)
        self.lock = threading.Lock()


class _ReadAheads(_Readback):
    """Reads ahead of buffers a submission names (see the module's docstring)."""

    def _init_read_ahead(self) -> None:
        """Set this layer's fields: no read ahead."""
        self._aheads: dict[int, _ReadAhead] = {}
        self._aheads_version = 0  # moves whenever a read ahead is made or dropped
        self._bind_group_writes: dict[int, tuple[int, ...]] = {}  # bind group -> buffers it binds writable
        # frozen lists: id -> (the list, weakly; _aheads_version; the watched buffers it writes)
        self._list_writes: dict[int, tuple[weakref.ref[CommandList], int, frozenset[int]]] = {}

    # -- what writes a watched buffer (under the lock) ------------------------------------------------
    def _watched_writes(self, commands: CommandList) -> frozenset[int]:
        """The buffers with a read ahead that ``commands`` may write (cached per frozen list)."""
        if commands.frozen:
            cached = self._list_writes.get(id(commands))
            if cached is not None and cached[1] == self._aheads_version and cached[0]() is commands:
                return cached[2]
        found = frozenset(commands.written_among(self._bind_group_writes, self._aheads))
        if commands.frozen:
            if len(self._list_writes) > _LIST_MEMORY:  # (entries of lists that died: forgotten all at once)
                self._list_writes.clear()
            self._list_writes[id(commands)] = (weakref.ref(commands), self._aheads_version, found)
        return found

    def _note_writes(self, commands: CommandList) -> bool:
        """(Under the lock, before ``commands`` is submitted.)  Mark the read aheads ``commands`` may write stale;
        True when there was one (the submission must then be made under the lock: see the module's docstring)."""
        return bool(self._mark_stale(commands)) if self._aheads else False

    def _mark_stale(self, commands: CommandList) -> frozenset[int]:
        """(Under the lock.)  Mark the read aheads ``commands`` may write stale; returns their buffers."""
        written = self._watched_writes(commands)
        for buffer in written:
            self._aheads[buffer].fresh = False
        return written

    def _note_written(self, buffer: int) -> None:
        """(Under the lock, before a write of ``buffer`` is queued.)"""
        ahead = self._aheads.get(buffer)
        if ahead is not None:
            ahead.fresh = False

    # -- making, refreshing and dropping read aheads (under the lock) ----------------------------------
    def _check_read_ahead(self, read_ahead: Sequence[tuple[int, int, int]], action: str) -> None:
        """Refuse a bad ``read_ahead`` argument (before anything is submitted).  A range that has its read ahead
        already (made after this check, dropped when its buffer is released) is not checked again."""
        aheads = self._aheads
        for item in read_ahead:
            ahead = aheads.get(item[0]) if type(item) is tuple and len(item) == 3 else None
            if ahead is not None and ahead.start == item[1] and ahead.size == padded(item[2]):
                continue
            if not (isinstance(item, tuple) and len(item) == 3 and all(isinstance(v, int) for v in item)):
                raise ValidationError(f"{action}: read_ahead takes (buffer, offset, size) tuples of ints, not {item!r}")
            buffer, offset, size = item
            where = f"{action}, read_ahead ({buffer:#x}, offset={offset}, size={size})"
            record = self._lookup(buffer, "buffer", where)
            self._check_aligned(where, offset=offset)
            if size < 0 or offset + size > record.size:
                raise ValidationError(f"{where}: the range is past the buffer's {record.size} bytes")
            if record.uniform:
                raise ValidationError(f"{where}: uniform buffers cannot be read (no COPY_SRC usage)")

    def _read_ahead_tail(
        self, commands: CommandList, read_ahead: Sequence[tuple[int, int, int]], action: str
    ) -> tuple[CommandList | None, list[_ReadAhead], object, bool]:
        """(Under the lock, ``read_ahead`` checked.)  The copies to append to ``commands``' submission, the read
        aheads they refresh (marked fresh, with ``token`` pending), and whether the submission must be made under
        the lock (it writes a watched buffer that it does not refresh).  Stale marks first, then fresh ones."""
        aheads = self._aheads
        refreshed: list[_ReadAhead] = []
        token = object()
        for buffer, offset, size in read_ahead:
            size = padded(size)
            if size == 0 or size > READ_AHEAD_MAX_BYTES:
                continue
            ahead = aheads.get(buffer)
            if ahead is not None and (ahead.start != offset or ahead.size != size):
                self._drop(ahead)
                ahead = None
            if ahead is None:
                ahead = _ReadAhead(buffer, offset, size, self._take_staging(size))
                aheads[buffer] = ahead
                self._aheads_version += 1
            with ahead.lock:  # a read takes the staging buffer (busy) under it, seeing no refresh pending
                if ahead.wanted and not ahead.busy:
                    ahead.pending.append(token)
                    refreshed.append(ahead)
        written = self._mark_stale(commands) if aheads else frozenset()
        locked = any(aheads[buffer] not in refreshed for buffer in written)
        if not refreshed:
            return None, refreshed, token, locked
        tail = CommandList()
        for ahead in refreshed:
            tail.add_copy(ahead.buffer, ahead.start, ahead.staging.address, 0, ahead.size)
            ahead.fresh = True
            ahead.wanted = False
        return tail, refreshed, token, locked

    def _refresh_ended(self, refreshed: list[_ReadAhead], token: object, submitted: bool) -> None:
        """A refresh's submit returned (``submitted``) or raised (the read aheads are stale: under the lock).  A
        read ahead dropped meanwhile has its staging buffer freed now (the refresh's command buffer named it)."""
        dropped = False
        for ahead in refreshed:
            with ahead.lock:
                if not submitted:
                    ahead.fresh = False
                ahead.pending.remove(token)
                dropped = dropped or ahead.dropped
        if dropped:
            with self._lock:
                for ahead in refreshed:
                    self._free_dropped(ahead)

    def _free_dropped(self, ahead: _ReadAhead) -> None:
        """(Under the lock.)  Free a dropped read ahead's staging buffer once nothing uses it any more: no read maps
        it (``busy``) and no refresh that copies into it is between its marking and its submit (``pending``).
        Whoever ends the last use frees it, once."""
        with ahead.lock:
            free = ahead.dropped and not ahead.busy and not ahead.pending and not ahead.freed
            if free:
                ahead.freed = True
        if free:
            self._drop_staging(ahead.staging, reusable=False)

    def _drop_read_ahead(self, buffer: int) -> None:
        """(Under the lock.)  Forget ``buffer``'s read ahead, if it has one (:meth:`_drop`)."""
        ahead = self._aheads.get(buffer)
        if ahead is not None:
            self._drop(ahead)

    def _drop(self, ahead: _ReadAhead) -> None:
        """(Under the lock.)  Forget ``ahead`` (it is stale from here on): its staging buffer is freed now, or by the
        last read or refresh that uses it (:meth:`_free_dropped`)."""
        if self._aheads.get(ahead.buffer) is ahead:
            del self._aheads[ahead.buffer]
            self._aheads_version += 1
        with ahead.lock:
            ahead.dropped = True
            ahead.fresh = False
        self._free_dropped(ahead)

    # -- reads ---------------------------------------------------------------------------------------
    def _read_into(self, buffer: int, offset: int, out: Any, action: str) -> None:
        """A read of a buffer with a read ahead: from its staging buffer when that is fresh and covers the range
        (one C call, without the GIL or the device's lock: map, wait, copy out, unmap; no submission), else the
        ordinary read.  Other buffers: the ordinary read."""
        ahead = self._aheads.get(buffer)
        if ahead is None:
            super()._read_into(buffer, offset, out, action)
            return
        view = memoryview(out)
        taken = False
        if not view.readonly and view.c_contiguous and self._device is not None:
            size = padded(view.nbytes)
            with ahead.lock:  # (the refresh takes it too: see _read_ahead_tail)
                ahead.wanted = True
                if (
                    ahead.fresh
                    and not ahead.busy
                    and not ahead.pending
                    and not ahead.dropped
                    and size > 0
                    and offset >= ahead.start
                    and offset % BUFFER_ALIGNMENT == 0
                    and offset + size <= ahead.start + ahead.size
                ):
                    ahead.busy = taken = True
        if not taken:
            super()._read_into(buffer, offset, out, action)
            return
        view = view.cast("B")
        target = self._ffi.from_buffer(view, require_writable=True)
        if not self._sentinel_address:
            try:
                with self._lock:  # the probe read_mapped makes before reading the mapping needs its buffer
                    self._check_not_lost(action)
            except BaseException:
                self._end_read_ahead(ahead)
                raise
        wait = MapWait()
        code = CLOSING
        calls = self._native_calls
        try:
            code = self._unlocked.read_mapped(
                ahead.staging.address,
                ahead.size,
                wait,
                self.spin_wait_us * 1e-6,
                self.nap_poll_s,
                calls["wgpuBufferGetConstMappedRange"],
                calls["wgpuBufferUnmap"],
                self._map_success,
                self._address_of(target),
                view.nbytes,
                offset - ahead.start,
                self._sentinel_address,
            )
            if code == WAIT_IDLE:  # (a blocking poll that did not complete it: wait on, then copy out the usual way)
                code = self._wait_map(wait, action, blocked=True)
                if code == DONE:
                    with self._lock:
                        self._copy_out_locked(
                            ahead.staging,
                            wait.status,
                            None,
                            ahead.size,
                            action,
                            [(self._address_of(target), view.nbytes, offset - ahead.start)],
                            give_back=False,
                        )
        finally:
            self._after_wait()
            if code != DONE:
                self._abandon_read_ahead(ahead, wait, code)
            else:
                self._end_read_ahead(ahead)
        if code == LOST:  # a loss, or another thread's error that the probe counted: the ordinary read tells which
            with self._lock:
                self._check_open()
                self._check_not_lost(action)
            super()._read_into(buffer, offset, out, action)
            return
        if code == MAP_FAILED:
            with self._lock:  # a lost or destroyed device fails the request: that is the error to raise
                self._check_open()
                self._check_not_lost(action)
                self._raise_pending(action)
            raise DeviceError(f"{action}: mapping the read-ahead staging buffer failed (status {wait.status})")
        if code != DONE:
            self._raise_failed_read(code, action)
        if self._reported():
            self._raise_pending(action)

    def _end_read_ahead(self, ahead: _ReadAhead) -> None:
        """A read of ``ahead``'s staging buffer is over (unmapped): free it if the read ahead was dropped meanwhile."""
        with ahead.lock:
            ahead.busy = False
            dropped = ahead.dropped
        if dropped:
            with self._lock:
                self._free_dropped(ahead)

    def _abandon_read_ahead(self, ahead: _ReadAhead, wait: MapWait, code: int) -> None:
        """A read ahead's map or wait returned ``code`` (not DONE), or raised: its staging buffer may still be
        mapping (or mapped), so it is freed and the read ahead dropped."""
        if code not in (MAP_FAILED, NOT_SUBMITTED):
            _ABANDONED_WAITS.append(wait)  # its callback may still fire, into this object
        with self._lock:
            with ahead.lock:
                ahead.busy = False
            self._drop(ahead)
