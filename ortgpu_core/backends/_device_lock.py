"""The lock a backend device holds around its calls, and releases deferred out of re-entrant calls.

Finalizers free native objects: a ``DeviceBuffer`` dying frees its buffer, a session collected without
``close()`` closes itself.  The collector runs finalizers wherever Python allocates, which may be *inside* one of
the device's own calls on the same thread (the device's lock is re-entrant, so the finalizer's call would run
in the middle of the outer one, changing tables the outer call is reading).  A release that arrives that way is
queued instead and done when the outermost call leaves the lock, so device code never sees its state change under
it, and the release still happens before the thread does anything else with the device.

Releases only: a finalizer never creates or submits anything.

The lock also keeps out the submissions the device makes outside it (:mod:`._unlocked_calls`): its outermost
acquisition tells its ``gate``, which waits (without the GIL) for those in progress and holds new ones back until the
lock is released, so nothing done under the lock (a destroy, a test's simulated loss) lands inside one of them.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from types import TracebackType
from typing import Callable, Iterator, Protocol


class _Gate(Protocol):
    def lock_taken(self) -> None: ...
    def lock_released(self) -> None: ...


class DeviceLock:
    """A re-entrant lock that knows how deep the holding thread is, with a queue of deferred releases."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0  # guarded by _lock: nesting of the holding thread
        self._held = 0  # guarded by _lock: the holding thread's acquisitions (never reset by the deferred releases)
        self._deferred: list[Callable[[], object]] = []  # guarded by _lock
        # The native calls made outside the lock that submit or write (``_unlocked_calls.UnlockedCalls``): told when
        # an exclusive section starts and ends (outermost), so that they never interleave with what is done in it.
        self.gate: _Gate | None = None
        self._excluding = 0  # guarded by _lock: nesting of the holder's exclusive sections

    def __enter__(self) -> DeviceLock:
        self._lock.acquire()
        self._held += 1
        if self._held == 1:
            self._exclude()
        self._depth += 1
        return self

    def _exclude(self) -> None:
        self._excluding += 1
        if self._excluding == 1 and self.gate is not None:
            self.gate.lock_taken()

    def _unexclude(self) -> None:
        self._excluding -= 1
        if self._excluding == 0 and self.gate is not None:
            self.gate.lock_released()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[DeviceLock]:
        """Hold the lock and keep out the native calls made outside it (waiting for those in progress): for what
        must never land inside one of them (a buffer's destroy, a test's simulated loss).  Every outermost holding
        of the lock does so today; this names the sections that rely on it."""
        with self:
            self._exclude()
            try:
                yield self
            finally:
                self._unexclude()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._depth == 1 and self._deferred:
                # The outermost call is done: run the queued releases as outermost calls themselves (a release
                # that a finalizer queues meanwhile joins the queue and runs in this loop too).
                self._depth = 0
                try:
                    self._run_deferred()
                finally:
                    self._depth = 1
        finally:
            self._depth -= 1
            self._held -= 1
            if self._held == 0:
                self._unexclude()
            self._lock.release()

    def defer_if_nested(self, release: Callable[[], object]) -> bool:
        """Called by a release method that holds the lock: if the thread was already inside the device when it
        entered (a finalizer run mid-call), queue ``release`` for when the outermost call leaves, and return True;
        else return False and let the caller release now."""
        if self._depth <= 1:
            return False
        self._deferred.append(release)
        return True

    @property
    def deferred(self) -> int:
        """Releases waiting for the outermost call to leave (0 whenever no call is in progress)."""
        return len(self._deferred)

    def _run_deferred(self) -> None:
        while self._deferred:
            release = self._deferred.pop(0)
            try:
                release()
            except Exception as error:  # noqa: BLE001 - the caller's own call succeeded; a finalizer's free did not
                warnings.warn(f"a deferred release failed: {error}", ResourceWarning, stacklevel=3)


class SerializedDevice:
    """A backend device whose every call runs under one lock: what an Env in ``serialized`` execution mode hands
    out in place of the device (``Device._native_device()``), so that no two device operations (allocation,
    writes, submits, reads, waits, pipeline and bind-group creation, releases) ever overlap, whichever thread and
    session make them, and whatever path reaches the device (sessions, captured graphs, the Env-shared allocator,
    transfers).

    The lock is re-entrant (a finalizer's release inside a call of this thread joins that call) and is never taken
    by device code itself, so it only ever nests inside the runner's submission lock, never around it.  Attributes
    that are not methods (``limits``, ``features``, ``lost``...) are read straight from the device.
    """

    def __init__(self, device: object) -> None:
        self._device = device
        self._serial_lock = threading.RLock()

    @property
    def wrapped(self) -> object:
        """The device under the lock (for tests that inspect a backend's own state)."""
        return self._device

    def __getattr__(self, name: str) -> object:
        value = getattr(self._device, name)
        if name.startswith("__") or not callable(value):
            return value
        lock = self._serial_lock

        def serialized(*args: object, **kwargs: object) -> object:
            with lock:
                return value(*args, **kwargs)

        serialized.__name__ = name
        serialized.__doc__ = getattr(value, "__doc__", None)
        return serialized

    def __repr__(self) -> str:
        return f"<serialized {self._device!r}>"
