"""Per-session profiling: each session keeps its own record of timed runs, replays and steps, written as a Chrome
trace (``traceEvents``, ``ph: "X"``) that Perfetto and ``chrome://tracing`` open.

Profiling state is per session, never shared (onnxruntime's WebGPU lesson "C4": a device-wide profiler mixes or
loses the events of concurrently profiled sessions): a :class:`SessionProfiler` belongs to one session's runner,
events are appended under its own lock, and writing the trace drains only that record.

**GPU timestamps where the device has them** (``timestamps_supported``: WebGPU's ``timestamp-query`` plus
wgpu-native's ``timestamp-query-inside-encoders``; NVIDIA's Vulkan driver and lavapipe have both; the fake backend
models them
with its own clock).  A profiled run or replay is then ONE submission, the same records as the unprofiled one
with timestamps written into a free slot of a small ring (:class:`GpuStepTimer`, one per program, so per session:
its query sets and resolve buffer are given back when the record ends, made again by a later one, and released with
the program).  A run timed per step writes one before each planned step and one after the last into its slot's
query set, and resolves them after its work into the slot's part of the ring's resolve buffer; a run timed whole
(most of them: see the sample below) writes its two into the slot's pair of queries of one query set shared by the
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
(``python -m bench --profile-overhead``; bench/RESULTS.md has the figures).  Events: one per planned step, its
duration the GPU time between
its timestamps (name: its first node; cat: its op types, ``+`` joined; ``args.nodes``, ``args.placement``,
``args.dispatches``), inside one span per run (cat ``"run"``) or replay (cat ``"replay"``) lasting first to last
timestamp (``args.gpu_ns``).  **Placement on the timeline**: the GPU clock is not the host's; GPU times are mapped
onto the session's host clock (``perf_counter_ns``) with one offset per record, the largest (host time just before
a run's submit - that run's first GPU timestamp) seen so far.  So no run is placed before it was submitted, and
runs queued back to back (``replay()`` does not wait) keep the GPU's order without overlapping; a run that started
on the GPU later than its submit shows that gap.  Step durations add up to the span exactly.  The trace's ``otherData.timing`` says ``"gpu-timestamps"``.

**Host timing otherwise**, and for plans with CPU steps (a CPU step is host work between device segments; those
runs are timed on the host, step by step, even on a device with timestamps): every planned step is submitted
alone and waited for (``wait_idle``), and its event spans submit-to-completion as the host's clock sees it: it
includes the fixed submit/wait latency, and, where other sessions share the device, any of their work the wait had
to cover.  Such a profiled run is slower than an unprofiled one (one wait per step).  ``otherData.timing`` says
``"host"`` (with :data:`TIMING_NOTE`), or ``"gpu-timestamps+host"`` when a record holds both kinds; each run or
replay span says which in ``args.timing`` (``"gpu"`` or ``"host"``).

**Per-step detail on a sample** (``detail_every`` = N, the session's ``profile_detail_every``, default
:data:`DEFAULT_DETAIL_EVERY`): the first run or replay of a record and then every Nth are timed per step as above;
the others are timed whole, with two timestamps (before the first step, after the last: the span alone, with
``args.detail`` false, and no step events), or, on the host-timing path, run as unprofiled ones inside a host span
(a replay there: an instant event ``ph: "i"`` at its submit).  Per-step timestamps are not free on the GPU (a
timestamp per step lengthens a replay by a large fraction, more when each timestamp ends the compute pass), so
detail on every replay would cost about half a replay; sampled one in 50, it adds about a point to the mean of a
replay timed whole, where one in 10 adds several (bench/RESULTS.md has the figures).  ``detail_every=1`` times
every run and replay per step.

Profiling off costs one attribute check per run or replay.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import json
import os
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Any, Callable, ContextManager, Iterator, Mapping, Sequence, TypeVar

import numpy as np

from ortgpu_core._errors import ArgumentTypeError, InvalidArgumentError, OrtGpuError
from ortgpu_core.backends._commands import CommandList
from ortgpu_core.backends.protocol import MAX_QUERIES, QUERY_RESOLVE_ALIGNMENT

from ._plan_types import PlannedStep

__all__ = [
    "SessionProfiler",
    "ProfilingRecord",
    "GpuStepTimer",
    "gpu_timing_possible",
    "checked_detail_every",
    "DEFAULT_DETAIL_EVERY",
    "TIMING_NOTE",
    "GPU_NOTE",
]

TIMING_NOTE = (
    "host timing: the device (or a plan with CPU steps) offers no GPU timestamp queries, so each planned step was "
    "submitted alone and waited for; a step's duration is submit-to-completion on the host clock (it includes the "
    "fixed submit/wait latency, and any work of other sessions on the device that the wait covered)"
)
GPU_NOTE = (
    "GPU timestamps: each run or replay was one submission with a timestamp before each planned step and after the "
    "last; a step's duration is the GPU time between its timestamps; GPU times are placed on the host clock with one "
    "offset, the largest (submit time - first timestamp) of any run, so no run starts before its submit"
)

#: Every how many runs and replays one is timed per step (see the module docstring); the first always is.
DEFAULT_DETAIL_EVERY = 50


def checked_detail_every(value: object) -> int:
    """``value`` as a ``detail_every`` (an int >= 1), or a typed error saying what to pass."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(
            f"profile_detail_every must be an int >= 1 (1 times every run per step), got {type(value).__name__}"
        )
    if value < 1:
        raise InvalidArgumentError(
            f"profile_detail_every must be >= 1 (1 times every run and replay per step; N every Nth), got {value}"
        )
    return value


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
    the record's events are asked for (:meth:`SessionProfiler._expand_gpu_runs`)."""

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
_Pending = tuple[int, _GpuRun, "weakref.ref[SessionProfiler]"]

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
        self._last_profiler: weakref.ref[SessionProfiler] | None = None
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
        profiler: SessionProfiler,
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


_Buffer = TypeVar("_Buffer")


class ProfilingRecord:
    """What ``with session.profiling() as record:`` yields: ``record.path`` is the trace file once the block
    ends (None before)."""

    def __init__(self) -> None:
        self.path: str | None = None

    def __repr__(self) -> str:
        return f"<ProfilingRecord path={self.path!r}>"


class SessionProfiler:
    """The profiling record of one session (see the module docstring).

    ``prefix`` names the trace file: ``<prefix>_<session id>_<timestamp>.json`` (a relative prefix is taken
    from the working directory when the trace is written).
    """

    def __init__(
        self, session_id: int, prefix: str, metadata: Mapping[str, Any], detail_every: int = DEFAULT_DETAIL_EVERY
    ) -> None:
        self.session_id = session_id
        self.prefix = prefix
        self.metadata = dict(metadata)
        self.detail_every = detail_every
        self._runs_seen = itertools.count()  # runs and replays offered to take_detail (next() is atomic)
        self._last_seen = -1  # the last number take_detail drew (next_is_detail's guess of the next)
        # The profiled replay's cache while this record lasts, by id() of a graph's ReplayWork (the work itself
        # first: an id is only trusted for the object it was taken from): (work, (event name, event args), its
        # submission reading the outputs ahead)
        self.graph_io: dict[int, tuple[object, tuple[str, dict[str, Any]], Callable[..., None]]] = {}
        self.start_ns = time.perf_counter_ns()
        self.start_wall_ns = time.time_ns()
        self._events: list[dict[str, Any]] = []
        # GPU-timed runs and replays in submission order, raw until events are asked for (_expand_gpu_runs, under
        # _expand_lock, so runs become events, and offsets are taken, in that order)
        self._gpu_runs: list[_GpuRun] = []
        self._expand_lock = threading.Lock()
        self._threads: dict[int, str] = {}
        self._lock = threading.Lock()
        # Which timings the record holds ("gpu", "host"), and the GPU step timers holding runs not read back yet.
        self._timings: set[str] = set()
        self._timers: weakref.WeakSet[GpuStepTimer] = weakref.WeakSet()
        self._timing_errors: list[str] = []
        # Timers of released programs with runs of this record not read back yet: read and freed by drain(), or
        # freed unread when this profiler is collected.
        self._orphans: list[GpuStepTimer] = []
        weakref.finalize(self, _free_timers, self._orphans).atexit = False
        # GPU nanoseconds + this = host perf_counter_ns (see _gpu_offset); None until a GPU-timed run is read.
        self._offset_ns: float | None = None

    # -- recording ------------------------------------------------------------------
    def add(
        self,
        name: str,
        cat: str,
        start_ns: int,
        end_ns: int,
        args: Mapping[str, Any] | None = None,
        *,
        tid: int | None = None,
        thread_name: str | None = None,
    ) -> None:
        """Record one complete event (``ph: "X"``) of the calling thread (or of thread ``tid``)."""
        if tid is None:
            tid = threading.get_native_id()
            thread_name = threading.current_thread().name
        event: dict[str, Any] = {
            "name": name,
            "cat": cat,
            "ph": "X",
            "ts": (start_ns - self.start_ns) / 1000.0,
            "dur": max(end_ns - start_ns, 0) / 1000.0,
            "pid": self.session_id,
            "tid": tid,
        }
        if args:
            event["args"] = dict(args)
        with self._lock:
            self._events.append(event)
            self._threads.setdefault(tid, thread_name or str(tid))

    def take_detail(self) -> bool:
        """Whether the run or replay about to start is timed per step (the first of the record, then every
        ``detail_every``-th); counts it either way."""
        seen = self._last_seen = next(self._runs_seen)
        return seen % self.detail_every == 0

    def next_is_detail(self) -> bool:
        """Whether the next run or replay is expected to be timed per step (a guess, for encoding ahead: another
        thread may draw first)."""
        return (self._last_seen + 1) % self.detail_every == 0

    def mark(self, name: str, cat: str, args: Mapping[str, Any] | None = None) -> None:
        """Record an instant event (``ph: "i"``, thread scope) of the calling thread now: a replay not timed."""
        tid = threading.get_native_id()
        event: dict[str, Any] = {
            "name": name,
            "cat": cat,
            "ph": "i",
            "s": "t",
            "ts": (time.perf_counter_ns() - self.start_ns) / 1000.0,
            "pid": self.session_id,
            "tid": tid,
            "args": {**(args or {}), "detail": False},
        }
        with self._lock:
            self._events.append(event)
            self._threads.setdefault(tid, threading.current_thread().name)

    def _note_timing(self, timing: str) -> None:
        with self._lock:
            self._timings.add(timing)

    def _add_gpu_run(self, run: _GpuRun) -> None:
        with self._lock:
            self._gpu_runs.append(run)

    def _expand_gpu_runs(self) -> None:
        """Turn the GPU-timed runs read back so far into events, in submission order (runs still waiting in a
        slot stay raw; lost ones are dropped).  Each run: its span (``args.timing`` "gpu", ``args.gpu_ns``,
        ``args.detail``) and, timed per step, one event per planned step, placed on the host clock with
        :meth:`_gpu_offset`."""
        with self._expand_lock:
            with self._lock:
                runs, self._gpu_runs = self._gpu_runs, []
            waiting: list[_GpuRun] = []
            for run in runs:
                ticks = run.ticks
                if ticks is None:
                    waiting.append(run)
                elif ticks is not _LOST:
                    self._add_gpu_events(run, ticks)
            if waiting:
                with self._lock:
                    self._gpu_runs[:0] = waiting

    def _add_gpu_events(self, run: _GpuRun, ticks: np.ndarray) -> None:
        info = run.info
        gpu_ns = [float(t) * info.period_ns for t in ticks.astype(np.int64)]
        offset = self._gpu_offset(run.anchor_ns - gpu_ns[0])
        at = [int(round(g + offset)) for g in gpu_ns]
        for i in range(1, len(at)):  # a clock that steps back never makes an event end before it starts
            at[i] = max(at[i], at[i - 1])
        self.add(
            run.name,
            run.cat,
            at[0],
            at[-1],
            {**run.args, "timing": "gpu", "gpu_ns": at[-1] - at[0], "detail": run.detail},
            tid=run.tid,
            thread_name=run.thread_name,
        )
        self._note_timing("gpu")
        for index, step in enumerate(info.steps if run.detail else ()):
            self.add(
                step.name,
                step.op_type,
                at[index],
                at[index + 1],
                {"placement": step.placement, "dispatches": info.dispatches[index], "nodes": list(step.node_names)},
                tid=run.tid,
                thread_name=run.thread_name,
            )

    def _note_timing_error(self, error: BaseException) -> None:
        """A read of timestamps failed (its runs are lost): said in the trace's ``otherData.timing_errors``."""
        with self._lock:
            self._timing_errors.append(f"{type(error).__name__}: {error}")

    def _timed_by(self, timer: GpuStepTimer) -> None:
        with self._lock:
            self._timers.add(timer)

    def drain(self, idle: bool = False) -> None:
        """Read back the timestamps of this record's GPU-timed runs not read yet, and make the events of those read
        (they join the record).  A read that fails (device lost or closed) drops those runs, noted in
        ``otherData.timing_errors``.  With ``idle`` (the record ends), the timers then give back what they hold
        (:meth:`GpuStepTimer.idle`)."""
        with self._lock:
            timers = list(self._timers) + self._orphans
            self._timers = weakref.WeakSet()
            del self._orphans[:]
        for timer in timers:
            try:
                timer.drain()
                if idle:
                    timer.idle()
            except OrtGpuError as error:
                self._note_timing_error(error)
        self._expand_gpu_runs()

    def _gpu_offset(self, candidate: float) -> float:
        """The offset mapping GPU nanoseconds onto this record's host clock, given a run's (host time just before
        its submit - its first GPU timestamp): the largest seen so far, so no run is placed before its submit and
        runs queued back to back keep the GPU's order without overlapping."""
        with self._lock:
            if self._offset_ns is None or candidate > self._offset_ns:
                self._offset_ns = candidate
            return self._offset_ns

    def _adopt(self, timer: GpuStepTimer) -> None:
        with self._lock:
            self._orphans.append(timer)

    @contextmanager
    def span(self, name: str, cat: str, args: Mapping[str, Any] | None = None) -> Iterator[None]:
        """Record the block as one event (recorded even when it raises, with ``args.error``)."""
        start = time.perf_counter_ns()
        try:
            yield
        except BaseException as error:
            self.add(name, cat, start, time.perf_counter_ns(), {**(args or {}), "error": type(error).__name__})
            raise
        self.add(name, cat, start, time.perf_counter_ns(), args)

    def run_timed_on_gpu(
        self,
        timer: GpuStepTimer,
        program: Any,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, Any],
        submit: Callable[..., None],
        name: str,
        cat: str,
        args: Mapping[str, Any],
        detail: bool = True,
    ) -> None:
        """Submit ``program`` once with GPU timestamps (``timer``; per step with ``detail``, else the whole); its
        span (and step) events join this record once the timestamps are read back and events are asked for (see
        :meth:`GpuStepTimer.run`).  A submission that raises is recorded as a host span with ``args.error``."""
        start = time.perf_counter_ns()
        try:
            timer.run(program, inputs, outputs, submit, self, name, cat, args, detail)
        except BaseException as error:
            self.add(
                name, cat, start, time.perf_counter_ns(), {**args, "timing": "host", "error": type(error).__name__}
            )
            raise

    def run_steps(
        self,
        program: Any,
        inputs: Mapping[str, _Buffer],
        outputs: Mapping[str, _Buffer],
        submit: Callable[[CommandList], None],
        wait: Callable[[], None],
        host: dict[str, np.ndarray] | None = None,
    ) -> None:
        """Run ``program`` (a :class:`~ortgpu._executor.DeviceProgram`) step by step, each step's work submitted
        alone and waited for, recording one event per planned step (name: its first node; cat: its op types, ``+``
        joined for a fused step; ``args.nodes``: all its nodes)."""

        def on_step(step: PlannedStep, start_ns: int, end_ns: int, dispatches: int) -> None:
            self.add(
                step.name,
                step.op_type,
                start_ns,
                end_ns,
                {"placement": step.placement, "dispatches": dispatches, "nodes": list(step.node_names)},
            )

        program.run_timed(inputs, outputs, submit, wait, on_step, host)
        self._note_timing("host")

    # -- output ---------------------------------------------------------------------
    @property
    def event_count(self) -> int:
        """Events recorded so far (GPU-timed runs' read back first)."""
        self.drain()
        with self._lock:
            return len(self._events)

    @property
    def timing(self) -> str:
        """``"gpu-timestamps"``, ``"host"``, or ``"gpu-timestamps+host"``: how the runs recorded so far were timed
        (``"host"`` while nothing is recorded)."""
        with self._lock:
            timings = set(self._timings)
        if timings == {"gpu"}:
            return "gpu-timestamps"
        if timings == {"gpu", "host"}:
            return "gpu-timestamps+host"
        return "host"

    def trace(self) -> dict[str, Any]:
        """The Chrome trace (a JSON-serializable dict) of everything recorded so far (GPU-timed runs' timestamps
        are read back first)."""
        self.drain()
        timing = self.timing
        with self._lock:
            events = list(self._events)
            threads = dict(self._threads)
            timing_errors = list(self._timing_errors)
        meta: list[dict[str, Any]] = [
            {
                "name": "process_name",
                "ph": "M",
                "pid": self.session_id,
                "tid": 0,
                "args": {"name": f"ortgpu session {self.session_id} (process {os.getpid()})"},
            }
        ]
        meta += [
            {"name": "thread_name", "ph": "M", "pid": self.session_id, "tid": tid, "args": {"name": name}}
            for tid, name in threads.items()
        ]
        return {
            "traceEvents": meta + events,
            "displayTimeUnit": "ms",
            "otherData": {
                **self.metadata,
                "session_id": self.session_id,
                "process_id": os.getpid(),
                "timing": timing,
                "timing_note": GPU_NOTE
                if timing == "gpu-timestamps"
                else TIMING_NOTE
                if timing == "host"
                else f"{GPU_NOTE}; runs with args.timing 'host': {TIMING_NOTE}",
                **({"timing_errors": timing_errors} if timing_errors else {}),
                "detail_every": self.detail_every,
                "start_time_ns": self.start_wall_ns,
            },
        }

    def finish(self) -> str:
        """The record ends (``end_profiling``): read back every run, let the timers give back their query sets,
        buffers and timed lists, and write the trace; returns its path."""
        self.drain(idle=True)
        return self.write()

    def write(self) -> str:
        """Write the trace to ``<prefix>_<session id>_<timestamp>.json``; returns its absolute path."""
        stamp = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(self.start_wall_ns / 1e9))
        path = os.path.abspath(f"{self.prefix}_{self.session_id}_{stamp}_{self.start_wall_ns % 1_000_000_000:09d}.json")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(self.trace(), handle)
        return path
