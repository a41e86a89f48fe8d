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
the program).  Its mechanics (slots, the span query set, reads nobody waits for, lists
encoded just before use) are described in :mod:`ortgpu._gpu_step_timer`.  Events: one per planned step, its
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

import itertools
import json
import os
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, TypeVar

import numpy as np

from ortgpu_core._errors import ArgumentTypeError, InvalidArgumentError, OrtGpuError
from ortgpu_core.backends._commands import CommandList

from ._gpu_step_timer import (
    _LOST,
    RING_SLOTS,
    GpuStepTimer,
    _free_timers,
    _GpuRun,
    gpu_timing_possible,
)
from ._plan_types import PlannedStep

__all__ = [
    "SessionProfiler",
    "ProfilingRecord",
    "GpuStepTimer",
    "RING_SLOTS",
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
