"""The GPU step timer: a ring of timestamp slots per program, for the profiled runs and replays of a session
(:mod:`ortgpu._profiling` keeps the record they report to; this module knows the record only as a
:class:`TimedRecord`).

A run timed per step writes one before each planned step and one after the last into its slot's
query set, and resolves them after its work into the slot's part of the ring's resolve buffer; a run timed whole
(most of them: see the sample in :mod:`ortgpu._profiling`) writes its two into the slot's pair of queries of one query set shared by the
ring (the span query set) and resolves nothing: the read of the ring resolves all of those at once (one resolve of
a range of that query set into the buffer after the slots' parts), then copies (a resolve of its own per run cost
a captured mlp16 step measurably more).  Nothing waits for it.  A slot is free, pending (a run's
timestamps written) or being read; the ring has :data:`RING_SLOTS` slots (fewer
for a plan whose slot is large: :data:`RING_BYTES`).  Once three quarters of them are pending, a ``replay()`` (or an
ordinary run) starts a read of them that nobody waits for, right after its own submit (the device's
``read_async``: the resolve of the pending spans and one copy of their part of the resolve buffer to a staging
buffer, the mapping requested); each later
profiled run asks after its submit, without waiting, whether it has completed (``read_async_done``: the map
callback fired in some poll or submit) and finishes it when it has (the ticks copied out), and only then are those
slots free again, so a slot is written again only after its values were copied out and no run gets another's
values.  A run waits for a read (before its submit) only when no slot is free (the GPU more than a quarter of the
ring behind).  A profiled ``replay_and_read()`` is a profiled replay whose outputs are read ahead in its
submission (as ``replay()``'s are), then copied out; writing the trace (``end_profiling``) reads the rest (one
wait) and finishes the reads in flight.  On a device without ``read_async`` (:data:`ASYNC_READS` off models it)
the ring is read when full, with one wait.  That keeps a profiled replay as asynchronous as an unprofiled one
(``replay()`` submits and returns): the ring's reads cost a captured ``replay()`` + ``to_numpy()`` less on
average than one wait per :data:`RING_SLOTS` replays.  A resolve per pending slot makes a read encode and validate
one resolve per slot, and a resolve per run makes every run pay one; one resolve for all the spans keeps the read
short without a resolve per run.  Every query of the span query set is written once when it is made, so a read's
resolve never covers a query no run has written.  The timestamps are kept
raw (ticks) until events are asked for (``trace()``, ``event_count``, the trace written): a profiled run or replay
builds no event on the host meanwhile.
Timed command lists are frozen and cached per slot and per set of bound buffers, so the wgpu backend validates
each once and encodes it ahead, as it does a captured graph's list; runs timed per step take the slots from the
first up (a slot's query set for them is made when the first such run takes it), runs timed whole from the last
down, so the few per-step lists are reused.  Each run picks the slot the next run will take (the next free one of
the kind ``detail_every`` says comes next), records that slot's list if it has none yet, and names it to its submit
(``encode_next``), so the device validates it if need be and encodes its command buffer after this submit, just
before its use, instead of this run's own (used again only a ring's length later); the next run takes that slot
when it is of that kind and still free.  A record's first turn of the ring still records, validates and encodes
each slot's list once, and its first profiled run makes the span query set and the buffer: a start-up paid once
per record (``python -m bench --profile-overhead`` reports it apart).  The run's own record (its event's data) is
made after its submit.  A command buffer encoded a ring's length before its submit takes longer to submit than one
encoded just before, so encoding each slot's list just before its use makes a profiled replay measurably cheaper
(``python -m bench --profile-overhead``; bench/RESULTS.md has the figures).
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import time
import weakref
from typing import Any, Callable, ContextManager, Mapping, Protocol, Sequence

import numpy as np

from ortgpu_core._errors import OrtGpuError
from ortgpu_core.backends._commands import CommandList
from ortgpu_core.backends.protocol import MAX_QUERIES, QUERY_RESOLVE_ALIGNMENT

from ._plan_types import PlannedStep

__all__ = ["GpuStepTimer", "TimedRecord", "gpu_timing_possible", "RING_SLOTS", "RING_BYTES", "MIN_RING_SLOTS"]


class TimedRecord(Protocol):
    """What a timer asks of the profiling record its runs belong to (a :class:`~ortgpu._profiling.SessionProfiler`)."""

    def next_is_detail(self) -> bool:
        """Whether the next run of the record will be timed per step (so the timer encodes that slot's list)."""
        ...

    def _timed_by(self, timer: GpuStepTimer) -> None:
        """``timer`` holds runs of the record (read back when the trace is written)."""
        ...

    def _add_gpu_run(self, run: _GpuRun) -> None:
        """A run submitted with timestamps, raw until the record's events are asked for."""
        ...

    def _note_timing_error(self, error: BaseException) -> None:
        """A read of the ring failed: its runs are lost, the error noted in the trace."""
        ...

    def _adopt(self, timer: GpuStepTimer) -> None:
        """``timer``'s program was released with runs of the record pending: the record reads and frees it when the
        trace is written (or frees it unread when the record is collected)."""
        ...


#: Slots of a program's ring: a profiled run writes its timestamps into a free slot, and pending slots are resolved
#: and read back together by a read nobody waits for (see the module docstring), or when the trace is written.  Each
#: slot has its own frozen timed command list (per kind: per step, or whole), built on its first use; runs timed per
#: step take the free slots from the first up, runs timed whole from the last down, so the few per-step runs between
#: two reads (one in ``detail_every``) reuse the same few slots and lists.  A read costs about the same whatever it
#: covers (one resolve of the spans, one copy), so fewer reads cost less, and using many lists in turn costs
#: nothing since each run names the next list to encode (``encode_next``): a larger ring halves the reads.  64 slots
#: measured cheaper than 32, and 128 no cheaper than 64 (bench/RESULTS.md).
RING_SLOTS = 64

#: A resolve buffer's size at most, for plans whose slot is large (many steps): fewer slots then, never under
#: :data:`MIN_RING_SLOTS`.
RING_BYTES = 1 << 20
MIN_RING_SLOTS = 4

#: Bytes of a span's two resolved timestamps in the resolve buffer (after the slots' parts, slot by slot).
_SPAN_BYTES = 16

#: Whether the ring is read without waiting where the device can (``read_async``; see :class:`GpuStepTimer`):
#: tests and the bench's A/B switch it off to compare.
ASYNC_READS = True

# read(commands, buffer, offset, out): submit ``commands`` and read ``out.nbytes`` of ``buffer`` from ``offset``
# after them, in the same submission (the runner's _read_timestamps)
_Read = Callable[[CommandList, int, int, Any], None]


def _free_timers(timers: list[GpuStepTimer]) -> None:
    """A collected profiler's orphaned timers: freed unread (a finalizer never reads)."""
    for timer in list(timers):
        try:
            timer.free()
        except OrtGpuError:
            pass  # the device is gone, and freed them itself


def gpu_timing_possible(device: Any, plan: Any) -> bool:
    """Whether runs of ``plan`` on ``device`` can be timed with GPU timestamps: the device supports them, and the
    plan runs whole on the device (a plan with CPU steps is timed on the host)."""
    return (
        bool(getattr(device, "timestamps_supported", False))
        and bool(plan.capturable)
        and len(plan.steps) + 1 <= MAX_QUERIES
    )


class _StepInfo:
    """What a timer's runs need to become events (no device resources): the plan's steps, each step's
    dispatches, and the tick length."""

    __slots__ = ("steps", "dispatches", "period_ns")

    def __init__(self, steps: list[PlannedStep], dispatches: list[int], period_ns: float) -> None:
        self.steps = steps
        self.dispatches = dispatches
        self.period_ns = period_ns


#: ``_GpuRun.ticks`` of a run whose timestamps can never be read (its timer was freed, or the read failed).
_LOST = np.zeros(0, dtype=np.uint64)


class _GpuRun:
    """A profiled run or replay submitted with timestamps, kept raw in its profiler's record: ``ticks`` is None
    until its slot is read back (then the resolved timestamps, or :data:`_LOST`); it becomes events only when
    the record's events are asked for (:meth:`ortgpu._profiling.SessionProfiler._expand_gpu_runs`)."""

    __slots__ = ("ticks", "anchor_ns", "name", "cat", "args", "tid", "thread_name", "detail", "info")

    def __init__(
        self,
        anchor_ns: int,
        name: str,
        cat: str,
        args: Mapping[str, Any],
        tid: int,
        thread_name: str,
        detail: bool,
        info: _StepInfo,
    ) -> None:
        self.ticks: np.ndarray | None = None
        self.anchor_ns = anchor_ns
        self.name = name
        self.cat = cat
        self.args = args
        self.tid = tid
        self.thread_name = thread_name
        self.detail = detail  # timestamps before every step (else two: queries 0 and 1, before and after the work)
        self.info = info


# A run waiting in its slot: (slot, the run, its profiler, weakly: a timer a profiler adopted must not keep the
# profiler alive).
_Pending = tuple[int, _GpuRun, "weakref.ref[TimedRecord]"]

#: The device methods of a read nobody waits for (``AsyncReadDevice``); without them the ring is read with one wait.
_ASYNC_METHODS = ("read_async", "read_async_done", "read_async_finish", "read_async_cancel")

_thread_local = threading.local()


def _thread() -> tuple[int, str]:
    """The calling thread's native id and name (the name it had on its first profiled run: a trace names each
    thread once)."""
    try:
        return _thread_local.ident  # type: ignore[no-any-return]
    except AttributeError:
        ident = _thread_local.ident = (threading.get_native_id(), threading.current_thread().name)
        return ident


class _RingRead:
    """A read of some of the ring's slots, started without waiting (``read_async``): the device's ticket, the runs
    it reads, and where their values go (``values`` holds the resolve buffer's bytes from ``start`` on)."""

    __slots__ = ("ticket", "pending", "values", "start")

    def __init__(self, ticket: Any, pending: list[_Pending], values: np.ndarray, start: int) -> None:
        self.ticket = ticket
        self.pending = pending
        self.values = values
        self.start = start


class GpuStepTimer:
    """GPU timestamps of one program's profiled runs and replays (see the module docstring): per slot of its ring
    (``slots``, :data:`RING_SLOTS` at most) a query set of ``len(steps) + 1`` timestamps and a part of one resolve
    buffer (a run timed per step resolves its timestamps there, after its work), a pair of queries of the span query
    set (a run timed whole writes its two there; the read of the ring resolves them into the buffer after the slots'
    parts: ``span_base``), the frozen timed command lists, and the runs whose values are not read yet.  Made by the
    runner for
    a program on first profiled use (``program.timing_resources``), released with it; idle between profiling
    records (:meth:`idle`: no query sets, buffer or lists).  Its own lock serializes its
    runs and reads.

    A slot is free, pending (a run's timestamps are written) or being read (a read started without waiting covers
    it); it is free again only once that read has completed, so a slot is written again only after its previous
    values were copied out, and each run gets its own slot's values.

    ``read(commands, buffer, offset, out)`` submits ``commands`` (the resolve of the pending spans) and reads the
    resolve buffer after them, in one submission (the runner's ``_read_timestamps``: ``submit_and_read``, under its
    submission lock in serialized mode): the reads that wait.  A bound method is held weakly (the timer must not
    keep its runner, or the profilers its runs belong to, alive); the reads that do not wait (the device's
    ``read_async``) are made under the same owner's ``submission()``."""

    def __init__(self, program: Any, device: Any, read: _Read) -> None:
        steps: Sequence[PlannedStep] = program.plan.steps
        self.period_ns = float(getattr(device, "timestamp_period_ns", 1.0))
        self._info = _StepInfo(
            list(steps),
            [
                sum(1 for kernel in step.op_plan.kernels if min(kernel.grid) > 0) if step.op_plan is not None else 0
                for step in steps
            ],
            self.period_ns,
        )
        self.queries = len(steps) + 1
        self.stride = -(-8 * self.queries // QUERY_RESOLVE_ALIGNMENT) * QUERY_RESOLVE_ALIGNMENT
        self.slots = max(MIN_RING_SLOTS, min(RING_SLOTS, RING_BYTES // self.stride))
        # Runs timed whole write queries 2 * slot and 2 * slot + 1 of one query set (``span_query_set``), resolved
        # by the read of the ring (one resolve for all of them), into the resolve buffer after the slots' parts
        self.span_base = self.slots * self.stride
        self.span_bytes = -(-_SPAN_BYTES * self.slots // QUERY_RESOLVE_ALIGNMENT) * QUERY_RESOLVE_ALIGNMENT
        self._device = device
        self._read: Callable[[], _Read | None] = (
            weakref.WeakMethod(read) if hasattr(read, "__self__") else (lambda: read)
        )
        # reads that do not wait: where the device has them (and they are not switched off: ASYNC_READS)
        self._async = ASYNC_READS and all(hasattr(device, name) for name in _ASYNC_METHODS)
        # a read starts once this many runs are pending: the other slots take the runs made while it completes
        self._read_at = self.slots - max(MIN_RING_SLOTS // 2, self.slots // 4)
        self._lock = threading.Lock()
        self._lists: list[tuple[object, CommandList] | None] = [None] * self.slots
        # The buffer maps of the last run and their bind-group token (program.bind_groups_token): a replay passes
        # the same two dicts every time (the runner makes a captured graph's once per profiling record, and never
        # changes them; an ordinary run's staging maps are fixed too), whose buffers they keep alive, so their
        # token is asked for once, not per replay.  Held strongly: a new dict can never take their identity.
        self._io: tuple[Mapping[str, Any], Mapping[str, Any], object] | None = None
        self._last_profiler: weakref.ref[TimedRecord] | None = None
        self._span_lists: list[tuple[object, CommandList] | None] = [None] * self.slots  # detail=False runs
        self._pending: list[_Pending] = []
        self._reading: list[_RingRead] = []  # reads started without waiting, oldest first
        self._free = list(range(self.slots))  # the free slots, ascending
        self._predicted: tuple[bool, int] | None = None  # (detail, slot) the next run is expected to take
        self._released = False  # the program was released (runs may still be pending: see release)
        self._freed = False  # the query set and resolve buffer are freed
        # per slot a query set for a run timed per step (0 until a run timed per step takes the slot: most runs are
        # timed whole, and making 64 query sets up front costs a record's first replays milliseconds) and a
        # part of the resolve buffer, where that run resolves them; with the span query set and the buffer, made by a
        # record's first profiled run, given back when the record ends (idle), made again by the next profiled run
        self.query_sets: list[int] = []
        self.span_query_set = 0
        self.resolve_buffer = 0
        self._allocate_locked()

    def _allocate_locked(self) -> None:
        """Make the query sets and the resolve buffer (nothing is kept when one fails), under the runner's
        ``submission()``.  Every query of the span query set is written once now, so that a read's resolve of a
        range of it never meets a query no run has written yet (WebGPU resolves those as 0, but a Vulkan driver
        asked to wait for an unwritten query may hang)."""
        device = self._device
        resolve_buffer = span_query_set = 0
        try:
            span_query_set = device.create_query_set(2 * self.slots, label="ortgpu profiling timestamps (spans)")
            resolve_buffer = device.create_query_resolve_buffer(
                self.span_base + self.span_bytes, label="ortgpu profiling timestamps (resolved)"
            )
            written = CommandList()
            for index in range(2 * self.slots):
                written.add_timestamp(span_query_set, index)
            device.submit(written)
        except BaseException:
            if resolve_buffer:
                device.destroy_buffer(resolve_buffer)
            if span_query_set:
                device.release_query_set(span_query_set)
            raise
        self.query_sets = [0] * self.slots
        self.span_query_set, self.resolve_buffer = span_query_set, resolve_buffer

    def _slot_query_set_locked(self, slot: int) -> int:
        """``slot``'s query set for runs timed per step (made on its first use, under the runner's
        ``submission()``)."""
        query_set = self.query_sets[slot]
        if not query_set:
            with self._submission():
                query_set = self._device.create_query_set(self.queries, label="ortgpu profiling timestamps")
            self.query_sets[slot] = query_set
        return query_set

    def run(
        self,
        program: Any,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, Any],
        submit: Callable[..., None],
        profiler: TimedRecord,
        name: str,
        cat: str,
        args: Mapping[str, Any],
        detail: bool = True,
    ) -> None:
        """Submit ``program``'s work on these buffers once, timed (per step with ``detail``, else as a whole), and
        note it for ``profiler`` (raw: it becomes events when they are asked for).  Its timestamps go to a free
        slot (per step: the slot's query set, resolved after its work into the slot's part of the resolve buffer;
        whole: the slot's pair of the span query set), and are read back with other pending runs by a read nobody
        waits for, started once three quarters of the ring are pending and finished by a later run when it has
        completed (a run waits for one only when no slot is free), and when the trace is written."""
        with self._lock:
            if self._released:
                raise RuntimeError("this GPU step timer was released with its program")
            if not self.span_query_set:  # idle since a profiling record ended
                with self._submission():
                    self._allocate_locked()
            free = self._free
            if not free:
                try:
                    if self._reading:
                        self._collect_locked()
                    if not free and self._reading:
                        self._finish_locked(self._reading.pop(0))  # the oldest read (it waits, if it has to)
                    elif not free:
                        self._drain_locked()
                except OrtGpuError as error:  # the read's runs are lost (their slots free), noted; this run goes on
                    profiler._note_timing_error(error)
            predicted = self._predicted
            slot = -1
            if predicted is not None and predicted[0] == detail:
                slot = predicted[1]  # the slot whose list was encoded ahead for this run (see below), if still free
                if free[-1] == slot:  # (the usual case for a run timed whole: no search)
                    free.pop()
                elif slot in free:
                    free.remove(slot)
                else:
                    slot = -1
            if slot < 0:
                slot = free.pop(0) if detail else free.pop()
            io = self._io
            if io is not None and io[0] is inputs and io[1] is outputs:
                token = io[2]
            else:
                token = program.bind_groups_token(inputs, outputs)
                self._io = (inputs, outputs, token)
            try:
                commands = self._timed_list_locked(program, inputs, outputs, token, detail, slot)
            except BaseException:
                bisect.insort(free, slot)
                raise
            # The slot (and list) the next run will take, told to the submit so that the device encodes that list's
            # command buffer ahead instead of this one's (used again only a ring's length later): see
            # ``submit(encode_next=...)``.  Taken by the next run if it is of the predicted kind and still free.
            following = None
            self._predicted = None
            if free:
                next_detail = profiler.next_is_detail()
                next_slot = free[0] if next_detail else free[-1]
                self._predicted = (next_detail, next_slot)
                try:  # (recorded now if that slot has none yet: its first use, too, finds it encoded ahead)
                    following = self._timed_list_locked(program, inputs, outputs, token, next_detail, next_slot)
                except OrtGpuError:
                    pass  # recorded again, raising, by the run that takes the slot
            anchor_ns = time.perf_counter_ns()
            try:
                submit(commands, encode_next=following)
            except BaseException:
                bisect.insort(free, slot)  # no slot taken
                raise
            # The run's record is made after its submit (the submit is what the caller waits on first)
            reference = self._last_profiler
            if reference is None or reference() is not profiler:  # tell each profiler once which timers it has
                profiler._timed_by(self)
                reference = self._last_profiler = weakref.ref(profiler)
            tid, thread_name = _thread()
            run = _GpuRun(anchor_ns, name, cat, args, tid, thread_name, detail, self._info)
            pending = self._pending
            pending.append((slot, run, reference))
            profiler._add_gpu_run(run)
            if self._reading:  # reads that completed meanwhile are finished after the submit, not before it
                try:
                    self._collect_locked()
                except OrtGpuError as error:  # this run was submitted: the failed read's runs are lost, noted
                    profiler._note_timing_error(error)
            if self._async and len(pending) >= self._read_at:
                self._start_read_locked()

    def _timed_list_locked(
        self,
        program: Any,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, Any],
        token: object,
        detail: bool,
        slot: int,
    ) -> CommandList:
        """``slot``'s frozen timed list (per step with ``detail``, else whole) on these buffers (bind-group list
        ``token``): the cached one, or recorded now (and cached)."""
        lists = self._lists if detail else self._span_lists
        cached = lists[slot]
        if cached is not None and cached[0] is token:
            return cached[1]
        commands: CommandList
        if detail:
            query_set = self._slot_query_set_locked(slot)
            commands, token = program.record_timed(inputs, outputs, query_set)
            # the run resolves its own timestamps into its slot of the resolve buffer, after its work (one resolve
            # per such run: a read would need one per slot)
            commands.add_resolve(query_set, 0, self.queries, self.resolve_buffer, slot * self.stride)
        else:  # its two timestamps are resolved by the read of the ring, with the other such runs'
            commands, token = program.record_timed(
                inputs, outputs, self.span_query_set, per_step=False, first_query=2 * slot
            )
        commands.freeze()
        lists[slot] = (token, commands)
        return commands

    def drain(self) -> None:
        """Read back every pending run's timestamps (one submission, one wait) into their runs, and
        finish the reads in flight.  A timer released with runs pending (its program was released: a graph
        released, a session closed, while profiling) frees its query sets and buffer once they are read (or the
        read fails)."""
        with self._lock:
            try:
                self._drain_locked()
            finally:
                if self._released:
                    self._cancel_reads_locked()
                    self._free_locked()

    def _drain_locked(self) -> None:
        """Read every pending run (one submission, one wait), then finish the reads in flight (oldest first); the
        first error is raised once every run was read or given up (:data:`_LOST`)."""
        pending, self._pending = self._pending, []
        error: BaseException | None = None
        try:
            if pending:
                read = None if self._freed else self._read()
                if read is not None:  # (else freed, or the runner is gone: nothing can be read any more)
                    commands, start, size = self._read_plan(pending)
                    values = np.zeros(size // 8, np.uint64)
                    read(commands, self.resolve_buffer, start, values.view(np.uint8))
                    self._fill(pending, values, start)
        except BaseException as failure:
            error = failure
        finally:
            self._lost(pending)
        while self._reading:
            try:
                self._finish_locked(self._reading.pop(0))
            except BaseException as failure:
                error = error or failure
        if error is not None:
            raise error

    def _start_read_locked(self) -> None:
        """Start reading every pending run without waiting (``read_async``: one copy of their part of the resolve
        buffer); a start that fails leaves them pending (read by the next read that waits)."""
        pending = self._pending
        commands, start, size = self._read_plan(pending)
        try:
            with self._submission():
                ticket = self._device.read_async(commands, self.resolve_buffer, start, size)
        except OrtGpuError:
            return
        self._pending = []
        self._reading.append(_RingRead(ticket, pending, np.zeros(size // 8, dtype=np.uint64), start))

    def _submission(self) -> ContextManager[object]:
        """What the runner holds around a device operation (``submission()``: the Env's serial lock in serialized
        mode), for the reads made on the device directly; nothing when the runner is gone."""
        submission = getattr(getattr(self._read(), "__self__", None), "submission", None)
        return submission() if submission is not None else contextlib.nullcontext()

    def _collect_locked(self) -> None:
        """Finish the reads in flight that have completed (oldest first; never waits)."""
        reading, done = self._reading, self._device.read_async_done
        while reading and done(reading[0].ticket):
            self._finish_locked(reading.pop(0))

    def _finish_locked(self, ring_read: _RingRead) -> None:
        """Finish ``ring_read`` (waiting for it if it has not completed): its runs get their values (or
        :data:`_LOST`, when it fails), and its slots are free again."""
        try:
            with self._submission():
                self._device.read_async_finish(ring_read.ticket, ring_read.values.view(np.uint8))
            self._fill(ring_read.pending, ring_read.values, ring_read.start)
        finally:
            self._lost(ring_read.pending)

    def _cancel_reads_locked(self) -> None:
        """Drop the reads in flight unfinished (their runs are lost)."""
        reading, self._reading = self._reading, []
        for ring_read in reading:
            try:
                self._device.read_async_cancel(ring_read.ticket)
            except OrtGpuError:
                pass  # the device is gone
            finally:
                self._lost(ring_read.pending)

    def _lost(self, pending: list[_Pending]) -> None:
        """``pending``'s runs are read (or never will be): those without values are lost; their slots are free."""
        for _, run, _ in pending:
            if run.ticks is None:
                run.ticks = _LOST
        self._free.extend(entry[0] for entry in pending)
        self._free.sort()

    def _read_plan(self, pending: list[_Pending]) -> tuple[CommandList, int, int]:
        """How to read ``pending``'s timestamps: the commands to submit before the copy (one resolve of the span
        query set's range holding the runs timed whole, from a slot at a multiple of 16 up: its destination must
        be aligned to 256 bytes), and the byte range of the resolve buffer to copy (from the first per-step run's
        part, or the first span's, to the last span's, or the last per-step run's part)."""
        commands = CommandList()
        spans = [slot for slot, run, _ in pending if not run.detail]
        details = [slot for slot, run, _ in pending if run.detail]
        if spans:
            per_block = QUERY_RESOLVE_ALIGNMENT // _SPAN_BYTES
            low, high = min(spans) // per_block * per_block, max(spans) + 1
            commands.add_resolve(
                self.span_query_set, 2 * low, 2 * (high - low), self.resolve_buffer, self._place(low, False)[0]
            )
        # (every per-step part lies before the spans' area)
        start = self._place(min(details), True)[0] if details else self._place(min(spans), False)[0]
        last = self._place(max(spans), False) if spans else self._place(max(details), True)
        return commands, start, last[0] + 8 * last[1] - start

    def _place(self, slot: int, detail: bool) -> tuple[int, int]:
        """Where a run's resolved timestamps lie in the resolve buffer: (byte offset, how many): a per-step run's in
        its slot's part, a span's after the slots' parts."""
        if detail:
            return slot * self.stride, self.queries
        return self.span_base + _SPAN_BYTES * slot, 2

    def _fill(self, pending: list[_Pending], values: np.ndarray, start: int) -> None:
        """Give each of ``pending`` its ticks from ``values`` (the resolve buffer's bytes from ``start`` on, as
        read back)."""
        for slot, run, _ in pending:
            offset, count = self._place(slot, run.detail)
            at = (offset - start) // 8
            run.ticks = values[at : at + count]  # a view: the read's array is this read's alone

    def release(self) -> None:
        """Called when the program is released: free the query sets and the resolve buffer, or, when runs are
        pending or being read (not read back yet), hand the timer to the profiler of the newest of them, which
        reads them when its trace is written and frees the timer then (or frees it unread when the profiler is
        collected: a release never reads, since it may run in a finalizer).  Idempotent."""
        with self._lock:
            if self._released:
                return
            self._released = True
            self._lists = [None] * self.slots
            self._span_lists = [None] * self.slots
            self._io = None
            newest = self._pending[-1] if self._pending else self._reading[-1].pending[-1] if self._reading else None
            if newest is None:
                self._free_locked()
                return
            adopter = newest[2]()
        if adopter is not None:
            adopter._adopt(self)
        else:
            self.free()

    def free(self) -> None:
        """Free the query sets and the resolve buffer now (pending runs and reads in flight are dropped).
        Idempotent."""
        with self._lock:
            pending, self._pending = self._pending, []
            self._lost(pending)
            self._cancel_reads_locked()
            self._free_locked()

    def idle(self) -> None:
        """A profiling record ended: give back the query sets and the resolve buffer, and drop the timed command
        lists (and with them the command buffers the device encoded ahead for them), unless runs are pending or
        being read (another thread's, still profiling) or the timer was released.  A later profiled run makes
        them again, so a session holds nothing for profiling between records."""
        with self._lock:
            if self._released or self._freed or self._pending or self._reading or not self.span_query_set:
                return
            self._lists = [None] * self.slots
            self._span_lists = [None] * self.slots
            self._io = None
            self._last_profiler = None
            with self._submission():
                self._free_resources_locked()

    def _free_locked(self) -> None:
        if self._freed:
            return
        self._freed = True
        self._free_resources_locked()

    def _free_resources_locked(self) -> None:
        query_sets, self.query_sets = [query_set for query_set in self.query_sets if query_set], []
        if self.span_query_set:
            query_sets.append(self.span_query_set)
            self.span_query_set = 0
        resolve_buffer, self.resolve_buffer = self.resolve_buffer, 0
        try:
            if resolve_buffer:
                self._device.destroy_buffer(resolve_buffer)
        finally:
            for query_set in query_sets:
                self._device.release_query_set(query_set)
