"""What every part of a :class:`~ortgpu_core.backends.wgpu_native.WgpuDevice` shares: its native pointers and
lock, the error sink, the handle table, and the checks made around each native call.

wgpu-native dereferences whatever pointer it is given, and some of its errors abort the process (Rust panics),
so cheap checks (handle liveness, sizes, alignment, limits) are made here, in Python, before a call.  Errors
wgpu-native reports go to the device's uncaptured-error callback, which wgpu-native 29 calls synchronously inside
the failing call; the callback (C, no GIL: :class:`._device_calls.ErrorReports`) records each with the thread
that made the call, and :meth:`_DeviceBase._raise_pending` raises the calling thread's own as typed exceptions in
its frame once the call returns: an error reaches only the caller that caused it, whatever other threads do.
Neither callback runs Python, so no native call ever waits for the GIL (a thread inside wgpu-native, holding its
locks, never waits on a thread that holds the GIL and waits for those locks).

The device is built in layers, each a class that owns some of its fields and sets them in its ``_init_*``
method: :class:`_DeviceBase` (here), then ``_EncodeAhead`` (:mod:`._wgpu_encode_ahead`), ``_StagingPool``
(:mod:`._wgpu_staging_pool`), ``_Readback`` (:mod:`._wgpu_readback`), and ``WgpuDevice`` itself (:mod:`.wgpu_native`: set-up, buffers, kernels, submit,
lifetime).  :class:`_DeviceBase` owns ``_ffi``/``_lib``, the ``_device`` and ``_queue`` pointers, ``_lock``,
``_handles``, ``_sink`` and the error and device-lost callbacks.  Every field of every layer is read and changed
under the device's lock (``_lock``, a :class:`DeviceLock` taken by :func:`_serialized`), except what
``_Readback`` keeps for waits made outside the lock (its docstring says which); the native callbacks write
``_sink``'s C record (its own lock) from inside whichever native call reports (the device-lost callback may also
fire on its own, or in an unlocked poll).
"""

from __future__ import annotations

import functools
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from .._errors import DeviceError, DeviceLostError, OutOfMemoryError, ReleasedValueError, ValidationError
from ._commands import HANDLE_ADDRESS_MASK, CommandList, NativeTable
from ._device_calls import DEVICE_LOST_CALLBACK, UNCAPTURED_ERROR_CALLBACK, ErrorReports, queue_write
from ._device_lock import DeviceLock
from ._wgpu_ffi import _address, _enum_suffix, _string_view, load_native
from .protocol import BUFFER_ALIGNMENT, AdapterInfo, DeviceLimits

# How wgpu-core words the errors of a call on a lost device ("Parent device is lost").
_LOST_MESSAGE = re.compile(r"device is lost", re.IGNORECASE)


class _ErrorSink:
    """What the device's native callbacks report (:class:`._device_calls.ErrorReports`: C callbacks, no GIL),
    read by the thread whose call caused it.

    Holds no reference to the device.  ``lost`` is the loss the device-lost callback reported, or one found
    another way (an error saying the device is lost: wgpu-native 29 does not call the callback for every loss).
    """

    def __init__(self) -> None:
        self.reports = ErrorReports()
        self._lost: str | None = None

    @property
    def lost(self) -> str | None:
        if self._lost is None:
            reported = self.reports.lost
            if reported is not None:
                self._lost = f"{_enum_suffix('WGPUDeviceLostReason', reported[0])}: {reported[1]}"
        return self._lost

    @lost.setter
    def lost(self, value: str | None) -> None:
        self._lost = value

    @property
    def ignore_lost(self) -> bool:
        return self.reports.ignore_lost

    @ignore_lost.setter
    def ignore_lost(self, value: bool) -> None:
        self.reports.ignore_lost = value

    def take(self) -> list[tuple[str, str]]:
        """The calling thread's errors since its last take: (error type suffix, message)."""
        return [(_enum_suffix("WGPUErrorType", kind), text) for kind, text in self.reports.take(threading.get_ident())]

    def clear(self) -> None:
        self.reports.clear()


@dataclass
class _Handle:
    """Bookkeeping for one native object this device created."""

    kind: str  # "buffer", "pipeline", "bind_group"
    pointer: Any  # the typed cdata pointer
    size: int = 0  # buffers: bytes
    uniform: bool = False
    label: str = ""
    buffers: tuple[int, ...] = field(default_factory=tuple)  # bind groups: the buffers bound
    pipeline: int = 0  # bind groups: the pipeline whose layout they were made for
    # pipelines: bindings of group 0 declared var<storage, read> / var<storage, read_write>
    read_only_bindings: frozenset[int] = frozenset()
    writable_bindings: frozenset[int] = frozenset()
    # buffers: reads whose C part (outside the lock) may still use it; a release meanwhile leaves the handle table
    # at once, and frees the buffer when the last of them ends (``doomed``)
    busy: int = 0
    doomed: bool = False


_STORAGE_DECLARATION = re.compile(r"((?:@\w+\s*\([^)]*\)\s*)+)var\s*<\s*storage\s*(?:,\s*(\w+)\s*)?>")
_ATTRIBUTE = re.compile(r"@(group|binding)\s*\(\s*(\d+)\s*\)")


def _storage_bindings(wgsl: str) -> tuple[frozenset[int], frozenset[int]]:
    """The group-0 bindings ``wgsl`` declares as read-only and as writable storage buffers."""
    read_only: set[int] = set()
    writable: set[int] = set()
    for match in _STORAGE_DECLARATION.finditer(wgsl):
        attributes = {name: int(value) for name, value in _ATTRIBUTE.findall(match.group(1))}
        if attributes.get("group") != 0 or "binding" not in attributes:
            continue
        (writable if match.group(2) == "read_write" else read_only).add(attributes["binding"])
    return frozenset(read_only), frozenset(writable)


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _serialized(method: _Method) -> _Method:
    """Run a device method under the device's lock.

    wgpu-native reports errors through one callback per device; holding the
    lock from the call until its errors are checked attributes each error to
    the call (and thread) that caused it.  Encoding itself runs with the GIL
    released, so other Python threads still run meanwhile.
    """

    @functools.wraps(method)
    def locked(self: "_DeviceBase", *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked  # type: ignore[return-value]


class _DeviceBase:
    """The device's native pointers, lock, error sink and handle table, and the checks on them (see the module's
    docstring for the layers and the lock)."""

    info: AdapterInfo
    limits: DeviceLimits
    _native_table: NativeTable  # set by WgpuDevice once the device is open

    def _init_base(self) -> None:
        """Set this layer's fields: no device yet, an empty handle table, and the error sink and its callbacks."""
        ffi, lib = load_native()
        self._ffi = ffi
        self._lib = lib
        self._device: Any = None
        self._queue: Any = None
        self._queue_address = 0  # the queue pointer's value (set with it), for the calls made from C
        self._lock = DeviceLock()  # see _serialized; releases from finalizers mid-call are deferred
        self._handles: dict[int, _Handle] = {}
        self._doomed: list[_Handle] = []  # buffers released while a read used them (see _Handle.busy)
        self._generation = 0  # of the last handle made (see _new_handle)
        self._sentinel: Any = None  # a small COPY_DST buffer for _check_not_lost (made on first use)
        self._sentinel_address = 0
        self._queue_write_address = _address(ffi.addressof(lib, "wgpuQueueWriteBuffer"))
        self._sink = _ErrorSink()
        # The callbacks are C (:class:`._device_calls.ErrorReports`): no native call ever needs the GIL.  The
        # count of every error reported: the command list's C loop reads it to avoid submitting a command buffer
        # that Finish reported invalid.
        self._error_count_address = self._sink.reports.error_count_address
        self._on_uncaptured_error = ffi.cast("WGPUUncapturedErrorCallback", UNCAPTURED_ERROR_CALLBACK)
        self._on_device_lost = ffi.cast("WGPUDeviceLostCallback", DEVICE_LOST_CALLBACK)
        self._callback_userdata = ffi.cast("void *", self._sink.reports.address)

    # -- errors -------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._device is None:
            raise ReleasedValueError(
                f"the wgpu device on adapter {self.info.index} ({self.info.name}) was destroyed (closed with its Env); "
                f"open a new one"
            )
        if self._sink.lost is not None:
            raise DeviceLostError(
                f"the wgpu device on adapter {self.info.index} ({self.info.name}) was lost ({self._sink.lost}); "
                "every value on it is gone: recreate the Env"
            )

    def _raise_pending_unless_lost(self, action: str) -> None:
        """For frees: errors they caused are raised, but a device loss is not theirs to report."""
        if self._sink.lost is None:
            self._raise_pending(action)
        else:
            self._sink.take()

    def _reported(self) -> bool:
        """Whether the callbacks reported anything not taken yet (an error of any thread, or a loss): when not,
        :meth:`_raise_pending` has nothing to raise, and a hot path need not even name its action."""
        sink = self._sink
        return bool(sink.reports.pending) or sink.lost is not None

    def _raise_pending(self, action: str) -> None:
        """Raise what the callbacks collected during ``action`` as a typed exception."""
        if not self._reported():
            return
        sink = self._sink
        errors = sink.take()
        if errors:
            kinds = [kind for kind, _ in errors]
            message = f"{action}: " + "\n".join(text for _, text in errors)
            if any(_LOST_MESSAGE.search(text) for _, text in errors):
                # wgpu-native 29 does not call the device-lost callback for every
                # loss (not for wgpuDeviceDestroy); its errors say so instead.
                sink.lost = message
                self._check_open()
            if "OutOfMemory" in kinds:
                raise OutOfMemoryError(message)
            if "Validation" in kinds:
                raise ValidationError(message)
            raise DeviceError(f"{message} (wgpu error type {', '.join(kinds)})")
        if sink.lost is not None:
            self._check_open()

    def _check_not_lost(self, action: str) -> None:
        """(Under the lock.)  Raise ``DeviceLostError`` if the device was lost, before a call that wgpu-native 29
        would turn into a process abort on a lost device: reading a mapping (it completes a map on a destroyed
        device as a success, then aborts in wgpuBufferGetConstMappedRange) and submitting a command buffer encoded
        before the loss (wgpuQueueSubmit treats its error as fatal).  It calls no device-lost callback for such a
        loss; an empty write to a small buffer of the device's own reports "device is lost" through the error sink
        instead (about a microsecond)."""
        if self._sentinel is None:
            self._sentinel = self._native_buffer(
                BUFFER_ALIGNMENT, self._lib.WGPUBufferUsage_CopyDst, "ortgpu liveness probe", action
            )
            self._sentinel_address = _address(self._sentinel)
        # wgpuQueueWriteBuffer(queue, sentinel, 0, NULL, 0), keeping the GIL (under the lock: see _device_calls)
        queue_write(self._queue_write_address, self._queue_address, self._sentinel_address, 0, 0, 0)
        self._raise_pending(action)

    def _new_handle(self, pointer: Any) -> int:
        """(Under the lock.)  The handle of a native object just made: its address, with a generation (1 to 65535,
        counting up per handle made) in the 16 bits above the 48 address bits.  wgpu-native reuses the address
        of a freed object for the next one, so a bare address would let a handle held past its release (by
        another thread, say) name the new object and pass every liveness check: reads from a released buffer
        returned the contents of the buffer made after it at the same address (found on a discrete GPU by a
        race between threads).  With the generation, a stale handle matches a live one only if the
        same address comes back exactly a multiple of 65535 handles later.  The command loop masks the
        generation off (``_commands.HANDLE_ADDRESS_MASK``)."""
        address = _address(pointer)
        if address & ~HANDLE_ADDRESS_MASK:
            raise DeviceError(
                f"wgpu-native returned an address above 48 bits ({address:#x}); this platform is not supported"
            )
        self._generation = self._generation % 0xFFFF + 1
        return (self._generation << 48) | address

    def _lookup(self, handle: int, kind: str, action: str) -> _Handle:
        record = self._handles.get(handle)
        if record is None or record.kind != kind:
            what = "was released or never existed" if record is None else f"is a {record.kind}"
            raise ValidationError(f"{action}: handle {handle:#x} is not a live {kind} of this device (it {what})")
        return record

    @staticmethod
    def _check_aligned(action: str, **values: int) -> None:
        for name, value in values.items():
            if value < 0 or value % BUFFER_ALIGNMENT:
                raise ValidationError(
                    f"{action}: {name} {value} must be a non-negative multiple of {BUFFER_ALIGNMENT} bytes"
                )

    def _native_buffer(self, size: int, usage: int, label: str, action: str, mapped: bool = False) -> Any:
        """A new buffer (``mapped``: mapped at creation, for writing) that is none of the handles."""
        ffi, lib = self._ffi, self._lib
        keep: list[Any] = []
        descriptor = ffi.new("WGPUBufferDescriptor *")
        descriptor.label = _string_view(label, keep)
        descriptor.usage = usage
        descriptor.size = size
        descriptor.mappedAtCreation = 1 if mapped else 0
        # WGPUBuffer wgpuDeviceCreateBuffer(WGPUDevice device, WGPUBufferDescriptor const * descriptor)
        pointer = self._created(lib.wgpuDeviceCreateBuffer(self._device, descriptor), lib.wgpuBufferRelease, action)
        if pointer == ffi.NULL:
            raise OutOfMemoryError(f"{action}: wgpu-native returned no buffer")
        return pointer

    def _created(self, pointer: Any, release: Callable[[Any], None], action: str) -> Any:
        """``pointer`` of an object a native call just created, once the call reported no error; on an error the
        object (if any) is released and the error raised."""
        try:
            self._raise_pending(action)
        except DeviceError:
            if pointer != self._ffi.NULL:
                release(pointer)
            raise
        return pointer

    def _unbusy(self, record: _Handle) -> None:
        """(Under the lock.)  A read of ``record``'s buffer ended: free it now if it was released meanwhile."""
        record.busy -= 1
        if record.busy == 0 and record.doomed:
            self._doomed.remove(record)
            if self._device is not None:
                self._free_buffer(record.pointer)

    def _free_buffer(self, pointer: Any) -> None:
        """(Under the lock.)  Destroy and release a buffer, keeping out the submissions and writes made outside the
        lock meanwhile (wgpu-native 29 aborts the process on a submission naming a destroyed buffer)."""
        with self._lock.exclusive():
            # void wgpuBufferDestroy(WGPUBuffer buffer); void wgpuBufferRelease(WGPUBuffer buffer)
            self._lib.wgpuBufferDestroy(pointer)
            self._lib.wgpuBufferRelease(pointer)

    def validate_commands(self, commands: CommandList) -> None:
        """Reject, in Python, records whose handles are not live here, or whose sizes break the limits.

        A dangling handle reaching wgpu-native would be a use-after-free, and
        wgpu-native 29 aborts the process when a command buffer with a
        validation error is submitted (``wgpuQueueSubmit`` treats errors as
        fatal).  The C loop also refuses to submit when the device's error
        counter moved during encoding, so anything these checks miss becomes
        a ``ValidationError`` too; these checks give the better message.  The
        replay code validates once at capture; :meth:`submit` every time.
        """
        max_groups = self.limits.max_compute_workgroups_per_dimension
        for index, record in enumerate(commands.records()):
            where = f"submit, command {index} ({record[0]})"
            if record[0] == "dispatch":
                _, pipeline, bind_group, grid = record
                self._lookup(pipeline, "pipeline", where)
                group = self._lookup(bind_group, "bind_group", where)
                if group.pipeline != pipeline:
                    raise ValidationError(
                        f"{where}: bind group {bind_group:#x} was made for pipeline {group.pipeline:#x}, not "
                        f"{pipeline:#x} (automatic layouts belong to one pipeline)"
                    )
                for buffer in group.buffers:
                    self._lookup(buffer, "buffer", f"{where}, a buffer of bind group {bind_group:#x}")
                if max(grid) > max_groups or min(grid) < 0:
                    raise ValidationError(
                        f"{where}: grid {grid} has more than the device's {max_groups} workgroups per dimension; "
                        "use a 2-D or 3-D grid"
                    )
            elif record[0] == "copy":
                _, source, source_offset, destination, destination_offset, size = record
                source_record = self._lookup(source, "buffer", where)
                destination_record = self._lookup(destination, "buffer", where)
                self._check_aligned(
                    where, source_offset=source_offset, destination_offset=destination_offset, size=size
                )
                if source_record.uniform:
                    raise ValidationError(f"{where}: the source is a uniform buffer (no COPY_SRC usage)")
                if source_offset + size > source_record.size or destination_offset + size > destination_record.size:
                    raise ValidationError(f"{where}: the copy of {size} bytes runs past the end of a buffer")
                if source == destination:
                    raise ValidationError(f"{where}: source and destination are the same buffer")
            elif record[0] == "clear":
                _, buffer, offset, size = record
                buffer_record = self._lookup(buffer, "buffer", where)
                self._check_aligned(where, offset=offset, size=size)
                if offset + size > buffer_record.size:
                    raise ValidationError(f"{where}: the clear of {size} bytes runs past the end of the buffer")
            else:  # timestamp and resolve records: the timestamp layer checks them and passes the rest here
                raise ValidationError(f"{where}: this device cannot check {record[0]} records here")
