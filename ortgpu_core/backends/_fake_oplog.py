"""The fake backend's record of device operations, by thread, for concurrency tests (``FakeBackend.operation_log``).

Each outermost call of a fake device (allocation, queue write, submit, read, wait, pipeline and bind-group
creation, release, destroy) can be recorded as a :class:`FakeOperation`: its kind, the calling thread, and when it
started and ended (``time.perf_counter``).  Tests compare the intervals of different threads: ``serialized`` mode
must show none overlapping, ``concurrent`` mode shows overlap once operations take time, which
:meth:`OperationLog.set_latency` adds: a sleep at the start of each operation of a kind, taken *outside* the
backend's lock (as a real device's host-side work or driver wait runs alongside other threads' calls).

Off by default: a disabled log costs one attribute read per call.  The log keeps the last ``capacity`` records
(a ring).  Calls nested in another call of the same thread (``submit_and_read``'s submit, a release a finalizer
makes mid-call) are part of the outer operation and are not recorded apart.

Ownership: one :class:`OperationLog` per ``FakeBackend`` (``backend.operations``); its ring and settings are
guarded by a lock of its own, never held while calling out, so it never waits on the backend's lock.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from dataclasses import dataclass
from typing import ContextManager, Final, Iterator, Literal, Mapping, Sequence

from .._errors import InvalidArgumentError

OperationKind = Literal[
    "allocate", "write", "submit", "read", "wait", "pipeline", "bind_group", "release", "destroy", "validate"
]
#: Every kind of operation the fake device records.
OPERATION_KINDS: Final[tuple[OperationKind, ...]] = (
    "allocate",
    "write",
    "submit",
    "read",
    "wait",
    "pipeline",
    "bind_group",
    "release",
    "destroy",
    "validate",
)
#: Records kept by default (the oldest go first).
DEFAULT_CAPACITY: Final = 10000
_NOTHING: Final = contextlib.nullcontext()


@dataclass(frozen=True)
class FakeOperation:
    """One device operation: ``kind``, the device's ordinal, the calling thread (``threading.get_ident()`` and
    its name), ``start`` and ``end`` (``time.perf_counter()``), and whether it raised."""

    kind: OperationKind
    device: int
    thread: int
    thread_name: str
    start: float
    end: float
    failed: bool

    def overlaps(self, other: FakeOperation) -> bool:
        """Whether the two operations were in progress at the same time."""
        return self.start < other.end and other.start < self.end


def overlapping(operations: Sequence[FakeOperation]) -> list[tuple[FakeOperation, FakeOperation]]:
    """The pairs of operations of *different* threads that overlap in time (sorted by start)."""
    ordered = sorted(operations, key=lambda op: op.start)
    pairs: list[tuple[FakeOperation, FakeOperation]] = []
    active: list[FakeOperation] = []
    for op in ordered:
        active = [other for other in active if other.end > op.start]
        pairs.extend((other, op) for other in active if other.thread != op.thread)
        active.append(op)
    return pairs


class OperationLog:
    """The bounded record of a backend's device operations, and the latency each kind is given."""

    def __init__(self) -> None:
        self._guard = threading.Lock()  # guards the fields below; never held while calling out
        self._enabled = False
        self._ring: collections.deque[FakeOperation] = collections.deque(maxlen=DEFAULT_CAPACITY)
        self._latency: dict[str, float] = {}
        self._local = threading.local()  # per thread: how deep in the device's calls it is

    def enable(self, capacity: int = DEFAULT_CAPACITY) -> None:
        """Start recording (clearing what was recorded), keeping the last ``capacity`` operations."""
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise InvalidArgumentError(f"capacity must be a positive int, got {capacity!r}")
        with self._guard:
            self._ring = collections.deque(maxlen=capacity)
            self._enabled = True

    def disable(self) -> None:
        """Stop recording (what was recorded stays readable)."""
        with self._guard:
            self._enabled = False

    def clear(self) -> None:
        """Forget what was recorded."""
        with self._guard:
            self._ring.clear()

    @property
    def enabled(self) -> bool:
        return self._enabled

    def set_latency(self, latency: Mapping[str, float] | None = None, **by_kind: float) -> None:
        """Make each operation of a kind sleep ``seconds`` first, outside the backend's lock
        (``set_latency(submit=0.002)``); kinds not named keep theirs; 0 removes one (:meth:`clear_latency`: all)."""
        merged = dict(latency or {}, **by_kind)
        for kind, seconds in merged.items():
            if kind not in OPERATION_KINDS:
                raise InvalidArgumentError(f"unknown operation kind {kind!r}: one of {OPERATION_KINDS}")
            if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not 0 <= seconds <= 1:
                raise InvalidArgumentError(f"latency of {kind!r} must be seconds in [0, 1], got {seconds!r}")
        with self._guard:
            for kind, seconds in merged.items():
                if seconds:
                    self._latency[kind] = float(seconds)
                else:
                    self._latency.pop(kind, None)

    def clear_latency(self) -> None:
        """No operation sleeps any more."""
        with self._guard:
            self._latency.clear()

    def records(self) -> list[FakeOperation]:
        """The recorded operations, oldest first."""
        with self._guard:
            return list(self._ring)

    def operation(self, kind: OperationKind, device: int) -> ContextManager[None]:
        """Wrap one device call: sleep its latency and record it, if it is the thread's outermost call.

        While nothing is recorded and no latency is set (the default) this is a shared no-op context."""
        if not self._enabled and not self._latency:
            return _NOTHING
        return self._recorded(kind, device)

    @contextlib.contextmanager
    def _recorded(self, kind: OperationKind, device: int) -> Iterator[None]:
        local = self._local
        depth = getattr(local, "depth", 0)
        if depth:
            local.depth = depth + 1
            try:
                yield
            finally:
                local.depth = depth
            return
        start = time.perf_counter()
        delay = self._latency.get(kind)
        if delay:
            time.sleep(delay)  # outside the backend's lock: another thread's call may proceed meanwhile
        local.depth = 1
        failed = True
        try:
            yield
            failed = False
        finally:
            local.depth = 0
            if self._enabled:
                thread = threading.current_thread()
                record = FakeOperation(
                    kind, device, threading.get_ident(), thread.name, start, time.perf_counter(), failed
                )
                with self._guard:
                    self._ring.append(record)
