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
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, TypeVar

from .._errors import (
    DeviceError,
    DeviceLostError,
    InvalidArgumentError,
    OutOfMemoryError,
    ReleasedValueError,
    ValidationError,
)
from ._device_lock import DeviceLock
from . import _cdef
from ._commands import CommandList, NativeTable
from .protocol import BUFFER_ALIGNMENT, AdapterInfo, BindingEntry, DeviceLimits, KernelTwin, host_read_target

__all__ = ["WgpuBackend", "WgpuDevice", "load_native", "feature_name", "choose_default_adapter"]

_LIBRARY_NAME = "libwgpu_native-release.so"

# What a submission appends to a command list, as a dictionary key: the records of its tail (submit_and_read's
# copies into the staging buffer); () for none.
_TailKey = tuple[tuple[Any, ...], ...]

# WebGPU's spelling of the standard features whose C enum names do not convert
# mechanically (CamelCase -> kebab-case) to it.
_FEATURE_NAME_OVERRIDES = {
    "Depth32FloatStencil8": "depth32float-stencil8",
    "TextureCompressionBCSliced3D": "texture-compression-bc-sliced-3d",
    "TextureCompressionASTCSliced3D": "texture-compression-astc-sliced-3d",
    "RG11B10UfloatRenderable": "rg11b10ufloat-renderable",
    "BGRA8UnormStorage": "bgra8unorm-storage",
}
# Features requested at device creation whenever the adapter has them: the
# ones compute kernels may use.  Everything else stays off.
_REQUESTED_FEATURES = (
    "shader-f16",
    "timestamp-query",
    "subgroups",
    "subgroup",
    "subgroup-barrier",
    "shader-f64",
    "shader-int64",
    "timestamp-query-inside-encoders",
    "timestamp-query-inside-passes",
)
# default_adapter_index: lower is preferred.
_ADAPTER_TYPE_RANK = {"DiscreteGPU": 0, "IntegratedGPU": 1, "CPU": 2, "Unknown": 3}
_BACKEND_TYPE_RANK = {"Vulkan": 0, "Metal": 0, "D3D12": 0, "OpenGL": 1, "OpenGLES": 1}
_STAGING_MINIMUM = 1 << 16
# How wgpu-core words the errors of a call on a lost device ("Parent device is lost").
_LOST_MESSAGE = re.compile(r"device is lost", re.IGNORECASE)
# read_buffer polls at most this many times for the map callback before giving up.
_MAP_POLL_ATTEMPTS = 10_000
# wgpu-native 29's command buffer object (the address a WGPUCommandBuffer holds is Rust's Arc data pointer):
# {context: Arc<Global>, id: CommandBufferId, open: AtomicBool}, with the Arc's strong and weak counts in the 16
# bytes before it.  Its wgpuQueueSubmit sets `open` (byte 16) and its release drops the command buffer from
# wgpu-core's registry only when `open` is set, so a command buffer released unsubmitted is never freed (about
# 90 KB each on lavapipe, +100 MB per 1000 graphs released with encode-ahead on).  The wgpu backend checks this
# layout once per process (_probe_submitted_flag) before the command loop writes that byte (see
# NativeTable.submitted_flag_offset).
_SUBMITTED_FLAG_OFFSET = 16
_submitted_flag: int | None = None  # the probed offset (-1: the layout is not the one above); None: not probed
_submitted_flag_lock = threading.Lock()
# Default spin before a blocking wait, on GPU adapters (0 on CPU adapters: there the spinning thread would take
# a core from the driver's own threads).  On the H200 (run 29 of bench/RESULTS.md, `python -m bench --overhead`),
# submit + wait_idle of 16 small dispatches took 95.6 us spinning and 123.5 us blocking; an empty submit 34.2 and
# 29.9 us.
DEFAULT_SPIN_WAIT_US = 2000.0


def native_version() -> str:
    """wgpu-native's own version, e.g. ``"29.0.0.0"`` (from ``wgpuGetVersion``)."""
    _, lib = load_native()
    # uint32_t wgpuGetVersion(void): one byte per component, most significant first
    packed = int(lib.wgpuGetVersion())
    return ".".join(str((packed >> shift) & 0xFF) for shift in (24, 16, 8, 0))


@functools.lru_cache(maxsize=1)
def load_native() -> tuple[Any, Any]:
    """``(ffi, lib)`` for wgpu-native, loaded once per process."""
    import cffi

    ffi = cffi.FFI()
    ffi.cdef(_cdef.generated_cdef_path().read_text(encoding="utf-8"))
    _give_the_driver_a_runtime_dir()
    lib = ffi.dlopen(str(_cdef.wgpu_resources_dir() / _LIBRARY_NAME))
    return ffi, lib


def _give_the_driver_a_runtime_dir() -> None:
    """Mesa's Vulkan drivers print "XDG_RUNTIME_DIR is invalid or not set" (on stderr, several times per process)
    when the variable is unset, as in containers, CI and cron jobs.  Compute needs no display, so when it is unset or
    not a directory, point it at a private (0700) folder of ours; a valid setting is left alone."""
    current = os.environ.get("XDG_RUNTIME_DIR", "")
    if current and os.path.isdir(current):
        return
    folder = tempfile.mkdtemp(prefix="ortgpu-runtime-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ["XDG_RUNTIME_DIR"] = folder


def feature_name(enum_name: str) -> str:
    """WebGPU's name of a feature, from its C enum name without the prefix (``ShaderF16`` -> ``shader-f16``)."""
    if enum_name in _FEATURE_NAME_OVERRIDES:
        return _FEATURE_NAME_OVERRIDES[enum_name]
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", enum_name).lower()


@functools.lru_cache(maxsize=1)
def _feature_tables() -> tuple[dict[int, str], dict[str, int]]:
    """``({enum value: WebGPU name}, {WebGPU name: enum value})`` over standard and native features."""
    ffi, _ = load_native()
    by_value: dict[int, str] = {}
    for type_name, prefix in (("WGPUFeatureName", "WGPUFeatureName_"), ("WGPUNativeFeature", "WGPUNativeFeature_")):
        for value, name in ffi.typeof(type_name).elements.items():
            short = name[len(prefix) :]
            if short not in ("Force32",):
                by_value[int(value)] = feature_name(short)
    return by_value, {name: value for value, name in by_value.items()}


def choose_default_adapter(adapters: Sequence[AdapterInfo]) -> int:
    """The index of the preferred adapter.

    Discrete GPU first, else integrated, else CPU (lavapipe), else anything;
    at equal type Vulkan (or Metal/D3D12) before OpenGL; then the lowest index.
    """
    if not adapters:
        raise DeviceError("wgpu-native found no adapter (is a Vulkan or OpenGL driver installed?)")

    def rank(info: AdapterInfo) -> tuple[int, int, int]:
        return (
            _ADAPTER_TYPE_RANK.get(info.adapter_type, 3),
            _BACKEND_TYPE_RANK.get(info.backend_type, 2),
            info.index,
        )

    return min(adapters, key=rank).index


def _enum_suffix(type_name: str, value: int) -> str:
    ffi, _ = load_native()
    name: str = ffi.typeof(type_name).elements.get(int(value), f"{type_name}_Unknown")
    return name.split("_", 1)[1]


def _string(view: Any) -> str:
    """A ``WGPUStringView`` as ``str`` (it may be NULL, or lack a terminating NUL)."""
    ffi, lib = load_native()
    if view.data == ffi.NULL:
        return ""
    if view.length == lib.WGPU_STRLEN:
        return bytes(ffi.string(view.data)).decode("utf-8", "replace")
    return bytes(ffi.buffer(view.data, view.length)).decode("utf-8", "replace")


def _string_view(text: str, keep: list[Any]) -> Any:
    """A ``WGPUStringView`` over ``text``; the backing memory is appended to ``keep``."""
    ffi, _ = load_native()
    encoded = text.encode("utf-8")
    data = ffi.new("char[]", encoded)
    keep.append(data)
    view = ffi.new("WGPUStringView *")
    view.data = data
    view.length = len(encoded)
    return view[0]


def _address(pointer: Any) -> int:
    ffi, _ = load_native()
    return int(ffi.cast("uintptr_t", pointer))


class _ErrorSink:
    """What the native callbacks report, collected until the backend call returns.

    Holds no reference to the device, so the callbacks (which hold the sink)
    make no reference cycle through it.
    """

    def __init__(self) -> None:
        self.errors: list[tuple[str, str]] = []  # (error type suffix, message)
        self.lost: str | None = None
        self.ignore_lost = False
        self.map_status: int | None = None
        self.map_message = ""
        # wait_idle: the token of the newest wgpuQueueOnSubmittedWorkDone callback that fired (tokens rise, and
        # the callbacks fire in submission order), and the status of one that did not succeed
        self.work_done_token = 0
        self.work_done_failure: str | None = None


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


def _limits_from_native(native: Any) -> DeviceLimits:
    return DeviceLimits(
        max_buffer_size=int(native.maxBufferSize),
        max_storage_buffer_binding_size=int(native.maxStorageBufferBindingSize),
        max_uniform_buffer_binding_size=int(native.maxUniformBufferBindingSize),
        max_storage_buffers_per_shader_stage=int(native.maxStorageBuffersPerShaderStage),
        max_compute_workgroups_per_dimension=int(native.maxComputeWorkgroupsPerDimension),
        max_compute_invocations_per_workgroup=int(native.maxComputeInvocationsPerWorkgroup),
        max_compute_workgroup_size_x=int(native.maxComputeWorkgroupSizeX),
        max_compute_workgroup_size_y=int(native.maxComputeWorkgroupSizeY),
        max_compute_workgroup_size_z=int(native.maxComputeWorkgroupSizeZ),
        max_compute_workgroup_storage_size=int(native.maxComputeWorkgroupStorageSize),
        min_storage_buffer_offset_alignment=int(native.minStorageBufferOffsetAlignment),
        min_uniform_buffer_offset_alignment=int(native.minUniformBufferOffsetAlignment),
    )


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
        keeping one CPU core busy, before it blocks in the driver.  Blocking adds wake-up latency (on the H200,
        submit + wait of 16 small dispatches: 95.6 us spinning, 123.5 us blocking); spinning costs a core while
        the GPU works.  ``None`` (default):
        :data:`DEFAULT_SPIN_WAIT_US` on GPU adapters, 0 on CPU adapters (software drivers need the cores).

        ``encode_ahead``: after submitting a captured graph (a frozen command list), encode its next submission
        right away, while the GPU runs this one, so the next replay only submits (``WgpuDevice.encode_ahead``
        says more).  The host work per replay is the same; it moves off the replay's critical path.
        """
        if spin_wait_us is not None and (
            isinstance(spin_wait_us, bool) or not isinstance(spin_wait_us, (int, float)) or not 0 <= spin_wait_us < float("inf")
        ):
            raise InvalidArgumentError(
                f"spin_wait_us must be a finite number of microseconds >= 0 (0 = always block), not {spin_wait_us!r}"
            )
        if not isinstance(encode_ahead, bool):
            raise InvalidArgumentError(f"encode_ahead must be True or False, not {encode_ahead!r}")
        self.spin_wait_us = spin_wait_us
        self.encode_ahead = encode_ahead
        ffi, lib = load_native()
        self._ffi = ffi
        self._lib = lib
        extras = ffi.new("WGPUInstanceExtras *")
        extras.chain.sType = lib.WGPUSType_InstanceExtras
        extras.backends = lib.WGPUInstanceBackend_All if include_opengl else lib.WGPUInstanceBackend_Primary
        descriptor = ffi.new("WGPUInstanceDescriptor *")
        descriptor.nextInChain = ffi.cast("WGPUChainedStruct *", extras)
        # WGPUInstance wgpuCreateInstance(WGPUInstanceDescriptor const * descriptor)
        instance = lib.wgpuCreateInstance(descriptor)
        if instance == ffi.NULL:
            raise DeviceError("wgpu-native could not create an instance")
        self._instance: Any = instance
        # size_t wgpuInstanceEnumerateAdapters(WGPUInstance, WGPUInstanceEnumerateAdapterOptions const *, WGPUAdapter *)
        count = int(lib.wgpuInstanceEnumerateAdapters(instance, ffi.NULL, ffi.NULL))
        adapters = ffi.new("WGPUAdapter[]", max(count, 1))
        count = int(lib.wgpuInstanceEnumerateAdapters(instance, ffi.NULL, adapters))
        self._adapters: list[Any] = [adapters[i] for i in range(count)]
        self._infos = [self._adapter_info(i, adapter) for i, adapter in enumerate(self._adapters)]
        self._devices: weakref.WeakSet[WgpuDevice] = weakref.WeakSet()

    def _adapter_info(self, index: int, adapter: Any) -> AdapterInfo:
        ffi, lib = self._ffi, self._lib
        info = ffi.new("WGPUAdapterInfo *")
        # WGPUStatus wgpuAdapterGetInfo(WGPUAdapter adapter, WGPUAdapterInfo * info)
        if lib.wgpuAdapterGetInfo(adapter, info) != lib.WGPUStatus_Success:
            raise DeviceError(f"wgpuAdapterGetInfo failed for adapter {index}")
        try:
            device_name = _string(info.device)
            description = _string(info.description)
            return AdapterInfo(
                index=index,
                vendor_id=int(info.vendorID),
                device_id=int(info.deviceID),
                name=device_name or _string(info.vendor),
                driver=description,
                backend_type=_enum_suffix("WGPUBackendType", info.backendType),
                adapter_type=_enum_suffix("WGPUAdapterType", info.adapterType),
            )
        finally:
            # void wgpuAdapterInfoFreeMembers(WGPUAdapterInfo adapterInfo)
            lib.wgpuAdapterInfoFreeMembers(info[0])

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
        native = self._ffi.new("WGPULimits *")
        # WGPUStatus wgpuAdapterGetLimits(WGPUAdapter adapter, WGPULimits * limits)
        if self._lib.wgpuAdapterGetLimits(self._adapters[adapter_index], native) != self._lib.WGPUStatus_Success:
            raise DeviceError(f"wgpuAdapterGetLimits failed for adapter {adapter_index}")
        return _limits_from_native(native)

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

    def __del__(self) -> None:
        try:
            # Devices hold a reference to the backend, so none is open here.
            adapters, self._adapters = self._adapters, []
            instance, self._instance = self._instance, None
            for adapter in adapters:
                self._lib.wgpuAdapterRelease(adapter)
            if instance is not None:
                self._lib.wgpuInstanceRelease(instance)
        except Exception:  # noqa: BLE001 - a destructor never raises (interpreter exit)
            pass


_Method = TypeVar("_Method", bound=Callable[..., Any])
_T = TypeVar("_T")


def _serialized(method: _Method) -> _Method:
    """Run a device method under the device's lock.

    wgpu-native reports errors through one callback per device; holding the
    lock from the call until its errors are checked attributes each error to
    the call (and thread) that caused it.  Encoding itself runs with the GIL
    released, so other Python threads still run meanwhile.
    """

    @functools.wraps(method)
    def locked(self: "WgpuDevice", *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked  # type: ignore[return-value]


class WgpuDevice:
    """An open wgpu-native device and its queue (implements ``BackendDevice``).

    Made only by :meth:`WgpuBackend.open_device`.

    ``encode_ahead`` (from the backend; may be switched per device): submitting a captured graph's frozen command
    list encodes its *next* command buffer right after the submit, while the GPU works, so the next replay only
    submits: wgpu-native's ``wgpuCommandEncoderFinish`` (about 1-2 us per dispatch on the H200) leaves the replay's
    critical path.  One command buffer per graph (and per set of output reads) is held between replays; it is
    released with the graph, with any handle it uses, when the staging buffer it copies into is replaced, and by
    :meth:`destroy`; :meth:`live_handles` counts it.  Released unsubmitted, wgpu-native 29 would never free it
    (about 90 KB of host memory each on lavapipe): the release first sets the flag wgpu-native's submit sets
    (``NativeTable.submitted_flag_offset``, probed once per process), so it is freed like a submitted one.  Where
    the probe does not recognise wgpu-native's command buffers, ``encode_ahead`` starts off on the device.
    """

    info: AdapterInfo
    limits: DeviceLimits
    features: frozenset[str]
    encode_ahead: bool

    def __init__(self) -> None:
        raise TypeError("WgpuDevice objects are made by WgpuBackend.open_device()")

    @classmethod
    def _open(cls, backend: WgpuBackend, adapter: Any, info: AdapterInfo) -> WgpuDevice:
        self = cls.__new__(cls)
        self._init(backend, adapter, info)
        return self

    def _init(self, backend: WgpuBackend, adapter: Any, info: AdapterInfo) -> None:
        ffi, lib = load_native()
        self._ffi = ffi
        self._lib = lib
        self._backend = backend
        self._device: Any = None
        self._queue: Any = None
        self._lock = DeviceLock()  # see _serialized; releases from finalizers mid-call are deferred
        self._destroy_callbacks: list[Callable[[], None]] = []
        self._callbacks_lock = threading.Lock()
        self._callbacks_done = False
        self._handles: dict[int, _Handle] = {}
        # Frozen command lists (captured graphs) validated once: id -> (weak reference, handles they use).
        # Releasing any of those handles forgets the validation, so the next submit checks again.
        self._validated: dict[int, tuple[weakref.ref[CommandList], frozenset[int]]] = {}
        self._validated_by_handle: dict[int, set[int]] = {}
        # Command buffers encoded ahead for validated frozen lists: (list id, tail key) -> command buffer address.
        # An entry lives only as long as the list's validation: releasing a handle the list uses, the list dying,
        # the staging buffer being replaced (tails copy into it) or the device being destroyed releases it.
        self._ahead: dict[tuple[int, _TailKey], int] = {}
        self.encode_ahead = backend.encode_ahead
        self._staging: Any = None
        self._staging_size = 0
        self._sink = sink = _ErrorSink()
        self.info = info
        spin = backend.spin_wait_us
        if spin is None:
            spin = 0.0 if info.adapter_type == "CPU" else DEFAULT_SPIN_WAIT_US
        self.spin_wait_us = float(spin)

        # Callbacks: never raise into native code (cffi's onerror would print).
        # Counts every error; the command list's C loop reads it to avoid
        # submitting a command buffer that Finish reported invalid.
        self._error_count = error_count = ffi.new("uint32_t *")

        def on_uncaptured_error(device: Any, error_type: int, message: Any, userdata1: Any, userdata2: Any) -> None:
            error_count[0] += 1
            try:
                sink.errors.append((_enum_suffix("WGPUErrorType", error_type), _string(message)))
            except Exception:  # noqa: BLE001
                sink.errors.append(("Unknown", "(the error message could not be read)"))

        def on_device_lost(device: Any, reason: int, message: Any, userdata1: Any, userdata2: Any) -> None:
            try:
                if not sink.ignore_lost:
                    sink.lost = f"{_enum_suffix('WGPUDeviceLostReason', reason)}: {_string(message)}"
            except Exception:  # noqa: BLE001
                sink.lost = "(reason unreadable)"

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
        self._on_uncaptured_error = ffi.callback("WGPUUncapturedErrorCallback", on_uncaptured_error)
        self._on_device_lost = ffi.callback("WGPUDeviceLostCallback", on_device_lost)
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

        adapter_limits = ffi.new("WGPULimits *")
        # WGPUStatus wgpuAdapterGetLimits(WGPUAdapter adapter, WGPULimits * limits)
        if lib.wgpuAdapterGetLimits(adapter, adapter_limits) != lib.WGPUStatus_Success:
            raise DeviceError(f"wgpuAdapterGetLimits failed for adapter {info.index} ({info.name})")

        _, feature_values = _feature_tables()
        requested = [
            feature_values[name]
            for name in _REQUESTED_FEATURES
            # WGPUBool wgpuAdapterHasFeature(WGPUAdapter adapter, WGPUFeatureName feature)
            if name in feature_values and lib.wgpuAdapterHasFeature(adapter, feature_values[name])
        ]
        required_features = ffi.new("WGPUFeatureName[]", max(len(requested), 1))
        for i, value in enumerate(requested):
            required_features[i] = value

        keep: list[Any] = []
        descriptor = ffi.new("WGPUDeviceDescriptor *")
        descriptor.label = _string_view(f"ortgpu device on adapter {info.index}", keep)
        descriptor.requiredFeatureCount = len(requested)
        descriptor.requiredFeatures = required_features
        descriptor.requiredLimits = adapter_limits
        descriptor.deviceLostCallbackInfo.mode = lib.WGPUCallbackMode_AllowSpontaneous
        descriptor.deviceLostCallbackInfo.callback = self._on_device_lost
        descriptor.uncapturedErrorCallbackInfo.callback = self._on_uncaptured_error

        result: dict[str, Any] = {}

        def on_device(status: int, device: Any, message: Any, userdata1: Any, userdata2: Any) -> None:
            try:
                result["status"] = int(status)
                result["device"] = device
                result["message"] = _string(message)
            except Exception:  # noqa: BLE001
                result.setdefault("status", -1)

        on_device_callback = ffi.callback("WGPURequestDeviceCallback", on_device)
        callback_info = ffi.new("WGPURequestDeviceCallbackInfo *")
        callback_info.mode = lib.WGPUCallbackMode_AllowSpontaneous
        callback_info.callback = on_device_callback
        # WGPUFuture wgpuAdapterRequestDevice(WGPUAdapter, WGPUDeviceDescriptor const *, WGPURequestDeviceCallbackInfo)
        lib.wgpuAdapterRequestDevice(adapter, descriptor, callback_info[0])
        for _ in range(1000):
            if "status" in result:
                break
            backend._process_events()
        if result.get("status") != lib.WGPURequestDeviceStatus_Success or result.get("device") in (None, ffi.NULL):
            raise DeviceError(
                f"wgpu-native could not open a device on adapter {info.index} ({info.name}, "
                f"{info.backend_type}): {result.get('message', 'the request never completed')}"
            )
        self._device = result["device"]
        # WGPUQueue wgpuDeviceGetQueue(WGPUDevice device)
        self._queue = lib.wgpuDeviceGetQueue(self._device)

        native_limits = ffi.new("WGPULimits *")
        # WGPUStatus wgpuDeviceGetLimits(WGPUDevice device, WGPULimits * limits)
        lib.wgpuDeviceGetLimits(self._device, native_limits)
        self.limits = _limits_from_native(native_limits)

        supported = ffi.new("WGPUSupportedFeatures *")
        # void wgpuDeviceGetFeatures(WGPUDevice device, WGPUSupportedFeatures * features)
        lib.wgpuDeviceGetFeatures(self._device, supported)
        feature_names, _ = _feature_tables()
        try:
            self.features = frozenset(
                feature_names[int(supported.features[i])]
                for i in range(supported.featureCount)
                if int(supported.features[i]) in feature_names
            )
        finally:
            # void wgpuSupportedFeaturesFreeMembers(WGPUSupportedFeatures supportedFeatures)
            lib.wgpuSupportedFeaturesFreeMembers(supported[0])

        self._native_table = NativeTable(
            _address(self._device),
            _address(self._queue),
            {name: _address(ffi.addressof(lib, "wgpu" + name)) for name in NativeTable.entry_point_names()},
            _address(self._error_count),
        )
        self._raise_pending("opening the device")
        self._native_table.submitted_flag_offset = self._submitted_flag_offset()
        if self._native_table.submitted_flag_offset < 0:
            # Each graph released with a command buffer encoded ahead would leak it (see _SUBMITTED_FLAG_OFFSET):
            # off by default on a wgpu-native whose command buffers do not have the layout checked for.
            self.encode_ahead = False

    def _submitted_flag_offset(self) -> int:
        """The offset of wgpu-native's "submitted" flag in its command buffer object, probed on the first device
        opened in the process; -1 when the object does not have the expected layout."""
        global _submitted_flag
        with _submitted_flag_lock:
            if _submitted_flag is None:
                _submitted_flag = self._probe_submitted_flag()
            return _submitted_flag

    def _probe_submitted_flag(self) -> int:
        """Submit one empty command buffer (kept alive by an extra reference) and check that the submit changed
        exactly the expected byte, from 0 to 1, and that the object is an Arc's data (its strong count, in the 8
        bytes 16 before it, goes from 2 to 1 as submit_encoded releases one reference)."""
        ffi, lib = self._ffi, self._lib
        address = CommandList().encode_native(self._native_table)
        self._raise_pending("opening the device (probing wgpu-native's command buffers)")
        if not address:
            return -1
        pointer = ffi.cast("WGPUCommandBuffer", address)
        data = ffi.cast("uint8_t *", address)
        strong = ffi.cast("uint64_t *", address - 16)
        size = _SUBMITTED_FLAG_OFFSET + 8
        # void wgpuCommandBufferAddRef(WGPUCommandBuffer commandBuffer)
        lib.wgpuCommandBufferAddRef(pointer)
        try:
            counts_before = int(strong[0])
            before = bytes(ffi.buffer(data, size))
            self._native_table.submit_encoded(address)  # submits, then releases one reference
            after = bytes(ffi.buffer(data, size))
            counts_after = int(strong[0])
        finally:
            lib.wgpuCommandBufferRelease(pointer)
        self._raise_pending("opening the device (probing wgpu-native's command buffers)")
        changed = [i for i in range(size) if before[i] != after[i]]
        expected = (
            changed == [_SUBMITTED_FLAG_OFFSET]
            and before[_SUBMITTED_FLAG_OFFSET] == 0
            and after[_SUBMITTED_FLAG_OFFSET] == 1
            and (counts_before, counts_after) == (2, 1)
        )
        return _SUBMITTED_FLAG_OFFSET if expected else -1

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
            self._sink.errors = []

    def _raise_pending(self, action: str) -> None:
        """Raise what the callbacks collected during ``action`` as a typed exception."""
        sink = self._sink
        if sink.errors:
            errors, sink.errors = sink.errors, []
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
        handle = _address(pointer)
        self._handles[handle] = _Handle("buffer", pointer, size=size, uniform=uniform, label=label)
        return handle

    def _native_buffer(self, size: int, usage: int, label: str, action: str) -> Any:
        ffi, lib = self._ffi, self._lib
        keep: list[Any] = []
        descriptor = ffi.new("WGPUBufferDescriptor *")
        descriptor.label = _string_view(label, keep)
        descriptor.usage = usage
        descriptor.size = size
        descriptor.mappedAtCreation = 0
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

    def _free_buffer(self, pointer: Any) -> None:
        # void wgpuBufferDestroy(WGPUBuffer buffer); void wgpuBufferRelease(WGPUBuffer buffer)
        self._lib.wgpuBufferDestroy(pointer)
        self._lib.wgpuBufferRelease(pointer)

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
        self._forget_validation(buffer)
        self._free_buffer(record.pointer)
        self._raise_pending_unless_lost(f"destroy_buffer({buffer:#x})")

    def buffer_size(self, buffer: int) -> int:
        """The size in bytes of a live buffer."""
        return self._lookup(buffer, "buffer", "buffer_size").size

    @_serialized
    def write_buffer(self, buffer: int, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Queue write of ``data`` at ``offset`` (ordered with submissions; see the protocol)."""
        self._check_open()
        view = memoryview(data)
        if not view.c_contiguous:
            view = memoryview(view.tobytes())
        size = view.nbytes
        action = f"write_buffer({buffer:#x}, offset={offset}, {size} bytes)"
        record = self._lookup(buffer, "buffer", action)
        self._check_aligned(action, offset=offset, size=size)
        if offset + size > record.size:
            raise ValidationError(f"{action}: the write ends at {offset + size}, past the buffer's {record.size} bytes")
        if size == 0:
            return
        # void wgpuQueueWriteBuffer(WGPUQueue, WGPUBuffer, uint64_t bufferOffset, void const * data, size_t size)
        self._lib.wgpuQueueWriteBuffer(self._queue, record.pointer, offset, self._ffi.from_buffer(view), size)
        self._raise_pending(action)

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
            view, padded = self._read_target(buffer, offset, out, f"submit_and_read: read {index} ({buffer:#x}, offset={offset})")
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
                lib.wgpuDeviceCreateComputePipeline(self._device, pipeline_descriptor), lib.wgpuComputePipelineRelease, action
            )
        finally:
            if module != ffi.NULL:
                # void wgpuShaderModuleRelease(WGPUShaderModule shaderModule)
                lib.wgpuShaderModuleRelease(module)
        if pipeline == ffi.NULL:
            raise ValidationError(f"{action}: wgpu-native returned no pipeline")
        handle = _address(pipeline)
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
            bind_group = self._created(lib.wgpuDeviceCreateBindGroup(self._device, descriptor), lib.wgpuBindGroupRelease, action)
        finally:
            if layout != ffi.NULL:
                # void wgpuBindGroupLayoutRelease(WGPUBindGroupLayout bindGroupLayout)
                lib.wgpuBindGroupLayoutRelease(layout)
        if bind_group == ffi.NULL:
            raise ValidationError(f"{action}: wgpu-native returned no bind group")
        handle = _address(bind_group)
        self._handles[handle] = _Handle(
            "bind_group", bind_group, buffers=tuple(e.buffer for e in entries), pipeline=pipeline
        )
        return handle

    @_serialized
    def release_bind_group(self, bind_group: int) -> None:
        """Free the bind group (always allowed, as :meth:`destroy_buffer`)."""
        if self._lock.defer_if_nested(lambda: self.release_bind_group(bind_group)) or self._device is None:
            return
        record = self._lookup(bind_group, "bind_group", "release_bind_group")
        del self._handles[bind_group]
        self._forget_validation(bind_group)
        # void wgpuBindGroupRelease(WGPUBindGroup bindGroup)
        self._lib.wgpuBindGroupRelease(record.pointer)

    # -- submission ---------------------------------------------------------------------
    @property
    def native_table(self) -> NativeTable:
        """The wgpu-native entry points and this device's device/queue pointers (for the replay loop)."""
        self._check_open()
        return self._native_table

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
            else:
                _, buffer, offset, size = record
                buffer_record = self._lookup(buffer, "buffer", where)
                self._check_aligned(where, offset=offset, size=size)
                if offset + size > buffer_record.size:
                    raise ValidationError(f"{where}: the clear of {size} bytes runs past the end of the buffer")

    def _forget_validation(self, handle: int) -> None:
        for list_id in self._validated_by_handle.pop(handle, ()):
            self._forget_list(list_id)

    def _validated_once(self, commands: CommandList) -> bool:
        entry = self._validated.get(id(commands))
        return entry is not None and entry[0]() is commands

    def _remember_validation(self, commands: CommandList) -> None:
        used: set[int] = set()
        for record in commands.records():
            if record[0] == "dispatch":
                used.update((record[1], record[2]))
                used.update(self._handles[record[2]].buffers)
            elif record[0] == "copy":
                used.update((record[1], record[3]))
            else:
                used.add(record[1])
        list_id = id(commands)
        self._validated[list_id] = (weakref.ref(commands, lambda _: self._list_died(list_id)), frozenset(used))
        for handle in used:
            self._validated_by_handle.setdefault(handle, set()).add(list_id)

    @_serialized
    def submit(self, commands: CommandList) -> None:
        """Validate, then encode ``commands`` in order and submit them as one command buffer.

        Encoding runs in C with the GIL released.  A frozen list (a captured
        graph's) is validated on its first submit only, until one of the
        handles it uses is released: replay pays no per-record Python work.
        """
        self._check_open()
        self._validate_for_submit(commands)
        submitted = self._encode_and_submit(commands, None)
        action = f"submit ({len(commands)} commands)"
        self._raise_pending(action)
        if not submitted:
            raise DeviceError(f"{action}: wgpu-native could not encode the command buffer")

    def _encode_and_submit(self, commands: CommandList, tail: CommandList | None) -> bool:
        """Submit ``commands`` then ``tail`` as one submission; False when wgpu-native could not encode them.

        A validated frozen list (a captured graph's) is submitted from the command buffer encoded ahead for it
        (and this tail), when there is one; either way, with :attr:`encode_ahead` on, its next command buffer is
        encoded right after this submit, while the GPU works.  The work and its order are the same as encoding
        now: a command buffer names buffers, and reads their contents when it runs in the queue.
        """
        table = self._native_table
        list_id = id(commands)
        ahead = commands.frozen and self.encode_ahead and list_id in self._validated
        if not ahead and commands.frozen and self._ahead:
            self._release_ahead(lambda key: key[0] == list_id)  # encode_ahead was switched off
        ready = 0
        if ahead:
            key = (list_id, () if tail is None else tuple(tail.records()))
            ready = self._ahead.pop(key, 0)
        if ready:
            table.submit_encoded(ready)
        elif not (commands.encode_submit_native(table) if tail is None else commands.encode_submit_with_tail_native(table, tail)):
            return False
        if ahead:
            encoded = commands.encode_native(table, tail)
            if encoded:
                self._ahead[key] = encoded
        return True

    def _release_ahead(self, which: Callable[[tuple[int, _TailKey]], bool]) -> None:
        """Release the command buffers encoded ahead whose (list id, tail key) ``which`` selects.  Each entry is
        popped before it is released, so a list's weak-reference callback racing this releases nothing twice."""
        for key in [key for key in list(self._ahead) if which(key)]:
            command_buffer = self._ahead.pop(key, 0)
            if command_buffer:
                self._native_table.release_encoded(command_buffer)

    def _list_died(self, list_id: int) -> None:
        """A validated frozen list was collected (a weak-reference callback: any thread, maybe mid-call)."""
        with self._lock:
            if not self._lock.defer_if_nested(lambda: self._list_died(list_id)):
                self._forget_list(list_id)

    def _forget_list(self, list_id: int) -> None:
        """A validated frozen list died: forget its validation and release what was encoded ahead for it."""
        self._validated.pop(list_id, None)
        if self._ahead and self._device is not None:
            self._release_ahead(lambda key: key[0] == list_id)

    def _validate_for_submit(self, commands: CommandList) -> None:
        """:meth:`validate_commands`, once per frozen list (until a handle it uses is released)."""
        if not (commands.frozen and self._validated_once(commands)):
            self.validate_commands(commands)
            if commands.frozen:
                self._remember_validation(commands)

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

    # -- lifetime -------------------------------------------------------------------------
    def live_handles(self) -> int:
        """Live buffers, pipelines and bind groups created through this device, and command buffers encoded
        ahead for captured graphs (the staging buffer excluded)."""
        return len(self._handles) + len(self._ahead)

    def describe_live_handles(self) -> list[str]:
        """One line per live native object of this device (kind, handle, label)."""
        return [f"{self.info.name}: {record.kind} {handle:#x} ({record.label!r})" for handle, record in self._handles.items()] + [
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
        """Release the staging buffer, every live handle, the queue and the device, then call the destroy
        callbacks (outside the device's lock).  Idempotent."""
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
        self._sink.ignore_lost = True
        self._release_ahead(lambda key: True)
        self._device = None
        handles, self._handles = self._handles, {}
        order = {"bind_group": 0, "pipeline": 1, "buffer": 2}
        for record in sorted(handles.values(), key=lambda r: order[r.kind]):
            if record.kind == "bind_group":
                lib.wgpuBindGroupRelease(record.pointer)
            elif record.kind == "pipeline":
                lib.wgpuComputePipelineRelease(record.pointer)
            else:
                self._free_buffer(record.pointer)
        staging, self._staging, self._staging_size = self._staging, None, 0
        if staging is not None:
            self._free_buffer(staging)
        queue, self._queue = self._queue, None
        if queue is not None:
            # void wgpuQueueRelease(WGPUQueue queue)
            lib.wgpuQueueRelease(queue)
        # void wgpuDeviceDestroy(WGPUDevice device); void wgpuDeviceRelease(WGPUDevice device)
        lib.wgpuDeviceDestroy(device)
        lib.wgpuDeviceRelease(device)
        self._sink.errors.clear()

    def __del__(self) -> None:
        try:
            self.destroy()
        except Exception:  # noqa: BLE001 - a destructor never raises (interpreter exit)
            pass

    def __repr__(self) -> str:
        state = "destroyed" if self.destroyed else f"{self.live_handles()} live handles"
        return f"<WgpuDevice adapter {self.info.index} {self.info.name!r} ({self.info.backend_type}), {state}>"
