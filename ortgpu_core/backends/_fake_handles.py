"""The fake backend's objects and handles: the records a fake device keeps for its buffers, pipelines, bind groups
and query sets, and the :class:`HandleTable` that numbers handles and remembers them, to name a stale one.

The bottom of the fake backend's modules: it imports nothing of the fake, so the WGSL checks (:mod:`._fake_wgsl`),
the device's parts (:mod:`._fake_device_base`, :mod:`._fake_execution`) and the backend (:mod:`.fake`) all name
these types without importing each other.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np
import numpy.typing as npt

from .protocol import KernelTwin

#: How many freed handles the backend still describes by kind and label when one is used again (older stale
#: handles are still rejected, and named as freed, without their kind and label).
FREED_RECORDS_KEPT: Final = 1024

HandleKind = Literal["buffer", "pipeline", "bind group", "query set"]


@dataclass(frozen=True)
class _DeclaredBinding:
    uniform: bool
    writable: bool


@dataclass(eq=False)
class _Buffer:
    handle: int
    label: str
    size: int
    uniform: bool
    data: npt.NDArray[np.uint8]
    query_resolve: bool = False  # made by create_query_resolve_buffer (QUERY_RESOLVE | COPY_SRC)


@dataclass(eq=False)
class _Pipeline:
    handle: int
    label: str
    twin: KernelTwin
    declared: dict[int, _DeclaredBinding]  # empty when the WGSL declares nothing the fake can read


@dataclass(eq=False)
class _QuerySet:
    handle: int
    label: str
    values: npt.NDArray[np.uint64]  # one timestamp (nanoseconds of the fake's clock) per query


@dataclass(frozen=True)
class _BoundRange:
    binding: int
    buffer: int
    offset: int
    size: int


@dataclass(eq=False)
class _BindGroup:
    handle: int
    pipeline: int
    label: str
    ranges: tuple[_BoundRange, ...]  # in binding order
    aliasing: str | None  # why a dispatch with this group is invalid (writable aliasing), if it is


@dataclass
class _HandleRecord:
    """What the backend remembers of a live or recently freed handle, to name stale ones.

    Names its device (not a reference to it), so records of freed handles keep no device alive."""

    kind: HandleKind
    label: str
    device: int  # the device's ordinal
    device_name: str
    state: Literal["live", "released", "orphaned"]  # orphaned: freed by device.destroy()


def _describe(handle: int, record: _HandleRecord) -> str:
    label = f" ({record.label!r})" if record.label else ""
    return f"{record.kind} {handle}{label}"


class HandleTable:
    """The handles of one fake backend, over all its devices: numbered from 1 and never reused (0 stays the null
    handle), with a record of each live handle and of the last :data:`FREED_RECORDS_KEPT` freed ones.

    Nothing here grows with the number of handles ever given out: a freed handle's record moves to a bounded list
    of recent ones, and an older stale handle is still known as freed because it is below :meth:`next_handle`.

    Locking: the table takes no lock of its own.  Every method is called with the backend's lock held (the one
    :class:`~ortgpu_core.backends._device_lock.DeviceLock` the backend shares with its devices and faults), which
    the devices' public methods already hold when they make, free or check a handle; a lock here would only be
    taken inside that one.
    """

    __slots__ = ("_last", "_live", "_freed")

    def __init__(self) -> None:
        self._last = 0
        self._live: dict[int, _HandleRecord] = {}
        self._freed: collections.OrderedDict[int, _HandleRecord] = collections.OrderedDict()

    def new(self, kind: HandleKind, label: str, device: int, device_name: str) -> int:
        """A fresh handle for an object of ``kind`` on device ``device`` (its ordinal), recorded as live."""
        self._last += 1
        self._live[self._last] = _HandleRecord(kind, label, device, device_name, "live")
        return self._last

    def next_handle(self) -> int:
        """The handle the next object will get (every smaller positive handle was given out)."""
        return self._last + 1

    def live(self, handle: int) -> _HandleRecord:
        """The record of a live handle (``KeyError`` if it is not live)."""
        return self._live[handle]

    def find(self, handle: int) -> _HandleRecord | None:
        """The record of a live or recently freed handle; ``None`` when there is none (never given out, or freed
        too long ago)."""
        return self._live.get(handle) or self._freed.get(handle)

    def retire(self, handle: int, state: Literal["released", "orphaned"]) -> None:
        """Move a freed handle's record to the bounded list of recently freed ones, marked with how it was freed."""
        record = self._live.pop(handle)
        record.state = state
        self._freed[handle] = record
        while len(self._freed) > FREED_RECORDS_KEPT:
            self._freed.popitem(last=False)

    @property
    def live_count(self) -> int:
        """How many handles are live."""
        return len(self._live)

    def __len__(self) -> int:
        """How many records the table keeps: one per live handle, plus up to :data:`FREED_RECORDS_KEPT` freed."""
        return len(self._live) + len(self._freed)
