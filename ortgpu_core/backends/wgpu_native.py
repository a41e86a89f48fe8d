"""The wgpu backend: our own cffi calls into wgpu-native (ABI mode).

The shared library and the headers come from the ``wgpu`` wheel's
``resources/`` folder, found without importing wgpu-py (we never use its
Python classes).  The cffi ``cdef`` is generated from those headers by
:mod:`ortgpu_core.backends._cdef` and committed as
``resources/wgpu_native.cdef.h``.

Handles are the native pointers of wgpu-native objects, as ``int``.  Each
device keeps a table ``handle -> _Handle`` of what it created, so release
functions and :meth:`WgpuDevice.submit` can reject unknown or released handles
*before* they reach native code: wgpu-native dereferences whatever pointer it is
given, and some of its errors abort the process (Rust panics), so cheap checks
(sizes, alignment, limits, handle liveness) are done in Python first.

Errors wgpu-native reports go to the device's uncaptured-error callback, which
wgpu-native 29 calls synchronously inside the failing call (verified by
``tests/test_backend_wgpu.py``), so no error scopes are needed: after each call
that can fail, the collected errors are raised as typed exceptions in the
caller's frame.  A lost device raises :class:`DeviceLostError` on every later
call.

The backend's parts, by job: :mod:`._wgpu_ffi` (loading the library, C strings, feature names),
:mod:`._wgpu_adapters` (instance, adapters, limits and features, the default adapter, requesting a device),
:mod:`._wgpu_device_base` (the device's lock, error sink, handle table and checks), :mod:`._wgpu_encode_ahead`
(the validation memo and the command buffers encoded ahead for frozen command lists), :mod:`._wgpu_readback`
(the staging buffer, reads and waits) and :mod:`._wgpu_timestamps` (timestamp query sets, query-resolve buffers and
the checks on timestamp and resolve records), :mod:`._wgpu_device` (:class:`WgpuDevice`, which adds the device's
set-up, buffers, kernels, submit and lifetime to those parts).  This module has :class:`WgpuBackend` (the instance
and its adapters, which opens devices) and re-exports :class:`WgpuDevice`.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

from .._errors import DeviceError, InvalidArgumentError, ValidationError
from ._wgpu_adapters import (
    _limits_from_native,
    adapter_info,
    choose_default_adapter,
    create_instance,
    enumerate_adapters,
    native_adapter_limits,
)
from ._wgpu_device import WgpuDevice, _warn_in_destructor
from ._wgpu_ffi import feature_name, load_native, native_version
from ._wgpu_readback import DEFAULT_SPIN_WAIT_US
from .protocol import AdapterInfo, DeviceLimits

__all__ = [
    "WgpuBackend",
    "WgpuDevice",
    "load_native",
    "feature_name",
    "choose_default_adapter",
    # defined in the backend's parts, imported from here
    "native_version",
    "DEFAULT_SPIN_WAIT_US",
]


class WgpuBackend:
    """wgpu-native's adapters (every one ``wgpuInstanceEnumerateAdapters`` lists) and the devices opened on them.

    The backend owns the instance and the adapters; each device holds a
    reference to its backend, so the instance outlives every device.
    """

    name = "wgpu"

    def __init__(
        self, *, include_opengl: bool = False, spin_wait_us: float | None = None, encode_ahead: bool = True
    ) -> None:
        """``include_opengl``: also list OpenGL(ES) adapters.  Off by default: every GPU ortgpu targets has a
        Vulkan, Metal or D3D12 adapter, and initialising EGL prints warnings on machines without a display.

        ``spin_wait_us``: how long a wait for the device (``wait_idle``, ``read_buffer``) polls without blocking,
        keeping one CPU core busy, before it polls with sleeps between polls (for up to
        ``_wgpu_readback.NAP_POLL_S``), then blocks in the driver.  Sleeping or blocking adds wake-up latency (a
        submit + wait of a few small dispatches is faster spinning: bench/RESULTS.md); spinning costs a core while
        the GPU works.  ``None`` (default):
        :data:`DEFAULT_SPIN_WAIT_US` on GPU adapters, 0 on CPU adapters (software drivers need the cores).

        ``encode_ahead``: after submitting a captured graph (a frozen command list), encode its next submission
        right away, while the GPU runs this one, so the next replay only submits (``WgpuDevice.encode_ahead``
        says more).  The host work per replay is the same; it moves off the replay's critical path.
        """
        if spin_wait_us is not None and (
            isinstance(spin_wait_us, bool)
            or not isinstance(spin_wait_us, (int, float))
            or not 0 <= spin_wait_us < float("inf")
        ):
            raise InvalidArgumentError(
                f"spin_wait_us must be a finite number of microseconds >= 0 (0 = no spin), not {spin_wait_us!r}"
            )
        if not isinstance(encode_ahead, bool):
            raise InvalidArgumentError(f"encode_ahead must be True or False, not {encode_ahead!r}")
        self.spin_wait_us = spin_wait_us
        self.encode_ahead = encode_ahead
        ffi, lib = load_native()
        self._ffi = ffi
        self._lib = lib
        self._instance: Any = create_instance(include_opengl)
        self._adapters: list[Any] = enumerate_adapters(self._instance)
        self._infos = [adapter_info(i, adapter) for i, adapter in enumerate(self._adapters)]
        self._devices: weakref.WeakSet[WgpuDevice] = weakref.WeakSet()

    # -- Backend protocol -------------------------------------------------------
    def enumerate_adapters(self) -> list[AdapterInfo]:
        """Every adapter wgpu-native found, in its order (``AdapterInfo.index`` is the position)."""
        return list(self._infos)

    def default_adapter_index(self) -> int:
        """Discrete GPU, else integrated, else CPU (lavapipe), else anything; Vulkan before OpenGL at equal type."""
        return choose_default_adapter(self._infos)

    def adapter_limits(self, adapter_index: int) -> DeviceLimits:
        """The limits adapter ``adapter_index`` supports (a device opened on it gets exactly these)."""
        if not 0 <= adapter_index < len(self._adapters):
            raise ValidationError(f"adapter index {adapter_index} is out of range ({len(self._adapters)} adapters)")
        return _limits_from_native(native_adapter_limits(self._adapters[adapter_index], str(adapter_index)))

    def open_device(self, adapter_index: int) -> WgpuDevice:
        """A device on adapter ``adapter_index``, with the adapter's own limits."""
        if self._instance is None:
            raise DeviceError("this wgpu backend was closed")
        if not 0 <= adapter_index < len(self._adapters):
            raise ValidationError(
                f"adapter index {adapter_index} is out of range: wgpu-native found {len(self._adapters)} adapters"
            )
        device = WgpuDevice._open(self, self._adapters[adapter_index], self._infos[adapter_index])
        self._devices.add(device)
        return device

    def live_handles(self) -> int:
        """Live buffers, pipelines and bind groups over every open device."""
        return sum(device.live_handles() for device in list(self._devices))

    def describe_live_handles(self) -> list[str]:
        """One line per live native object (kind, handle, label), for leak reports."""
        return [line for device in list(self._devices) for line in device.describe_live_handles()]

    def _process_events(self) -> None:
        if self._instance is not None:
            # void wgpuInstanceProcessEvents(WGPUInstance instance)
            self._lib.wgpuInstanceProcessEvents(self._instance)

    # -- lifetime ---------------------------------------------------------------
    def close(self) -> None:
        """Destroy every open device, then release the adapters and the instance.  Idempotent."""
        for device in list(self._devices):
            device.destroy()
        adapters, self._adapters = self._adapters, []
        instance, self._instance = self._instance, None
        for adapter in adapters:
            # void wgpuAdapterRelease(WGPUAdapter adapter)
            self._lib.wgpuAdapterRelease(adapter)
        if instance is not None:
            # void wgpuInstanceRelease(WGPUInstance instance)
            self._lib.wgpuInstanceRelease(instance)

    def __del__(self, warn: Callable[[str], None] = _warn_in_destructor) -> None:
        # warn is bound at definition: at interpreter exit this module's globals may already be None.
        try:
            # Devices hold a reference to the backend, so none is open here.
            adapters, self._adapters = self._adapters, []
            instance, self._instance = self._instance, None
            for adapter in adapters:
                self._lib.wgpuAdapterRelease(adapter)
            if instance is not None:
                self._lib.wgpuInstanceRelease(instance)
        except Exception as error:  # noqa: BLE001 - a destructor never raises
            warn(f"releasing the wgpu instance failed: {error}")
