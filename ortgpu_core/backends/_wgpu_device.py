"""The wgpu device: an open wgpu-native device and its queue, made by :class:`~.wgpu_native.WgpuBackend`.

:class:`WgpuDevice` adds the device's set-up, buffers, kernels, submit and lifetime to its parts (see its
docstring); :mod:`.wgpu_native` has the backend (instance and adapters) and what holds for every native call.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, NoReturn, Protocol, Sequence

from .._errors import ValidationError
from ._commands import CommandList, NativeTable
from ._wgpu_adapters import device_features, device_limits, request_device
from ._wgpu_device_base import _Handle, _serialized, _storage_bindings
from ._wgpu_encode_ahead import _AheadJob
from ._wgpu_ffi import _address, _string_view
from ._wgpu_staged_writes import _StagedWrites, stages
from .protocol import BUFFER_ALIGNMENT, AdapterInfo, BindingEntry, DeviceLimits, KernelTwin, check_encode_next

__all__ = ["WgpuDevice", "DeviceOpener"]


def _warn_in_destructor(message: str) -> None:
    """A ResourceWarning from a destructor; silent only at interpreter exit, when warnings can no longer be made."""
    try:
        warnings.warn(message, ResourceWarning, stacklevel=3)
    except Exception:  # noqa: BLE001 - interpreter exit
        pass


class DeviceOpener(Protocol):
    """What a device takes from the backend that opens it (``WgpuBackend``): its settings, and the instance's event
    processing (which the device's waits drive).  The device holds the backend, so the instance outlives it."""

    encode_ahead: bool
    spin_wait_us: float | None

    def _process_events(self) -> None: ...


class WgpuDevice(_StagedWrites):
    """An open wgpu-native device and its queue (implements ``BackendDevice``).

    Made only by :meth:`WgpuBackend.open_device`.

    ``encode_ahead`` (from the backend; may be switched per device): submitting a captured graph's frozen command
    list encodes its *next* command buffer right after the submit, while the GPU works, so the next replay only
    submits: wgpu-native's ``wgpuCommandEncoderFinish`` (most of the host cost per dispatch) leaves the replay's
    critical path.  One command buffer per graph (and per set of output reads) is held between replays; it is
    released with the graph, with any handle it uses, when the staging buffer it copies into is replaced, and by
    :meth:`destroy`; :meth:`live_handles` counts it.  Released unsubmitted, wgpu-native 29 would never free it
    (about 90 KB of host memory each on lavapipe): the release first sets the flag wgpu-native's submit sets
    (``NativeTable.submitted_flag_offset``, probed once per process), so it is freed like a submitted one.  Where
    the probe does not recognise wgpu-native's command buffers, ``encode_ahead`` starts off on the device.

    Built in layers, each owning some of the fields (their modules' docstrings say which, and that the device's
    lock guards them): ``_DeviceBase`` (lock, error sink, handle table, checks), ``_EncodeAhead`` (frozen lists'
    validation and command buffers encoded ahead), ``_Readback`` (staging buffer, reads, waits), ``_ReadAheads``,
    ``_Timestamps`` (query sets, query-resolve buffers, checks on timestamp records), ``_StagedWrites`` (large uploads through
    staging buffers kept mapped), and this class:
    set-up, buffers, kernels, submit and lifetime.  The destroy callbacks have a lock of their own
    (``_callbacks_lock``), never held while calling out.
    """

    info: AdapterInfo
    limits: DeviceLimits
    #: Dispatches run the kernels' WGSL (see ``BackendDevice.runs_numpy_twins``).
    runs_numpy_twins: bool = False
    features: frozenset[str]
    encode_ahead: bool

    def __init__(self) -> None:
        raise TypeError("WgpuDevice objects are made by WgpuBackend.open_device()")

    @classmethod
    def _open(cls, backend: DeviceOpener, adapter: Any, info: AdapterInfo) -> WgpuDevice:
        self = cls.__new__(cls)
        self._init(backend, adapter, info)
        return self

    def _init(self, backend: DeviceOpener, adapter: Any, info: AdapterInfo) -> None:
        # Every field first (each layer sets its own), so a failure below leaves a device destroy() can clean up.
        self._init_base()
        self._backend = backend
        self._destroy_callbacks: list[Callable[[], None]] = []
        self._callbacks_lock = threading.Lock()
        self._callbacks_done = False
        self._init_encode_ahead(backend.encode_ahead)
        self.info = info
        self._init_readback(info, backend.spin_wait_us)
        self._init_read_ahead()
        self._init_timestamps()
        self._init_staged_writes()

        ffi, lib = self._ffi, self._lib
        self._device = request_device(
            adapter,
            info,
            self._on_device_lost,
            self._on_uncaptured_error,
            self._callback_userdata,
            backend._process_events,
        )
        # WGPUQueue wgpuDeviceGetQueue(WGPUDevice device)
        self._queue = lib.wgpuDeviceGetQueue(self._device)
        self._queue_address = _address(self._queue)
        self.limits = device_limits(self._device)
        self.features = device_features(self._device)
        self._read_timestamp_period()

        self._native_table = NativeTable(
            _address(self._device),
            self._queue_address,
            {name: _address(ffi.addressof(lib, "wgpu" + name)) for name in NativeTable.entry_point_names()},
            self._error_count_address,
        )
        # Profiled steps' timestamps go inside the open compute pass where the device allows it (no pass ends)
        self._native_table.timestamps_in_passes = "timestamp-query-inside-passes" in self.features
        # ... and a timestamp with no pass open (a timed list's first) begins the pass rather than being written on
        # the encoder: wgpu-core resets an encoder-level query inline, a pass's queries together before the pass
        # (a run timed whole costs slightly less so)
        self._native_table.timestamps_open_pass = self._native_table.timestamps_in_passes
        self._raise_pending("opening the device")
        self._check_submitted_flag()
        self._open_unlocked_calls()

    # -- buffers --------------------------------------------------------------------
    @_serialized
    def create_buffer(self, size: int, *, uniform: bool = False, label: str = "") -> int:
        """A zero-filled buffer of ``size`` bytes; STORAGE|COPY_SRC|COPY_DST, or UNIFORM|COPY_DST."""
        self._check_open()
        action = f"create_buffer({size}, label={label!r})"
        self._check_aligned(action, size=size)
        if size > self.limits.max_buffer_size:
            raise ValidationError(
                f"{action}: {size} bytes is over the device's max_buffer_size of {self.limits.max_buffer_size} bytes "
                f"({self.info.name}); split the tensor or use a device with larger limits"
            )
        lib = self._lib
        usage = (
            lib.WGPUBufferUsage_Uniform | lib.WGPUBufferUsage_CopyDst
            if uniform
            else lib.WGPUBufferUsage_Storage | lib.WGPUBufferUsage_CopySrc | lib.WGPUBufferUsage_CopyDst
        )
        pointer = self._native_buffer(size, usage, label, action)
        handle = self._new_handle(pointer)
        self._handles[handle] = _Handle("buffer", pointer, size=size, uniform=uniform, label=label)
        return handle

    @_serialized
    def destroy_buffer(self, buffer: int) -> None:
        """Free the buffer now (bind groups that use it become unusable).

        Releasing is always allowed: on a lost device it frees as usual, after ``destroy()`` it does nothing (the
        device freed everything), and from a finalizer run inside another call of this device it is done when
        that call returns."""
        if self._lock.defer_if_nested(lambda: self.destroy_buffer(buffer)) or self._device is None:
            return
        record = self._lookup(buffer, "buffer", "destroy_buffer")
        del self._handles[buffer]
        self._resolve_buffers.discard(buffer)
        if buffer in self._aheads:
            self._drop_read_ahead(buffer)
        self._forget_validation(buffer)
        if record.busy:  # a read's C part may still copy from it: freed when the last such read ends
            record.doomed = True
            self._doomed.append(record)
            return
        self._free_buffer(record.pointer)
        self._raise_pending_unless_lost(f"destroy_buffer({buffer:#x})")

    def buffer_size(self, buffer: int) -> int:
        """The size in bytes of a live buffer."""
        return self._lookup(buffer, "buffer", "buffer_size").size

    def write_buffer(self, buffer: int, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Queue write of ``data`` at ``offset`` (ordered with submissions; see the protocol).

        Made outside the device's lock, and without the GIL for the native call, when nobody holds the lock (an
        upload then waits neither for the lock nor for the submissions other threads make outside it: at K=8
        threads that wait was about half a step); else, and for every write the
        checks refuse, under the lock.  A large write (:func:`._wgpu_staged_writes.stages`) goes through the device's
        upload staging buffers, under the lock (:mod:`._wgpu_staged_writes`)."""
        view = memoryview(data)
        if not view.c_contiguous:
            view = memoryview(view.tobytes())
        size = view.nbytes
        if stages(size):
            self._write_buffer_locked(buffer, offset, view)
            return
        record = self._handles.get(buffer)
        if (
            record is not None
            and record.kind == "buffer"
            and 0 <= offset
            and not offset % BUFFER_ALIGNMENT
            and not size % BUFFER_ALIGNMENT
            and 0 < size <= record.size - offset
            and self._device is not None
            and self._sink.lost is None
            and self._write_outside_lock(buffer, record, offset, view)
        ):
            return
        self._write_buffer_locked(buffer, offset, view)

    def _write_outside_lock(self, buffer: int, record: _Handle, offset: int, view: memoryview) -> bool:
        """The write of :meth:`write_buffer` through the gate of the calls made outside the lock
        (``UnlockedCalls.try_enter_write``: the destroy of a buffer, and every other holder of the lock, waits for
        it); False, having written nothing, when the gate would not let it in (the lock is held, or the device is
        being destroyed) or the buffer was released between the caller's lookup and the entry.  A read ahead of the
        buffer is marked stale before the write and again after it: a replay that refreshed it in between may have
        copied the buffer before the write landed."""
        unlocked = self._unlocked
        if not unlocked.try_enter_write():
            return False
        entered = True
        try:
            if self._handles.get(buffer) is not record:
                return False
            if self._aheads:
                self._note_written(buffer)
            ffi = self._ffi
            source = ffi.from_buffer(view)
            target, address = int(ffi.cast("uintptr_t", record.pointer)), int(ffi.cast("uintptr_t", source))
            entered = False  # write_entered leaves the gate
            unlocked.write_entered(target, offset, address, view.nbytes)
        finally:
            if entered:
                unlocked.leave_write()
        if self._aheads:
            self._note_written(buffer)
        if self._reported():
            self._raise_pending(f"write_buffer({buffer:#x}, offset={offset}, {view.nbytes} bytes)")
        return True

    @_serialized
    def _write_buffer_locked(self, buffer: int, offset: int, view: memoryview) -> None:
        """The write of :meth:`write_buffer` (``view`` C-contiguous) under the lock, refusing what its checks refuse."""
        self._check_open()
        size = view.nbytes
        record = self._handles.get(buffer)
        if (
            record is None
            or record.kind != "buffer"
            or offset < 0
            or offset % BUFFER_ALIGNMENT
            or size % BUFFER_ALIGNMENT
            or offset + size > record.size
        ):
            self._refuse_write(buffer, offset, size)
        if size == 0:
            return
        if self._aheads:
            self._note_written(buffer)  # a read ahead of it is stale from here on
        ffi = self._ffi
        data = ffi.from_buffer(view)
        action = f"write_buffer({buffer:#x}, offset={offset}, {size} bytes)"
        if stages(size):
            self._write_staged(record.pointer, offset, int(ffi.cast("uintptr_t", data)), size, action)
            return
        # void wgpuQueueWriteBuffer(WGPUQueue, WGPUBuffer, uint64_t bufferOffset, void const * data, size_t size),
        # keeping the GIL (see UnlockedCalls.queue_write)
        self._unlocked.queue_write(
            int(ffi.cast("uintptr_t", record.pointer)), offset, int(ffi.cast("uintptr_t", data)), size
        )
        if self._reported():
            self._raise_pending(action)

    def _refuse_write(self, buffer: int, offset: int, size: int) -> NoReturn:
        """The typed error of a write that the checks of :meth:`write_buffer` refuse."""
        action = f"write_buffer({buffer:#x}, offset={offset}, {size} bytes)"
        record = self._lookup(buffer, "buffer", action)
        self._check_aligned(action, offset=offset, size=size)
        raise ValidationError(f"{action}: the write ends at {offset + size}, past the buffer's {record.size} bytes")

    # -- kernels --------------------------------------------------------------------
    @_serialized
    def create_compute_pipeline(
        self, wgsl: str, *, entry_point: str = "main", twin: KernelTwin | None = None, label: str = ""
    ) -> int:
        """Compile ``wgsl`` into a compute pipeline with an automatic layout (``twin`` is ignored here)."""
        self._check_open()
        ffi, lib = self._ffi, self._lib
        action = f"create_compute_pipeline(label={label!r}, entry_point={entry_point!r})"
        keep: list[Any] = []
        source = ffi.new("WGPUShaderSourceWGSL *")
        source.chain.next = ffi.NULL
        source.chain.sType = lib.WGPUSType_ShaderSourceWGSL
        source.code = _string_view(wgsl, keep)
        module_descriptor = ffi.new("WGPUShaderModuleDescriptor *")
        module_descriptor.nextInChain = ffi.cast("WGPUChainedStruct *", source)
        module_descriptor.label = _string_view(label, keep)
        # WGPUShaderModule wgpuDeviceCreateShaderModule(WGPUDevice, WGPUShaderModuleDescriptor const *)
        module = lib.wgpuDeviceCreateShaderModule(self._device, module_descriptor)
        try:
            self._raise_pending(f"{action}: WGSL compilation failed")
            pipeline_descriptor = ffi.new("WGPUComputePipelineDescriptor *")
            pipeline_descriptor.label = _string_view(label, keep)
            pipeline_descriptor.layout = ffi.NULL
            pipeline_descriptor.compute.module = module
            pipeline_descriptor.compute.entryPoint = _string_view(entry_point, keep)
            # WGPUComputePipeline wgpuDeviceCreateComputePipeline(WGPUDevice, WGPUComputePipelineDescriptor const *)
            pipeline = self._created(
                lib.wgpuDeviceCreateComputePipeline(self._device, pipeline_descriptor),
                lib.wgpuComputePipelineRelease,
                action,
            )
        finally:
            if module != ffi.NULL:
                # void wgpuShaderModuleRelease(WGPUShaderModule shaderModule)
                lib.wgpuShaderModuleRelease(module)
        if pipeline == ffi.NULL:
            raise ValidationError(f"{action}: wgpu-native returned no pipeline")
        handle = self._new_handle(pipeline)
        read_only, writable = _storage_bindings(wgsl)
        self._handles[handle] = _Handle(
            "pipeline", pipeline, label=label, read_only_bindings=read_only, writable_bindings=writable
        )
        return handle

    @_serialized
    def release_pipeline(self, pipeline: int) -> None:
        """Free the pipeline (always allowed, as :meth:`destroy_buffer`)."""
        if self._lock.defer_if_nested(lambda: self.release_pipeline(pipeline)) or self._device is None:
            return
        record = self._lookup(pipeline, "pipeline", "release_pipeline")
        del self._handles[pipeline]
        self._forget_validation(pipeline)
        # void wgpuComputePipelineRelease(WGPUComputePipeline computePipeline)
        self._lib.wgpuComputePipelineRelease(record.pointer)

    @_serialized
    def create_bind_group(self, pipeline: int, entries: Sequence[BindingEntry]) -> int:
        """A bind group for group 0 of ``pipeline``'s automatic layout."""
        self._check_open()
        ffi, lib = self._ffi, self._lib
        action = f"create_bind_group(pipeline={pipeline:#x})"
        pipeline_record = self._lookup(pipeline, "pipeline", action)
        native_entries = ffi.new("WGPUBindGroupEntry[]", max(len(entries), 1))
        seen: set[int] = set()
        read: set[int] = set()
        written: set[int] = set()
        for i, entry in enumerate(entries):
            where = f"{action}, binding {entry.binding}"
            if entry.binding in seen:
                raise ValidationError(f"{where}: the binding number is used twice")
            seen.add(entry.binding)
            record = self._lookup(entry.buffer, "buffer", where)
            if record.uniform:
                alignment = self.limits.min_uniform_buffer_offset_alignment
                max_binding = self.limits.max_uniform_buffer_binding_size
            else:
                alignment = self.limits.min_storage_buffer_offset_alignment
                max_binding = self.limits.max_storage_buffer_binding_size
            self._check_aligned(where, offset=entry.offset, size=entry.size)
            if entry.offset % alignment:
                raise ValidationError(f"{where}: offset {entry.offset} is not a multiple of {alignment}")
            if entry.size == 0 or entry.offset + entry.size > record.size:
                raise ValidationError(
                    f"{where}: range [{entry.offset}, {entry.offset + entry.size}) is empty or past the buffer's "
                    f"{record.size} bytes"
                )
            if entry.size > max_binding:
                raise ValidationError(
                    f"{where}: {entry.size} bytes is over the device's binding size limit of {max_binding} bytes"
                )
            if entry.binding in pipeline_record.writable_bindings:
                written.add(entry.buffer)
            elif entry.binding in pipeline_record.read_only_bindings:
                read.add(entry.buffer)
            native_entries[i].binding = entry.binding
            native_entries[i].buffer = record.pointer
            native_entries[i].offset = entry.offset
            native_entries[i].size = entry.size
        if read & written:
            # wgpu-native would accept the bind group and abort the process at submit.
            raise ValidationError(
                f"{action}: buffer(s) {', '.join(f'{b:#x}' for b in sorted(read & written))} are bound both as "
                "read-only and as read_write storage; a dispatch may not read and write one buffer through "
                "different bindings (bind it once as read_write)"
            )
        # WGPUBindGroupLayout wgpuComputePipelineGetBindGroupLayout(WGPUComputePipeline, uint32_t groupIndex)
        layout = lib.wgpuComputePipelineGetBindGroupLayout(pipeline_record.pointer, 0)
        try:
            self._raise_pending(action)
            descriptor = ffi.new("WGPUBindGroupDescriptor *")
            descriptor.layout = layout
            descriptor.entryCount = len(entries)
            descriptor.entries = native_entries
            # WGPUBindGroup wgpuDeviceCreateBindGroup(WGPUDevice, WGPUBindGroupDescriptor const *)
            bind_group = self._created(
                lib.wgpuDeviceCreateBindGroup(self._device, descriptor), lib.wgpuBindGroupRelease, action
            )
        finally:
            if layout != ffi.NULL:
                # void wgpuBindGroupLayoutRelease(WGPUBindGroupLayout bindGroupLayout)
                lib.wgpuBindGroupLayoutRelease(layout)
        if bind_group == ffi.NULL:
            raise ValidationError(f"{action}: wgpu-native returned no bind group")
        handle = self._new_handle(bind_group)
        self._handles[handle] = _Handle(
            "bind_group", bind_group, buffers=tuple(e.buffer for e in entries), pipeline=pipeline
        )
        # what a dispatch with it may write (the read aheads it makes stale): every storage buffer not bound read-only
        self._bind_group_writes[handle] = tuple(
            e.buffer
            for e in entries
            if e.binding not in pipeline_record.read_only_bindings and not self._handles[e.buffer].uniform
        )
        return handle

    @_serialized
    def release_bind_group(self, bind_group: int) -> None:
        """Free the bind group (always allowed, as :meth:`destroy_buffer`)."""
        if self._lock.defer_if_nested(lambda: self.release_bind_group(bind_group)) or self._device is None:
            return
        record = self._lookup(bind_group, "bind_group", "release_bind_group")
        del self._handles[bind_group]
        self._bind_group_writes.pop(bind_group, None)
        self._forget_validation(bind_group)
        # void wgpuBindGroupRelease(WGPUBindGroup bindGroup)
        self._lib.wgpuBindGroupRelease(record.pointer)

    # -- submission ---------------------------------------------------------------------
    @property
    def native_table(self) -> NativeTable:
        """The wgpu-native entry points and this device's device/queue pointers (for the replay loop)."""
        self._check_open()
        return self._native_table

    def submit(
        self,
        commands: CommandList,
        read_ahead: Sequence[tuple[int, int, int]] = (),
        encode_next: CommandList | None = None,
    ) -> None:
        """Validate, then encode ``commands`` in order and submit them as one command buffer.

        Encoding runs in C with the GIL released.  A frozen list (a captured
        graph's) is validated on its first submit only, until one of the
        handles it uses is released: replay pays no per-record Python work;
        its next command buffer is encoded after the submit, outside the
        device's lock (see ``_EncodeAhead``), and that command buffer is
        submitted outside the lock too (``_unlocked_calls``).

        ``read_ahead`` ``(buffer, offset, size)`` ranges are copied to staging buffers of their own at the end of
        the same submission, so that a read of them that follows costs no submission (:mod:`._wgpu_read_ahead`).

        ``encode_next`` (a frozen list validated here, to be submitted next with the same ``read_ahead``): the
        command buffer encoded ahead after the submit is that list's instead of ``commands``' (see
        :meth:`_EncodeAhead._job_for_next`).  The profiler's ring submits its slots' lists in turn: each one's
        command buffer is then encoded just before its use instead of a ring's length earlier (a command buffer
        encoded many submits before its own takes longer to submit).
        """
        check_encode_next(encode_next)
        action = f"submit ({len(commands)} commands)"
        tail = None
        refreshed: list[Any] = []
        token: object = None
        following: _AheadJob | None = None
        instead = False  # the submitted list's own encoding ahead gives way to encode_next's
        with self._lock:
            self._check_open()
            self._validate_for_submit(commands)
            locked = False
            if read_ahead or self._aheads:
                if read_ahead:
                    self._check_read_ahead(read_ahead, action)
                tail, refreshed, token, locked = self._read_ahead_tail(commands, read_ahead, action)
            try:
                job, ready = self._encode_and_submit(commands, tail, action, defer=not locked)
            except BaseException:
                self._refresh_ended(refreshed, token, False)
                raise
            if not ready:
                self._refresh_ended(refreshed, token, True)
        if ready:
            try:
                self._submit_unlocked(commands, tail, ready, job, action)
            except BaseException:
                with self._lock:
                    self._refresh_ended(refreshed, token, False)
                raise
            self._refresh_ended(refreshed, token, True)
        if job is not None and encode_next is not None and encode_next is not commands:
            # After the submit: validating a list not submitted yet (its first use) must not delay this one's
            with self._lock:
                instead, following = self._job_for_next(encode_next, tail)
        if instead:
            self._cancel_job(job)
            job = following
        self._encode_ahead(job)

    # -- lifetime -------------------------------------------------------------------------
    def live_handles(self) -> int:
        """Live buffers, pipelines, bind groups and query sets created through this device (a buffer released
        while a read copies from it until that read ends), and command buffers encoded ahead for captured graphs
        (the staging buffers excluded)."""
        return len(self._handles) + len(self._ahead) + len(self._doomed)

    def describe_live_handles(self) -> list[str]:
        """One line per live native object of this device (kind, handle, label)."""
        return [
            f"{self.info.name}: {record.kind} {handle:#x} ({record.label!r})"
            for handle, record in self._handles.items()
        ] + [
            f"{self.info.name}: command buffer {address:#x} (encoded ahead for command list {list_id:#x}"
            f"{', with output copies' if tail else ''})"
            for (list_id, tail), address in list(self._ahead.items())
        ]

    @property
    def destroyed(self) -> bool:
        return self._device is None

    def add_destroy_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once, right after the device is destroyed (at once if it already is): for state
        that layers above keep per device, such as the pipeline cache, to go with it."""
        # A lock of their own, never held while calling out: registering never waits for the device's work.
        with self._callbacks_lock:
            if not self._callbacks_done:
                self._destroy_callbacks.append(callback)
                return
        callback()

    def destroy(self) -> None:
        """Release the staging buffers, every live handle, the queue and the device (destroyed, unless arrays still
        hold staging buffers of it: then only released, and freed with the last), then call the destroy callbacks
        (outside the device's lock).  Idempotent."""
        self._destroy_native()
        lock = getattr(self, "_callbacks_lock", None)
        if lock is None:
            return  # never fully opened
        with lock:
            callbacks, self._destroy_callbacks = self._destroy_callbacks, []
            self._callbacks_done = True
        for callback in callbacks:
            callback()

    @_serialized
    def _destroy_native(self) -> None:
        device = getattr(self, "_device", None)
        if device is None:
            return
        lib = self._lib
        self._close_unlocked_calls()  # no read's C part runs from here on (they end promptly: see _unlocked_calls)
        self._sink.ignore_lost = True
        self._release_ahead(lambda key: True)
        self._device = None
        handles, self._handles = self._handles, {}
        for record in self._doomed:  # released while a read used them: that read will not free them now
            record.doomed = False
            handles[id(record)] = record
        self._doomed.clear()
        self._resolve_buffers.clear()
        order = {"bind_group": 0, "pipeline": 1, "query_set": 2, "buffer": 3}
        for record in sorted(handles.values(), key=lambda r: order[r.kind]):
            if record.kind == "bind_group":
                lib.wgpuBindGroupRelease(record.pointer)
            elif record.kind == "pipeline":
                lib.wgpuComputePipelineRelease(record.pointer)
            elif record.kind == "query_set":
                self._free_query_set(record.pointer)
            else:
                self._free_buffer(record.pointer)
        self._destroy_staged_writes()
        # waits for a wait that is polling outside the lock, frees the staging buffers not held by a view
        held = self._destroy_readback()
        queue, self._queue = self._queue, None
        if queue is not None:
            # void wgpuQueueRelease(WGPUQueue queue)
            lib.wgpuQueueRelease(queue)
        # void wgpuDeviceDestroy(WGPUDevice device); void wgpuDeviceRelease(WGPUDevice device)
        if not held:  # (a destroyed device would unmap what views still read: they hold the device instead)
            lib.wgpuDeviceDestroy(device)
        lib.wgpuDeviceRelease(device)
        self._sink.clear()

    def __del__(self, warn: Callable[[str], None] = _warn_in_destructor) -> None:
        # warn is bound at definition: at interpreter exit this module's globals may already be None.
        try:
            self.destroy()
        except Exception as error:  # noqa: BLE001 - a destructor never raises
            warn(f"destroying {self!r} when it was collected failed: {error}")

    def __repr__(self) -> str:
        state = "destroyed" if self.destroyed else f"{self.live_handles()} live handles"
        return f"<WgpuDevice adapter {self.info.index} {self.info.name!r} ({self.info.backend_type}), {state}>"
