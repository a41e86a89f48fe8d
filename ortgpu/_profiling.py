"""Per-session profiling: each session keeps its own record of timed runs, replays and steps, written as a Chrome
trace (``traceEvents``, ``ph: "X"``) that Perfetto and ``chrome://tracing`` open.

Profiling state is per session, never shared (onnxruntime's WebGPU lesson "C4": a device-wide profiler mixes or
loses the events of concurrently profiled sessions): a :class:`SessionProfiler` belongs to one session's runner,
events are appended under its own lock, and writing the trace drains only that record.

**Timing is host timing.**  The backend protocol exposes no GPU timestamp queries (``CommandList`` records
dispatches, copies and clears only), so while profiling is on every planned step is submitted alone and waited
for (``wait_idle``), and its event spans submit-to-completion as the host's clock sees it: it includes the fixed
submit/wait latency, and, where other sessions share the device, any of their work the wait had to cover.  A
profiled run or replay is therefore slower than an unprofiled one (one wait per step instead of none); profiling
off costs one attribute check per run or replay.  The trace's ``otherData.timing`` says ``"host"``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, TypeVar

import numpy as np

from ortgpu_core.backends._commands import CommandList

from ._plan_types import PlannedStep

__all__ = ["SessionProfiler", "ProfilingRecord", "TIMING_NOTE"]

TIMING_NOTE = (
    "host timing: the backend offers no GPU timestamp queries, so each planned step was submitted alone and waited "
    "for; a step's duration is submit-to-completion on the host clock (it includes the fixed submit/wait latency, "
    "and any work of other sessions on the device that the wait covered)"
)

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

    def __init__(self, session_id: int, prefix: str, metadata: Mapping[str, Any]) -> None:
        self.session_id = session_id
        self.prefix = prefix
        self.metadata = dict(metadata)
        self.start_ns = time.perf_counter_ns()
        self.start_wall_ns = time.time_ns()
        self._events: list[dict[str, Any]] = []
        self._threads: dict[int, str] = {}
        self._lock = threading.Lock()

    # -- recording ------------------------------------------------------------------
    def add(self, name: str, cat: str, start_ns: int, end_ns: int, args: Mapping[str, Any] | None = None) -> None:
        """Record one complete event (``ph: "X"``) of the calling thread."""
        thread = threading.current_thread()
        tid = threading.get_native_id()
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
            self._threads.setdefault(tid, thread.name)

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

    # -- output ---------------------------------------------------------------------
    @property
    def event_count(self) -> int:
        with self._lock:
            return len(self._events)

    def trace(self) -> dict[str, Any]:
        """The Chrome trace (a JSON-serializable dict) of everything recorded so far."""
        with self._lock:
            events = list(self._events)
            threads = dict(self._threads)
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
                "timing": "host",
                "timing_note": TIMING_NOTE,
                "start_time_ns": self.start_wall_ns,
            },
        }

    def write(self) -> str:
        """Write the trace to ``<prefix>_<session id>_<timestamp>.json``; returns its absolute path."""
        stamp = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(self.start_wall_ns / 1e9))
        path = os.path.abspath(f"{self.prefix}_{self.session_id}_{stamp}_{self.start_wall_ns % 1_000_000_000:09d}.json")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(self.trace(), handle)
        return path
