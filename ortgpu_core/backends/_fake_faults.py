"""Fault injection for the fake backend: out-of-memory on an allocation, device loss or a validation error on a
submit, scheduled by count (``FakeBackend.faults``).

Ownership: one :class:`FakeFaults` per ``FakeBackend``, which creates it with the backend's lock; its schedule
and counters are guarded by that lock (the public methods take it; the devices call ``_next_allocation`` and
``_next_submit`` while holding it).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal

from .._errors import InvalidArgumentError
from ._device_lock import DeviceLock

FaultKind = Literal["out_of_memory_on_allocation", "lose_device_on_submit", "validation_error_on_submit"]


@dataclass(frozen=True)
class InjectedFault:
    """A scheduled fault: it fires on the ``at``-th allocation or submit of the backend (1-based, from its creation),
    or of one thread (``thread``, a ``threading.get_ident()``) when it was scheduled for that thread."""

    kind: FaultKind
    at: int
    message: str
    thread: int | None = None  # only that thread's calls count toward ``at`` and can fire it (None: any thread)


class FakeFaults:
    """Fault injection for one :class:`FakeBackend` (``backend.faults``).

    Counts run over every device of the backend.  An allocation is counted when
    a ``create_buffer`` call passes validation; a submit when ``submit`` is
    called on a device that is not lost.  Each fault fires once; ``n`` is
    1-based and counts from the call that schedules it (``n=1``: the next one).
    ``thread=threading.get_ident()`` counts only that thread's calls (and fires only in
    that thread): for tests of error isolation between threads.
    """

    def __init__(self, lock: DeviceLock) -> None:
        self._lock = lock
        self._scheduled: list[InjectedFault] = []
        self._allocations = 0  # guarded by _lock
        self._submits = 0  # guarded by _lock
        # Guarded by _lock: per-thread counts, kept only for threads that had a fault scheduled for them.
        self._thread_allocations: dict[int, int] = {}
        self._thread_submits: dict[int, int] = {}
        self._defer_zero_fill = False  # guarded by _lock

    def out_of_memory_on_allocation(self, n: int = 1, *, thread: int | None = None) -> None:
        """The ``n``-th future buffer allocation raises :class:`OutOfMemoryError` and allocates nothing."""
        with self._lock:
            self._schedule("out_of_memory_on_allocation", n, "injected out-of-memory", thread)

    def lose_device_on_submit(
        self, n: int = 1, *, reason: str = "injected device loss", thread: int | None = None
    ) -> None:
        """The ``n``-th future submit loses its device: it raises :class:`DeviceLostError`,
        executes nothing, and every later call on that device raises too."""
        with self._lock:
            self._schedule("lose_device_on_submit", n, reason, thread)

    def validation_error_on_submit(
        self, n: int = 1, *, message: str = "injected validation error", thread: int | None = None
    ) -> None:
        """The ``n``-th future submit raises :class:`ValidationError` and executes nothing."""
        with self._lock:
            self._schedule("validation_error_on_submit", n, message, thread)

    def defer_zero_fill(self, enabled: bool = True) -> None:
        """Model onnxruntime's "C3" ordering hazard, for tests that must show they detect it: while enabled, a new
        buffer holds stale bytes (0xCD) and its zero-fill is recorded as a clear that runs at the start of the
        device's *next submit*, whoever submits, instead of at creation.  A caller's upload into the new buffer
        then lands before its clear and is wiped.  (The fake, like WebGPU, otherwise zero-fills at creation,
        before the handle is returned, so no clear can land after a write; this switch removes that rule.)
        Not cleared by :meth:`clear`."""
        with self._lock:
            self._defer_zero_fill = bool(enabled)

    def clear(self) -> None:
        """Cancel every fault that has not fired."""
        with self._lock:
            self._scheduled.clear()

    @property
    def pending(self) -> tuple[InjectedFault, ...]:
        """The faults that have not fired yet, in scheduling order."""
        with self._lock:
            return tuple(self._scheduled)

    def _schedule(self, kind: FaultKind, n: int, message: str, thread: int | None) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidArgumentError(f"n must be a positive integer (1 = the next one), got {n!r}")
        if thread is not None and (isinstance(thread, bool) or not isinstance(thread, int)):
            raise InvalidArgumentError(f"thread must be a threading.get_ident() value or None, got {thread!r}")
        allocation = kind == "out_of_memory_on_allocation"
        if thread is None:
            count = self._allocations if allocation else self._submits
        else:
            counts = self._thread_allocations if allocation else self._thread_submits
            count = counts.setdefault(thread, 0)
        self._scheduled.append(InjectedFault(kind, count + n, message, thread))

    def _take(
        self, kinds: tuple[FaultKind, ...], count: int, counts: dict[int, int], thread: int
    ) -> list[InjectedFault]:
        """The faults of ``kinds`` due now: a backend-wide one at the backend's ``count``, a thread's own one at
        that thread's count (in that thread only)."""

        def due(fault: InjectedFault) -> bool:
            if fault.thread is None:
                return fault.at == count
            return fault.thread == thread and fault.at == counts.get(thread)

        fired = [f for f in self._scheduled if f.kind in kinds and due(f)]
        if fired:
            self._scheduled = [f for f in self._scheduled if f not in fired]
        return fired

    def _next_allocation(self) -> InjectedFault | None:
        self._allocations += 1
        thread = threading.get_ident()
        if thread in self._thread_allocations:
            self._thread_allocations[thread] += 1
        fired = self._take(("out_of_memory_on_allocation",), self._allocations, self._thread_allocations, thread)
        return fired[0] if fired else None

    def _next_submit(self) -> list[InjectedFault]:
        self._submits += 1
        thread = threading.get_ident()
        if thread in self._thread_submits:
            self._thread_submits[thread] += 1
        return self._take(
            ("lose_device_on_submit", "validation_error_on_submit"), self._submits, self._thread_submits, thread
        )
