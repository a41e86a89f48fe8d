"""Fault injection for the fake backend: out-of-memory on an allocation, device loss or a validation error on a
submit, scheduled by count (``FakeBackend.faults``).

Ownership: one :class:`FakeFaults` per ``FakeBackend``, which creates it with the backend's lock; its schedule
and counters are guarded by that lock (the public methods take it; the devices call ``_next_allocation`` and
``_next_submit`` while holding it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .._errors import InvalidArgumentError
from ._device_lock import DeviceLock

FaultKind = Literal["out_of_memory_on_allocation", "lose_device_on_submit", "validation_error_on_submit"]


@dataclass(frozen=True)
class InjectedFault:
    """A scheduled fault: it fires on the ``at``-th allocation or submit of the backend (1-based, from its creation)."""

    kind: FaultKind
    at: int
    message: str


class FakeFaults:
    """Fault injection for one :class:`FakeBackend` (``backend.faults``).

    Counts run over every device of the backend.  An allocation is counted when
    a ``create_buffer`` call passes validation; a submit when ``submit`` is
    called on a device that is not lost.  Each fault fires once; ``n`` is
    1-based and counts from the call that schedules it (``n=1``: the next one).
    """

    def __init__(self, lock: DeviceLock) -> None:
        self._lock = lock
        self._scheduled: list[InjectedFault] = []
        self._allocations = 0  # guarded by _lock
        self._submits = 0  # guarded by _lock

    def out_of_memory_on_allocation(self, n: int = 1) -> None:
        """The ``n``-th future buffer allocation raises :class:`OutOfMemoryError` and allocates nothing."""
        with self._lock:
            self._schedule("out_of_memory_on_allocation", self._allocations, n, "injected out-of-memory")

    def lose_device_on_submit(self, n: int = 1, *, reason: str = "injected device loss") -> None:
        """The ``n``-th future submit loses its device: it raises :class:`DeviceLostError`,
        executes nothing, and every later call on that device raises too."""
        with self._lock:
            self._schedule("lose_device_on_submit", self._submits, n, reason)

    def validation_error_on_submit(self, n: int = 1, *, message: str = "injected validation error") -> None:
        """The ``n``-th future submit raises :class:`ValidationError` and executes nothing."""
        with self._lock:
            self._schedule("validation_error_on_submit", self._submits, n, message)

    def clear(self) -> None:
        """Cancel every fault that has not fired."""
        with self._lock:
            self._scheduled.clear()

    @property
    def pending(self) -> tuple[InjectedFault, ...]:
        """The faults that have not fired yet, in scheduling order."""
        with self._lock:
            return tuple(self._scheduled)

    def _schedule(self, kind: FaultKind, count: int, n: int, message: str) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidArgumentError(f"n must be a positive integer (1 = the next one), got {n!r}")
        self._scheduled.append(InjectedFault(kind, count + n, message))

    def _take(self, kinds: tuple[FaultKind, ...], count: int) -> list[InjectedFault]:
        fired = [f for f in self._scheduled if f.kind in kinds and f.at == count]
        if fired:
            self._scheduled = [f for f in self._scheduled if f not in fired]
        return fired

    def _next_allocation(self) -> InjectedFault | None:
        self._allocations += 1
        fired = self._take(("out_of_memory_on_allocation",), self._allocations)
        return fired[0] if fired else None

    def _next_submit(self) -> list[InjectedFault]:
        self._submits += 1
        return self._take(("lose_device_on_submit", "validation_error_on_submit"), self._submits)
