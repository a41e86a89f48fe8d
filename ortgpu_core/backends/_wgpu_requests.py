"""What a wgpu device's waits share: the callbacks' record of completed map and work-done requests, by token, with
the poll lock and the waiters' events (:class:`_Requests`), and the staging buffers reads map (:class:`_Staging`).

:mod:`._wgpu_readback` makes the requests and waits for them; this module holds no reference to the device.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from ._device_calls import COMPLETION_MAP, Completions
from ._unlocked_calls import NativeLock
from ._wgpu_ffi import _enum_suffix


class _Requests:
    """What the map and work-done callbacks report, by request token, and how waiters take turns polling.

    Holds no reference to the device.  The callbacks (C, :class:`._device_calls.Completions`) run in whichever
    thread makes the native call that completes a request (a poll, and also another thread's submit, which polls
    too); each queues its result and sets ``fired`` (the C int the spinning poller watches).  :meth:`drain`, run
    by every waiter before it checks its request, records the queued results here and wakes the one thread waiting
    for each request (its event, registered under the token when the request was made): a completion wakes its
    owner only, not every waiter.  A poller that leaves wakes one sleeping waiter, which takes the polling over.
    """

    def __init__(self, work_done_success: int) -> None:
        self.map_results: dict[int, tuple[int, str]] = {}  # token -> (WGPUMapAsyncStatus, message)
        # work done: the newest token whose callback fired (tokens rise and the callbacks fire in submission
        # order), and the failures by token
        self.work_done_token = 0
        self.work_done_failures: dict[int, str] = {}
        self.work_done_success = work_done_success  # WGPUQueueWorkDoneStatus_Success
        # What the C callbacks recorded, not yet applied here; its "fired" int is what the spinning poller watches
        self.completions = Completions()
        self.fired_address = self.completions.fired_address
        self._drain_lock = threading.Lock()
        # held by the one thread polling; C waits take it too (:class:`._unlocked_calls.UnlockedCalls`)
        self.poll_lock = NativeLock()
        self.owners: dict[int, threading.Event] = {}  # token -> the event of the thread waiting for it
        self.sleeping: set[threading.Event] = set()  # events of the waiters sleeping (not polling)
        self._local = threading.local()
        self.closing = False  # the device is being destroyed: waiters stop

    def drain(self) -> None:
        """Apply what the callbacks recorded since the last drain (in the order they fired): record each
        request's result and wake its owner."""
        if not self.completions.pending:
            return
        with self._drain_lock:
            for kind, token, status, message in self.completions.take():
                if kind == COMPLETION_MAP:
                    self.map_results[token] = (status, message)
                else:
                    if status != self.work_done_success:
                        self.work_done_failures[token] = f"{_enum_suffix('WGPUQueueWorkDoneStatus', status)}: {message}"
                    self.work_done_token = max(self.work_done_token, token)
                event = self.owners.pop(token, None)
                if event is not None:
                    event.set()

    def event(self) -> threading.Event:
        """The calling thread's event (one per thread, reused by its waits)."""
        event: threading.Event | None = getattr(self._local, "event", None)
        if event is None:
            event = self._local.event = threading.Event()
        return event

    def own(self, token: int) -> None:
        """The calling thread is about to make request ``token`` and will wait for it."""
        self.owners[token] = self.event()

    def hand_over(self) -> None:
        """The poller leaves: wake one sleeping waiter (it polls next, if its request is not complete)."""
        for event in list(self.sleeping):
            event.set()
            break

    def wake_all(self) -> None:
        for event in list(self.sleeping):
            event.set()


@dataclass
class _Staging:
    """One MAP_READ | COPY_DST buffer of the pool."""

    pointer: Any
    address: int
    size: int
    owner: int  # the thread that used it last
