"""What a wgpu device keeps per frozen command list (a captured graph's): its validation, done once, and the
command buffer encoded ahead for its next submit.

A frozen list is validated on its first submit only; the validation is forgotten when one of the handles it
uses is released or the list dies.  With ``encode_ahead`` on (``WgpuDevice``'s docstring says more), each submit
of a validated frozen list encodes the list's next command buffer right after it, so the next replay only
submits.  That encoding (tens of microseconds for a model's list) runs *outside* the device's lock, so other
threads submit meanwhile: the submit returns an :class:`_AheadJob`, which the caller runs once it has left the
lock (:meth:`_EncodeAhead._encode_ahead`); a release of a handle the job's list names, or of a buffer its read
tail copies from or into, cancels it under the lock, or waits for it if another thread is encoding it
(:meth:`_EncodeAhead._cancel_jobs`), so wgpu-native never encodes with a freed object.  Errors wgpu-native reports
while encoding ahead (none for a validated list on a live device) are dropped with the buffer: the next submit encodes
the list again, under the lock, and raises them to its caller.  Such a command buffer may be released unsubmitted, which wgpu-native 29 frees only when its
"submitted" flag is set first: :mod:`~ortgpu_core.backends._wgpu_unsubmitted` decides whether that write is allowed
(a switch, a version check and a probe), and where it is not ``encode_ahead`` starts off.

Ownership: :class:`_EncodeAhead` is a layer of ``WgpuDevice`` (after ``_DeviceBase``, whose docstring describes
the layers).  It owns ``_validated``, ``_validated_by_handle``, ``_list_staging`` and ``encode_ahead``, read and
changed under the device's lock: a list's weak-reference callback (any thread, maybe during one of the device's
own calls) takes the lock, and defers its work to the end of that call when it fires inside one.  The jobs
encoding ahead (``_jobs``, their ``state`` and ``cancelled``) and what they encoded (``_ahead``,
``_ahead_lists``) are guarded by their own condition, ``_jobs_changed``: an encoding ahead keeps its command buffer
without taking the device's lock (one acquisition less per replay); a submit or a release, which hold the device's
lock, take it too.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

from .._errors import DeviceError, OrtGpuError, ReleasedValueError
from ._commands import CommandList
from ._unlocked_calls import DONE, NOT_SUBMITTED, MapWait, UnlockedCalls
from ._wgpu_device_base import _DeviceBase
from ._wgpu_unsubmitted import probe_submitted_flag, submitted_flag_offset

# What a submission appends to a command list, as a dictionary key: the records of its tail (submit_and_read's
# copies into the staging buffer); () for none.
_TailKey = tuple[tuple[Any, ...], ...]


def _ahead_key(commands: CommandList, tail: CommandList | None) -> tuple[int, _TailKey]:
    """What a command buffer encoded ahead is kept under: the list's id and the records of the tail it ends with."""
    return id(commands), () if tail is None else tuple(tail.records())


class _AheadJob:
    """The encoding of a frozen list's next command buffer, made after its submit *outside* the device's lock
    (:meth:`_EncodeAhead._encode_ahead`).  ``state``: "pending" (made under the lock), "encoding", "done" (its
    command buffer kept or released, under the jobs' lock: only then does it leave the device's ``_jobs``);
    ``cancelled`` once a release took away a handle it names (or a buffer its tail copies from or into)."""

    __slots__ = ("commands", "tail", "key", "state", "cancelled", "thread")

    def __init__(self, commands: CommandList, tail: CommandList | None, key: tuple[int, _TailKey]) -> None:
        self.commands = commands
        self.tail = tail
        self.key = key
        self.state = "pending"
        self.cancelled = False
        self.thread = 0


class _EncodeAhead(_DeviceBase):
    """The validation memo and the encode-ahead cache of frozen command lists (see the module's docstring)."""

    encode_ahead: bool
    _unlocked: UnlockedCalls  # set once the device is open (_Readback._open_unlocked_calls)

    def _init_encode_ahead(self, encode_ahead: bool) -> None:
        """Set this layer's fields: nothing validated or encoded ahead yet; ``encode_ahead`` from the backend."""
        # Frozen command lists (captured graphs) validated once: id -> (weak reference, handles they use).
        # Releasing any of those handles forgets the validation, so the next submit checks again.
        self._validated: dict[int, tuple[weakref.ref[CommandList], frozenset[int]]] = {}
        self._validated_by_handle: dict[int, set[int]] = {}
        # Command buffers encoded ahead for validated frozen lists: (list id, tail key) -> command buffer address.
        # An entry lives only as long as the list's validation: releasing a handle the list uses, the list dying,
        # the staging buffer being replaced (tails copy into it) or the device being destroyed releases it.
        self._ahead: dict[tuple[int, _TailKey], int] = {}
        # The list each of those was encoded for: a list id can be reused once its list died, and a buffer encoded
        # for another list must never be submitted (the releases above should already have dropped it).
        self._ahead_lists: dict[tuple[int, _TailKey], weakref.ref[CommandList]] = {}
        self.encode_ahead = encode_ahead
        # The staging buffer each frozen list's last read tail copied into (submit_and_read): its next read takes
        # the same one when it is free, so the key of the command buffer encoded ahead with that tail matches.
        self._list_staging: dict[int, int] = {}
        # Encodings ahead made outside the device's lock, not finished yet; `_jobs_changed` (its own lock) guards
        # their states and wakes a release waiting for one to finish.
        self._jobs: set[_AheadJob] = set()
        self._jobs_changed = threading.Condition(threading.Lock())

    def _check_submitted_flag(self) -> None:
        """Give the native table the offset of wgpu-native's "submitted" flag, where writing it is allowed
        (:func:`~ortgpu_core.backends._wgpu_unsubmitted.submitted_flag_offset`); where it is not, start with
        ``encode_ahead`` off: each graph released with a command buffer encoded ahead would leak it."""
        self._native_table.submitted_flag_offset = submitted_flag_offset(
            lambda: probe_submitted_flag(self._ffi, self._lib, self._native_table, self._raise_pending)
        )
        if self._native_table.submitted_flag_offset < 0:
            self.encode_ahead = False

    def _forget_validation(self, handle: int) -> None:
        """A handle is being released: forget the lists that use it, and what was encoded ahead (or is being
        encoded) with a tail copying from or into it."""
        for list_id in self._validated_by_handle.pop(handle, ()):
            self._forget_list(list_id)
        if self._ahead or self._jobs:
            self._release_ahead(lambda key: any(r[0] == "copy" and handle in (r[1], r[3]) for r in key[1]))

    def _validated_once(self, commands: CommandList) -> bool:
        entry = self._validated.get(id(commands))
        return entry is not None and entry[0]() is commands

    def _remember_validation(self, commands: CommandList) -> None:
        used: set[int] = set()
        for record in commands.records():
            if record[0] == "dispatch":
                used.update((record[1], record[2]))
                used.update(self._handles[record[2]].buffers)
            elif record[0] == "copy":
                used.update((record[1], record[3]))
            else:
                used.add(record[1])
        list_id = id(commands)
        self._validated[list_id] = (weakref.ref(commands, lambda _: self._list_died(list_id)), frozenset(used))
        for handle in used:
            self._validated_by_handle.setdefault(handle, set()).add(list_id)

    def _validate_for_submit(self, commands: CommandList) -> None:
        """:meth:`validate_commands`, once per frozen list (until a handle it uses is released)."""
        if not (commands.frozen and self._validated_once(commands)):
            self.validate_commands(commands)
            if commands.frozen:
                self._remember_validation(commands)

    def _encode_and_submit(
        self, commands: CommandList, tail: CommandList | None, action: str, defer: bool = False
    ) -> tuple[_AheadJob | None, int]:
        """(Under the lock.)  Submit ``commands`` then ``tail`` as one submission; the errors wgpu-native reports
        are raised (a typed error naming ``action``, or ``DeviceError`` when it could not encode them).  Returns
        the job of encoding ahead (below) and, with ``defer``, the command buffer encoded ahead that the caller
        submits itself once it has left the lock (:meth:`_submit_unlocked`; 0: submitted here).

        A validated frozen list (a captured graph's) is submitted from the command buffer encoded ahead for it
        (and this tail), when there is one; either way, with :attr:`encode_ahead` on, the job of encoding its next
        command buffer is returned, for the caller to run with :meth:`_encode_ahead` once it has left the lock
        (while the GPU works and other threads use the device).  The work and its order are the same as encoding
        now: a command buffer names buffers, and reads their contents when it runs in the queue.
        """
        table = self._native_table
        list_id = id(commands)
        ahead = commands.frozen and self.encode_ahead and list_id in self._validated
        if not ahead and commands.frozen and self._ahead:
            self._release_ahead(lambda key: key[0] == list_id)  # encode_ahead was switched off
        ready = 0
        if ahead:
            key = _ahead_key(commands, tail)
            with self._jobs_changed:  # (an encoding ahead stores into these under that lock alone)
                ready = self._ahead.pop(key, 0)
                owner = self._ahead_lists.pop(key, None)
            if ready and (owner is None or owner() is not commands):  # encoded for a dead list of the same id
                table.release_encoded(ready)
                ready = 0
        if ready:
            self._check_not_lost("submit")  # submitted on a lost device, it would abort the process
            if defer:
                job = _AheadJob(commands, tail, key)
                with self._jobs_changed:
                    self._jobs.add(job)
                return job, ready
            table.submit_encoded(ready)
            submitted = True
        else:
            submitted = (
                commands.encode_submit_native(table)
                if tail is None
                else commands.encode_submit_with_tail_native(table, tail)
            )
        self._raise_pending(action)
        if not submitted:
            raise DeviceError(f"{action}: wgpu-native could not encode the command buffer")
        if not ahead:
            return None, 0
        job = _AheadJob(commands, tail, key)
        with self._jobs_changed:
            self._jobs.add(job)
        return job, 0

    def _job_for_next(self, commands: CommandList, tail: CommandList | None) -> tuple[bool, _AheadJob | None]:
        """(Under the lock.)  For a submit told that ``commands`` comes next (``submit(encode_next=...)``):
        whether the submitted list's own job of encoding ahead gives way to ``commands`` (a frozen list, validated
        now if it was not yet: so a list's first submit, too, finds its command buffer encoded; one that fails
        validation is not hinted, and its own submit raises), and the job of encoding ``commands``' next command
        buffer (with ``tail``) ahead: None when one is already kept or being encoded for it (and this tail).  The
        caller runs that job with :meth:`_encode_ahead` instead of its own, which it cancels."""
        if not (commands.frozen and self.encode_ahead):
            return False, None
        try:
            self._validate_for_submit(commands)
        except OrtGpuError:
            return False, None
        key = _ahead_key(commands, tail)
        with self._jobs_changed:
            if key in self._ahead or any(job.key == key for job in self._jobs):
                return True, None
            job = _AheadJob(commands, tail, key)
            self._jobs.add(job)
        return True, job

    def _submit_unlocked(
        self,
        commands: CommandList,
        tail: CommandList | None,
        ready: int,
        job: _AheadJob | None,
        action: str,
        read: tuple[int, int, MapWait] | None = None,
    ) -> None:
        """(Outside the lock.)  Submit ``ready``, the command buffer encoded ahead for ``commands`` (and ``tail``)
        that :meth:`_encode_and_submit` handed over, without the GIL and without the device's lock
        (:mod:`._unlocked_calls`: the lock and a destroy wait for it), then request the map of ``read`` (staging
        address, size, wait) if given, and raise what wgpu-native reported.  When the liveness probe counted an
        error, ``commands`` is submitted the ordinary way instead, under the lock, after the loss check.  On an
        error the job of encoding ahead is dropped."""
        unlocked = self._unlocked
        try:
            if read is None:
                code = unlocked.submit_encoded(ready, self._sentinel_address)
            else:
                code = unlocked.submit_and_map(ready, read[0], read[1], read[2], self._sentinel_address)
            if code == NOT_SUBMITTED:
                with self._lock:
                    self._check_open()
                    self._check_not_lost(action)
                    table = self._native_table
                    if tail is None:
                        submitted = commands.encode_submit_native(table)
                    else:
                        submitted = commands.encode_submit_with_tail_native(table, tail)
                    if not submitted:
                        self._raise_pending(action)
                        raise DeviceError(f"{action}: wgpu-native could not encode the command buffer")
                    if read is not None:
                        unlocked.request_map(*read)
            elif code != DONE:
                self._check_open()
                raise ReleasedValueError(f"{action}: the device was destroyed while submitting; open a new one")
            self._raise_pending(action)
        except BaseException:
            self._cancel_job(job)
            raise

    def _encode_ahead(self, job: _AheadJob | None) -> None:
        """(Outside the lock.)  Encode ``job``'s command buffer and keep it for the list's next submit, unless a
        release cancelled the job first (the handles it names may be gone): a release waits for a job another
        thread is encoding, and cancels the others, under the device's lock (:meth:`_release_ahead`)."""
        if job is None:
            return
        with self._jobs_changed:
            if job.cancelled:
                self._jobs.discard(job)
                return
            job.state = "encoding"
            job.thread = threading.get_ident()
        encoded = 0
        try:
            encoded = job.commands.encode_native(self._native_table, job.tail)  # C, the GIL released
            # Errors reported while encoding ahead are this thread's (see _ErrorSink) but belong to no call of its:
            # dropped, as the buffer is (encoded == 0), and reported by the next submit, which encodes again.
            if self._sink.reports.pending:
                self._sink.take()
        finally:
            # Kept (or released, if a release cancelled the job meanwhile) under the jobs' lock, not the device's:
            # a release cancels the jobs it selects under that lock before it looks at what is kept, so either it
            # finds this buffer kept and releases it, or this sees the job cancelled.  The next submit of the list
            # takes the buffer under both locks.
            with self._jobs_changed:
                try:
                    if encoded:  # (0: an error wgpu-native reported: the next submit encodes again)
                        if job.cancelled or job.key in self._ahead:
                            self._native_table.release_encoded(encoded)
                        else:
                            self._ahead[job.key] = encoded
                            self._ahead_lists[job.key] = weakref.ref(job.commands)
                finally:
                    job.state = "done"
                    self._jobs.discard(job)
                    self._jobs_changed.notify_all()

    def _cancel_job(self, job: _AheadJob | None) -> None:
        """Drop a job that will not be run (its submit raised)."""
        if job is not None:
            with self._jobs_changed:
                job.cancelled = True
                self._jobs.discard(job)

    def _cancel_jobs(self, which: Callable[[tuple[int, _TailKey]], bool]) -> None:
        """(Under the lock.)  Cancel the encodings ahead that ``which`` selects, and wait for those that another
        thread is encoding now (this thread's own are not encoding while it runs this)."""
        me = threading.get_ident()
        with self._jobs_changed:
            for job in self._jobs:
                if which(job.key):
                    job.cancelled = True
            while any(j.cancelled and j.state == "encoding" and j.thread != me for j in self._jobs):
                self._jobs_changed.wait()

    def _release_ahead(self, which: Callable[[tuple[int, _TailKey]], bool]) -> None:
        """Release the command buffers encoded ahead whose (list id, tail key) ``which`` selects.  Each entry is
        popped before it is released, so a list's weak-reference callback racing this releases nothing twice.
        Encodings ahead in progress that it selects are cancelled first (waited for if another thread runs one)."""
        if self._jobs:
            self._cancel_jobs(which)
        with self._jobs_changed:
            selected = [key for key in self._ahead if which(key)]
            for key in selected:
                self._ahead_lists.pop(key, None)
            released = [self._ahead.pop(key) for key in selected]
        for command_buffer in released:
            if command_buffer:
                self._native_table.release_encoded(command_buffer)

    def _list_died(self, list_id: int) -> None:
        """A validated frozen list was collected (a weak-reference callback: any thread, maybe mid-call)."""
        with self._lock:
            if not self._lock.defer_if_nested(lambda: self._list_died(list_id)):
                self._forget_list(list_id)

    def _forget_list(self, list_id: int) -> None:
        """A validated frozen list died: forget its validation and release what was encoded ahead for it."""
        self._validated.pop(list_id, None)
        self._list_staging.pop(list_id, None)
        if (self._ahead or self._jobs) and self._device is not None:
            self._release_ahead(lambda key: key[0] == list_id)
