"""Reading wgpu buffers back to the host, and waiting for the device: the staging buffer, mapping, polling.

A read copies its range into the device's staging buffer (MAP_READ | COPY_DST, grown to a power of two as
reads need), maps it, and copies out of the mapping; ``submit_and_read`` appends those copies to the submission
itself (a tail, which the encode-ahead cache keeps with the list), so a run and its reads cost one submission
and one wait.  Waits (for a mapping, or for the queue in ``wait_idle``) poll wgpu-native: without blocking for
up to ``spin_wait_us``, then blocking.

Ownership: :class:`_Readback` is a layer of ``WgpuDevice`` (after ``_EncodeAhead``, through which it submits;
``_DeviceBase``'s docstring describes the layers).  It owns ``_staging`` and ``_staging_size``,
``spin_wait_us``, the map and work-done callbacks and their descriptors, and ``_work_done_tokens``; all are used
under the device's lock (every public method here is :func:`_serialized`), and the callbacks write the results
they report into the device's ``_sink`` during the polls this layer makes.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence, TypeVar

from .._errors import DeviceError, ValidationError
from ._commands import CommandList
from ._wgpu_device_base import _serialized
from ._wgpu_encode_ahead import _EncodeAhead
from ._wgpu_ffi import _address, _enum_suffix, _string
from .protocol import BUFFER_ALIGNMENT, AdapterInfo, host_read_target

_STAGING_MINIMUM = 1 << 16
# read_buffer polls at most this many times for the map callback before giving up.
_MAP_POLL_ATTEMPTS = 10_000
# Default spin before a blocking wait, on GPU adapters (0 on CPU adapters: there the spinning thread would take
# a core from the driver's own threads).  On the H200 spinning made submit + wait_idle of 16 small dispatches about
# a fifth faster (`python -m bench --overhead` measures both; bench/RESULTS.md has the figures).
DEFAULT_SPIN_WAIT_US = 2000.0

_T = TypeVar("_T")


class _Readback(_EncodeAhead):
    """The staging buffer, reads and waits of a wgpu device (see the module's docstring)."""

    def _init_readback(self, info: AdapterInfo, spin_wait_us: float | None) -> None:
        """Set this layer's fields: no staging buffer yet, the spin before blocking (the backend's, or the
        default for ``info``'s adapter type), and the map and work-done callbacks, which write into ``_sink``."""
        ffi, lib, sink = self._ffi, self._lib, self._sink
        self._staging: Any = None
        self._staging_size = 0
        spin = spin_wait_us
        if spin is None:
            spin = 0.0 if info.adapter_type == "CPU" else DEFAULT_SPIN_WAIT_US
        self.spin_wait_us = float(spin)

        def on_map(status: int, message: Any, userdata1: Any, userdata2: Any) -> None:
            try:
                sink.map_message = _string(message)
            except Exception:  # noqa: BLE001
                sink.map_message = ""
            sink.map_status = int(status)

        def on_work_done(status: int, message: Any, userdata1: Any, userdata2: Any) -> None:
            token = int(ffi.cast("uintptr_t", userdata1))
            if status != lib.WGPUQueueWorkDoneStatus_Success:
                try:
                    sink.work_done_failure = f"{_enum_suffix('WGPUQueueWorkDoneStatus', status)}: {_string(message)}"
                except Exception:  # noqa: BLE001
                    sink.work_done_failure = "(status unreadable)"
            sink.work_done_token = max(sink.work_done_token, token)

        # The cffi callbacks must outlive the device: kept on self.
        self._on_map = ffi.callback("WGPUBufferMapCallback", on_map)
        self._on_work_done = ffi.callback("WGPUQueueWorkDoneCallback", on_work_done)
        self._work_done_tokens = 0
        # The callback descriptors of every read and wait, filled once (a wait sets only its token).
        self._map_info = ffi.new("WGPUBufferMapCallbackInfo *")
        self._map_info.mode = lib.WGPUCallbackMode_AllowProcessEvents
        self._map_info.callback = self._on_map
        self._work_done_info = ffi.new("WGPUQueueWorkDoneCallbackInfo *")
        self._work_done_info.mode = lib.WGPUCallbackMode_AllowProcessEvents
        self._work_done_info.callback = self._on_work_done

    def _ensure_staging(self, size: int) -> None:
        if self._staging is not None and self._staging_size >= size:
            return
        capacity = max(_STAGING_MINIMUM, 1 << (size - 1).bit_length())
        capacity = min(capacity, max(size, self.limits.max_buffer_size - self.limits.max_buffer_size % 4))
        if self._staging is not None:
            self._release_ahead(lambda key: bool(key[1]))  # their copies target the old staging buffer
            staging, self._staging, self._staging_size = self._staging, None, 0
            self._free_buffer(staging)
        lib = self._lib
        self._staging = self._native_buffer(
            capacity, lib.WGPUBufferUsage_MapRead | lib.WGPUBufferUsage_CopyDst, "ortgpu staging", "read_buffer staging"
        )
        self._staging_size = capacity

    @_serialized
    def read_buffer(self, buffer: int, offset: int, size: int) -> bytes:
        """Wait for submitted work, then copy ``size`` bytes from ``offset`` out (through the staging buffer)."""
        self._check_open()
        action = f"read_buffer({buffer:#x}, offset={offset}, size={size})"
        self._check_aligned(action, offset=offset, size=size)
        if self._checked_read(buffer, offset, size, action) == 0:
            return b""
        ffi = self._ffi
        return self._map_read(buffer, offset, size, action, lambda mapped: bytes(ffi.buffer(mapped, size)))

    @_serialized
    def read_buffer_into(self, buffer: int, offset: int, out: Any) -> None:
        """Like :meth:`read_buffer`, into ``out`` (a writable C-contiguous buffer of any size; the device-side copy
        covers it rounded up to 4 bytes): one host copy, straight from the mapped staging buffer."""
        self._check_open()
        action = f"read_buffer_into({buffer:#x}, offset={offset})"
        view, padded = self._read_target(buffer, offset, out, action)
        if padded == 0:
            return
        ffi = self._ffi
        target = ffi.from_buffer(view, require_writable=True)
        self._map_read(buffer, offset, padded, action, lambda mapped: ffi.memmove(target, mapped, view.nbytes))

    def _read_target(self, buffer: int, offset: int, out: Any, action: str) -> tuple[memoryview, int]:
        """``out`` as a byte view and the device range of the read (checked against ``buffer``)."""
        view, padded = host_read_target(out, action)
        self._check_aligned(action, offset=offset)
        self._checked_read(buffer, offset, padded, action)
        return view, padded

    def _checked_read(self, buffer: int, offset: int, size: int, action: str) -> int:
        record = self._lookup(buffer, "buffer", action)
        if offset + size > record.size:
            raise ValidationError(f"{action}: the read ends at {offset + size}, past the buffer's {record.size} bytes")
        if record.uniform:
            raise ValidationError(f"{action}: uniform buffers are write-only (no COPY_SRC usage)")
        return size

    @_serialized
    def submit_and_read(self, commands: CommandList, reads: Sequence[tuple[int, int, Any]]) -> None:
        """:meth:`submit` ``commands``, then :meth:`read_buffer_into` each ``(buffer, offset, out)``, as one
        command buffer (the copies to the staging buffer follow the commands in it) and one wait."""
        self._check_open()
        regions: list[tuple[int, int, int, memoryview]] = []  # (buffer, offset, padded size, view)
        for index, (buffer, offset, out) in enumerate(reads):
            view, padded = self._read_target(
                buffer, offset, out, f"submit_and_read: read {index} ({buffer:#x}, offset={offset})"
            )
            regions.append((buffer, offset, padded, view))
        self._validate_for_submit(commands)
        total = sum(padded for _, _, padded, _ in regions)
        action = f"submit_and_read ({len(commands)} commands, {len(regions)} reads)"
        self._ensure_staging(max(total, BUFFER_ALIGNMENT))
        tail = CommandList()
        staging = _address(self._staging)
        cursor = 0
        for buffer, offset, padded, _ in regions:
            if padded:
                tail.add_copy(buffer, offset, staging, cursor, padded)
            cursor += padded
        submitted = self._encode_and_submit(commands, tail)
        self._raise_pending(action)
        if not submitted:
            raise DeviceError(f"{action}: wgpu-native could not encode the command buffer")
        if total == 0:
            return
        ffi = self._ffi

        def consume(mapped: Any) -> None:
            at = 0
            for _, _, padded, view in regions:
                if view.nbytes:
                    ffi.memmove(ffi.from_buffer(view, require_writable=True), mapped + at, view.nbytes)
                at += padded

        self._map_staging(total, action, consume)

    def _map_read(self, buffer: int, offset: int, size: int, action: str, consume: Callable[[Any], _T]) -> _T:
        """Copy ``size`` bytes at ``offset`` into the staging buffer, map it, and return ``consume(mapped pointer)``."""
        self._ensure_staging(size)
        commands = CommandList()
        commands.add_copy(buffer, offset, _address(self._staging), 0, size)
        submitted = commands.encode_submit_native(self._native_table)
        self._raise_pending(action)
        if not submitted:
            raise DeviceError(f"{action}: wgpu-native could not encode the copy to the staging buffer")
        return self._map_staging(size, action, consume)

    def _map_staging(self, size: int, action: str, consume: Callable[[Any], _T]) -> _T:
        """Map the first ``size`` bytes of the staging buffer (waiting for the work that fills them) and return
        ``consume(mapped pointer)``; unmaps after."""
        ffi, lib, sink = self._ffi, self._lib, self._sink
        sink.map_status = None
        # WGPUFuture wgpuBufferMapAsync(WGPUBuffer, WGPUMapMode, size_t offset, size_t size, WGPUBufferMapCallbackInfo)
        lib.wgpuBufferMapAsync(self._staging, lib.WGPUMapMode_Read, 0, size, self._map_info[0])
        self._raise_pending(action)
        self._poll_until(lambda: sink.map_status is not None, action)
        if sink.map_status != lib.WGPUMapAsyncStatus_Success:
            state = "never completed" if sink.map_status is None else f"failed: {sink.map_message}"
            raise DeviceError(f"{action}: mapping the staging buffer {state}")
        # void const * wgpuBufferGetConstMappedRange(WGPUBuffer buffer, size_t offset, size_t size)
        mapped = lib.wgpuBufferGetConstMappedRange(self._staging, 0, size)
        try:
            if mapped == ffi.NULL:
                raise DeviceError(f"{action}: the staging buffer's mapped range is NULL")
            return consume(mapped)
        finally:
            # void wgpuBufferUnmap(WGPUBuffer buffer)
            lib.wgpuBufferUnmap(self._staging)

    @_serialized
    def wait_idle(self) -> None:
        """Block until all submitted work is done (spinning first for up to ``spin_wait_us``)."""
        self._check_open()
        ffi, lib, sink = self._ffi, self._lib, self._sink
        # wgpuDevicePoll's "queue empty" answer can come before the GPU has finished (seen on the H200), so the
        # wait is for a work-done callback registered after everything submitted so far.
        self._work_done_tokens += 1
        token = self._work_done_tokens
        sink.work_done_failure = None
        self._work_done_info.userdata1 = ffi.cast("void *", token)
        # WGPUFuture wgpuQueueOnSubmittedWorkDone(WGPUQueue queue, WGPUQueueWorkDoneCallbackInfo callbackInfo)
        lib.wgpuQueueOnSubmittedWorkDone(self._queue, self._work_done_info[0])
        self._raise_pending("wait_idle")
        self._poll_until(lambda: sink.work_done_token >= token, "wait_idle")
        if sink.work_done_token < token or sink.work_done_failure is not None:
            state = "never completed" if sink.work_done_token < token else f"failed: {sink.work_done_failure}"
            raise DeviceError(f"wait_idle: waiting for the submitted work {state}")

    def _poll_until(self, done: Callable[[], bool], action: str) -> None:
        """Poll the device until ``done()`` (set by a callback that a poll fires): without blocking for up to
        ``spin_wait_us``, then blocking (each blocking poll waits for every submission; at most
        ``_MAP_POLL_ATTEMPTS`` of them)."""
        lib, device, null = self._lib, self._device, self._ffi.NULL
        if self.spin_wait_us > 0:
            deadline = time.perf_counter() + self.spin_wait_us * 1e-6
            while True:
                # WGPUBool wgpuDevicePoll(WGPUDevice, WGPUBool wait, WGPUSubmissionIndex const *); its "queue
                # empty" answer is not trusted (see wait_idle): done() reads what the fired callbacks set
                lib.wgpuDevicePoll(device, 0, null)
                self._raise_pending(action)
                if done():
                    return
                if time.perf_counter() > deadline:
                    break
        for _ in range(_MAP_POLL_ATTEMPTS):
            lib.wgpuDevicePoll(device, 1, null)
            self._raise_pending(action)
            if done():
                return
