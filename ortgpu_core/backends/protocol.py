"""The small protocol every device backend implements.

A backend is a handful of methods over *integer handles* (tinygrad's lesson:
caching and policy live above the protocol).  Handles are plain ``int``: for
the wgpu backend they are the native pointers of wgpu-native objects, for the
fake backend keys into its handle table.  Integer handles let the Cython
:class:`~ortgpu_core.backends._commands.CommandList` hold a flat C array of
records that the wgpu backend encodes with the GIL released.

Ordering model (WebGPU's queue timeline, which both backends follow):

* ``write_buffer`` is a queue operation: it takes effect after every command
  list submitted before it and before every command list submitted after it.
* A :class:`CommandList` records copies, clears and dispatches; nothing in it
  is visible until ``submit``.
* ``read_buffer`` waits for all submitted work, then returns the bytes.

GPU timestamps (optional, :class:`TimestampDevice`): where ``timestamps_supported`` is true, a command list may
record ``add_timestamp(query_set, index)`` (the GPU's time once the work recorded before it is done) and
``add_resolve(query_set, first, count, buffer, offset)`` (``count`` uint64 ticks into a buffer made by
``create_query_resolve_buffer``, at an offset that is a multiple of :data:`QUERY_RESOLVE_ALIGNMENT`); ticks times
``timestamp_period_ns`` are nanoseconds.  Query sets are handles counted by ``live_handles`` and freed with the
device.  A bad record (dead or foreign query set, index out of range, a destination without QUERY_RESOLVE usage,
a misaligned or overrunning resolve) raises ``ValidationError`` at submit, and nothing of the list executes.

Reads nobody waits for (optional, :class:`AsyncReadDevice`; both backends have them): ``read_async(commands,
buffer, offset, size)`` submits ``commands`` and a read of the range after them and returns a ticket at once;
``read_async_done(ticket)`` says, without waiting, whether finishing it would not wait; ``read_async_finish(ticket,
out)`` waits if needed and copies the bytes out; ``read_async_cancel(ticket)`` drops it unread.  The profiler
reads its ring of timestamps so; without them it reads with ``submit_and_read`` (one wait).

Errors are raised as the typed exceptions of :mod:`ortgpu_core._errors`
(``ValidationError``, ``OutOfMemoryError``, ``DeviceLostError``) in the
caller's frame.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from .._errors import ValidationError
from ._commands import CommandList

__all__ = [
    "AdapterInfo",
    "DeviceLimits",
    "ForeignTensorInfo",
    "ForeignKind",
    "BindingEntry",
    "KernelTwin",
    "Backend",
    "BackendDevice",
    "CommandList",
    "BUFFER_ALIGNMENT",
    "QUERY_RESOLVE_ALIGNMENT",
    "MAX_QUERIES",
    "TimestampDevice",
    "AsyncReadDevice",
    "host_read_target",
]

#: Sizes and offsets of buffer writes, copies and clears must be multiples of this.
BUFFER_ALIGNMENT = 4
#: Reads of at least this many bytes into a new host array (``to_numpy()``, a run's outputs) use
#: :meth:`BackendDevice.read_buffer_mapped`: the wgpu backend hands over the staging memory it copied them into.
MAPPED_READ_MIN = 8 << 20
#: Offsets of query resolves must be multiples of this (WebGPU).
QUERY_RESOLVE_ALIGNMENT = 256
#: The most queries one query set may hold (WebGPU).
MAX_QUERIES = 4096


def padded(nbytes: int) -> int:
    """``nbytes`` rounded up to :data:`BUFFER_ALIGNMENT` (the device range a read or copy of them covers)."""
    return -(-nbytes // BUFFER_ALIGNMENT) * BUFFER_ALIGNMENT


def check_encode_next(encode_next: object) -> None:
    """``submit``'s ``encode_next`` hint must be a :class:`CommandList` or None (``ValidationError`` otherwise,
    before anything is submitted)."""
    if encode_next is not None and not isinstance(encode_next, CommandList):
        raise ValidationError(f"submit: encode_next must be a CommandList or None, not {type(encode_next).__name__}")


def host_read_target(out: Any, action: str) -> tuple[memoryview, int]:
    """``out`` of a read (``read_buffer_into``, ``submit_and_read``) as a flat byte view, and the device range it
    needs (its size rounded up to :data:`BUFFER_ALIGNMENT`); ``ValidationError`` unless writable and C-contiguous."""
    view = memoryview(out)
    if view.readonly or not view.c_contiguous:
        raise ValidationError(f"{action}: out must be a writable C-contiguous buffer (e.g. a numpy array)")
    return view.cast("B"), padded(view.nbytes)


def mapped_read_range(offset: int, size: int, action: str) -> int:
    """The device range (``size`` rounded up to :data:`BUFFER_ALIGNMENT`) of ``read_buffer_mapped(buffer, offset,
    size)``; ``ValidationError`` unless ``offset`` is a non-negative multiple of 4 and ``size`` an int >= 0."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0 or offset % BUFFER_ALIGNMENT:
        raise ValidationError(
            f"{action}: offset {offset!r} must be a non-negative multiple of {BUFFER_ALIGNMENT} bytes"
        )
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValidationError(f"{action}: size must be an int >= 0, not {size!r}")
    return padded(size)


#: A numpy twin of a compute kernel, run by the fake backend in place of WGSL.
#: It receives one writable ``uint8`` array per binding (the bound range, in
#: binding order) and the dispatch grid, and writes its outputs in place.
KernelTwin = Callable[[Sequence[np.ndarray], tuple[int, int, int]], None]


@dataclass(frozen=True)
class AdapterInfo:
    """What a backend reports about one adapter (a GPU, or a software rasterizer)."""

    index: int
    vendor_id: int
    device_id: int
    name: str
    driver: str
    backend_type: str  # "Vulkan", "OpenGL", "Metal", "D3D12", "Fake", ...
    adapter_type: str  # "DiscreteGPU", "IntegratedGPU", "CPU", "Unknown"


@dataclass(frozen=True)
class DeviceLimits:
    """The device limits ortgpu checks before it allocates or dispatches."""

    max_buffer_size: int
    max_storage_buffer_binding_size: int
    max_uniform_buffer_binding_size: int
    max_storage_buffers_per_shader_stage: int
    max_compute_workgroups_per_dimension: int
    max_compute_invocations_per_workgroup: int
    max_compute_workgroup_size_x: int
    max_compute_workgroup_size_y: int
    max_compute_workgroup_size_z: int
    max_compute_workgroup_storage_size: int
    min_storage_buffer_offset_alignment: int
    min_uniform_buffer_offset_alignment: int


@dataclass(frozen=True)
class ForeignTensorInfo:
    """What a foreign tensor (one of another runtime, not a WebGPU buffer) says about itself, for routing."""

    vendor_id: int
    device_id: int
    device: object  # the device object: two tensors are on one device when these are the same object
    owner: str  # e.g. "a tensor of <FakeForeignDevice 'Fake other GPU'>"
    shape: tuple[int, ...]
    dtype: np.dtype[Any]


@dataclass(frozen=True, eq=False)
class ForeignKind:
    """A kind of tensor ortgpu does not own (another runtime's device memory), with the transfers its own
    runtime performs.  A backend offers its kinds from ``foreign_kinds()``; the core's route table
    (:func:`ortgpu_core.register_foreign_kind`) turns them into routes that call only these functions, so
    foreign memory is never handed to a WebGPU function.

    ``read(t)`` copies ``t`` to a new host array (its runtime's download), ``write(t, array)`` copies a host
    array into ``t``, ``copy(src, dst)`` copies between two tensors of one device.
    """

    kind: str
    owns: Callable[[object], bool]
    info: Callable[[Any], ForeignTensorInfo]
    read: Callable[[Any], np.ndarray[Any, Any]]
    write: Callable[[Any, np.ndarray[Any, Any]], None]
    copy: Callable[[Any, Any], None]


@dataclass(frozen=True)
class BindingEntry:
    """One entry of a bind group (always group 0): ``binding`` -> a range of a buffer."""

    binding: int
    buffer: int
    offset: int
    size: int


@runtime_checkable
class BackendDevice(Protocol):
    """An opened device and its queue."""

    info: AdapterInfo
    limits: DeviceLimits
    features: frozenset[str]  # e.g. {"shader-f16", "timestamp-query"}
    #: The device executes a kernel's numpy twin instead of its WGSL (the fake backend): two kernels with the same
    #: WGSL but different twins are then different pipelines.
    runs_numpy_twins: bool

    # -- buffers ---------------------------------------------------------
    def create_buffer(self, size: int, *, uniform: bool = False, label: str = "") -> int:
        """A zero-filled buffer of ``size`` bytes (multiple of 4).

        Storage buffers are usable as STORAGE | COPY_SRC | COPY_DST; uniform
        buffers as UNIFORM | COPY_DST.  Raises ``OutOfMemoryError`` or
        ``ValidationError`` (size over the device's limits).
        """
        ...

    def destroy_buffer(self, buffer: int) -> None:
        """Free the buffer now.  Idempotent per handle is *not* required: call once."""
        ...

    def write_buffer(self, buffer: int, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Queue write (see the ordering model)."""
        ...

    def read_buffer(self, buffer: int, offset: int, size: int) -> bytes:
        """Wait for submitted work, then copy ``size`` bytes out (synchronous)."""
        ...

    def read_buffer_into(self, buffer: int, offset: int, out: Any) -> None:
        """Like :meth:`read_buffer`, into ``out`` (a writable C-contiguous buffer, e.g. a numpy array, of any
        size): reads ``len(out)`` bytes without an intermediate copy."""
        ...

    def read_buffer_mapped(self, buffer: int, offset: int, size: int) -> Any:
        """Like :meth:`read_buffer`, as a writable buffer object of ``size`` bytes that owns its memory: the wgpu
        backend returns the mapped staging buffer the range was copied into (no host copy; the buffer returns to
        its pool once the object and every view of it are collected), the fake backend a ``bytearray``.  Nothing
        the device does later changes it."""
        ...

    def submit_and_read(self, commands: CommandList, reads: Sequence[tuple[int, int, Any]]) -> None:
        """:meth:`submit`, then :meth:`read_buffer_into` for each ``(buffer, offset, out)``, in one submission
        where the backend can (the wgpu backend appends the output copies to the same command buffer).  Every
        read is checked before anything is submitted."""
        ...

    # -- kernels ---------------------------------------------------------
    def create_compute_pipeline(
        self, wgsl: str, *, entry_point: str = "main", twin: KernelTwin | None = None, label: str = ""
    ) -> int:
        """Compile a compute pipeline with an automatic layout (bind group 0).

        The wgpu backend compiles ``wgsl``; the fake backend runs ``twin`` and
        raises ``ValidationError`` if there is none.
        """
        ...

    def release_pipeline(self, pipeline: int) -> None: ...

    def create_bind_group(self, pipeline: int, entries: Sequence[BindingEntry]) -> int:
        """A bind group for group 0 of ``pipeline``'s layout."""
        ...

    def release_bind_group(self, bind_group: int) -> None: ...

    # -- submission --------------------------------------------------------
    def submit(
        self,
        commands: CommandList,
        read_ahead: Sequence[tuple[int, int, int]] = (),
        encode_next: CommandList | None = None,
    ) -> None:
        """Encode ``commands`` in order and submit them as one command buffer.

        ``read_ahead``: ``(buffer, offset, size)`` ranges that a read may ask for next (a captured graph's
        outputs).  A backend may copy them to the host-visible side in the same submission, so that a following
        ``read_buffer_into`` of such a range submits nothing; reads always return the buffer's contents as of
        the read, whatever was written since.  The ranges are checked as reads are (a bad one raises
        ``ValidationError`` and nothing is submitted).

        ``encode_next``: the frozen list the caller will submit next with the same ``read_ahead`` (a hint; None:
        ``commands`` again).  A backend that encodes a frozen list's next command buffer ahead (the wgpu backend)
        encodes that list's instead of ``commands``', so a caller that submits several lists in turn (the
        profiler's ring) finds each one encoded just before its use.  It changes no result: a list submitted
        without a command buffer encoded ahead is encoded then."""
        ...

    def wait_idle(self) -> None:
        """Block until all submitted work is done."""
        ...

    # -- lifetime ----------------------------------------------------------
    def destroy(self) -> None:
        """Release the device and everything it still owns.  Idempotent."""
        ...

    def live_handles(self) -> int:
        """How many buffers, pipelines and bind groups are alive on this device."""
        ...


@runtime_checkable
class TimestampDevice(Protocol):
    """What a :class:`BackendDevice` offers for GPU timestamps (optional: the profiler checks
    ``getattr(device, "timestamps_supported", False)`` and times on the host otherwise).  The wgpu backend: WebGPU's
    ``timestamp-query`` plus wgpu-native's ``timestamp-query-inside-encoders``; the fake: its spec's
    ``timestamp_queries``."""

    @property
    def timestamps_supported(self) -> bool:
        """Whether command lists may record timestamp writes and resolves on this device."""
        ...

    @property
    def timestamp_period_ns(self) -> float:
        """Nanoseconds per tick of resolved timestamps."""
        ...

    def create_query_set(self, count: int, *, label: str = "") -> int:
        """A timestamp query set of ``count`` (1..4096) queries; ``ValidationError`` without timestamp support."""
        ...

    def release_query_set(self, query_set: int) -> None:
        """Free the query set (allowed on a lost device, harmless after ``destroy()``, as buffer frees)."""
        ...

    def create_query_resolve_buffer(self, size: int, *, label: str = "") -> int:
        """A buffer usable as a resolve destination and read back (QUERY_RESOLVE | COPY_SRC); freed with
        ``destroy_buffer``."""
        ...


@runtime_checkable
class AsyncReadDevice(Protocol):
    """What a :class:`BackendDevice` may offer for reads that nobody waits for (optional: the profiler checks
    ``hasattr(device, "read_async")``).  A ticket is the backend's own object; each is finished or cancelled once."""

    def read_async(self, commands: CommandList, buffer: int, offset: int, size: int) -> Any:
        """Submit ``commands`` and a read of ``size`` bytes of ``buffer`` at ``offset`` after them (one
        submission); return a ticket at once."""
        ...

    def read_async_done(self, ticket: Any) -> bool:
        """Whether finishing ``ticket`` would not wait (its read completed, or the device is lost or destroyed);
        never waits."""
        ...

    def read_async_finish(self, ticket: Any, out: Any) -> None:
        """Wait for ``ticket``'s read if needed and copy its bytes into ``out`` (writable, C-contiguous, at most
        the read's size); raises as a read would (device lost, destroyed)."""
        ...

    def read_async_cancel(self, ticket: Any) -> None:
        """Drop ``ticket`` unread (always allowed)."""
        ...


@runtime_checkable
class Backend(Protocol):
    """A source of adapters and devices."""

    name: str  # "wgpu" or "fake"

    def enumerate_adapters(self) -> list[AdapterInfo]: ...

    def open_device(self, adapter_index: int) -> BackendDevice: ...

    def live_handles(self) -> int:
        """Live native objects over every device this backend opened."""
        ...
