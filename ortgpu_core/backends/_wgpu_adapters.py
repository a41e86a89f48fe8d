"""wgpu-native's instance and adapters: creating the instance, listing and describing adapters, reading limits
and features, choosing the default adapter, and requesting a device on one.

Functions over native objects their callers own (``WgpuBackend`` owns the instance and the adapters, a
``WgpuDevice`` its device); they keep no state of their own, so they need no lock.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from .._errors import DeviceError
from ._wgpu_ffi import _enum_suffix, _feature_tables, _string, _string_view, load_native
from .protocol import AdapterInfo, DeviceLimits

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


def create_instance(include_opengl: bool) -> Any:
    """A new ``WGPUInstance`` over the primary backends (Vulkan, Metal, D3D12), and OpenGL(ES) with
    ``include_opengl``."""
    ffi, lib = load_native()
    extras = ffi.new("WGPUInstanceExtras *")
    extras.chain.sType = lib.WGPUSType_InstanceExtras
    extras.backends = lib.WGPUInstanceBackend_All if include_opengl else lib.WGPUInstanceBackend_Primary
    descriptor = ffi.new("WGPUInstanceDescriptor *")
    descriptor.nextInChain = ffi.cast("WGPUChainedStruct *", extras)
    # WGPUInstance wgpuCreateInstance(WGPUInstanceDescriptor const * descriptor)
    instance = lib.wgpuCreateInstance(descriptor)
    if instance == ffi.NULL:
        raise DeviceError("wgpu-native could not create an instance")
    return instance


def enumerate_adapters(instance: Any) -> list[Any]:
    """Every adapter (``WGPUAdapter``) ``instance`` finds, in wgpu-native's order."""
    ffi, lib = load_native()
    # size_t wgpuInstanceEnumerateAdapters(WGPUInstance, WGPUInstanceEnumerateAdapterOptions const *, WGPUAdapter *)
    count = int(lib.wgpuInstanceEnumerateAdapters(instance, ffi.NULL, ffi.NULL))
    adapters = ffi.new("WGPUAdapter[]", max(count, 1))
    count = int(lib.wgpuInstanceEnumerateAdapters(instance, ffi.NULL, adapters))
    return [adapters[i] for i in range(count)]


def adapter_info(index: int, adapter: Any) -> AdapterInfo:
    """What ``adapter`` (listed at ``index``) says about itself."""
    ffi, lib = load_native()
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


def native_adapter_limits(adapter: Any, which: str) -> Any:
    """``adapter``'s limits, as a native ``WGPULimits *`` (``which`` names the adapter in the error)."""
    ffi, lib = load_native()
    native = ffi.new("WGPULimits *")
    # WGPUStatus wgpuAdapterGetLimits(WGPUAdapter adapter, WGPULimits * limits)
    if lib.wgpuAdapterGetLimits(adapter, native) != lib.WGPUStatus_Success:
        raise DeviceError(f"wgpuAdapterGetLimits failed for adapter {which}")
    return native


def request_device(
    adapter: Any,
    info: AdapterInfo,
    on_device_lost: Any,
    on_uncaptured_error: Any,
    userdata: Any,
    process_events: Callable[[], None],
) -> Any:
    """A new ``WGPUDevice`` on ``adapter``, with the adapter's own limits and the :data:`_REQUESTED_FEATURES` it
    has.  ``on_device_lost`` and ``on_uncaptured_error`` are the device's callbacks (function pointers, called
    with ``userdata`` as their userdata1; the caller keeps what they use alive as long as the device);
    ``process_events`` drives the instance until the request completes."""
    ffi, lib = load_native()
    adapter_limits = native_adapter_limits(adapter, f"{info.index} ({info.name})")

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
    descriptor.deviceLostCallbackInfo.callback = on_device_lost
    descriptor.deviceLostCallbackInfo.userdata1 = userdata
    descriptor.uncapturedErrorCallbackInfo.callback = on_uncaptured_error
    descriptor.uncapturedErrorCallbackInfo.userdata1 = userdata

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
        process_events()
    if result.get("status") != lib.WGPURequestDeviceStatus_Success or result.get("device") in (None, ffi.NULL):
        raise DeviceError(
            f"wgpu-native could not open a device on adapter {info.index} ({info.name}, "
            f"{info.backend_type}): {result.get('message', 'the request never completed')}"
        )
    return result["device"]


def device_limits(device: Any) -> DeviceLimits:
    """The limits of an open ``device``."""
    ffi, lib = load_native()
    native_limits = ffi.new("WGPULimits *")
    # WGPUStatus wgpuDeviceGetLimits(WGPUDevice device, WGPULimits * limits)
    lib.wgpuDeviceGetLimits(device, native_limits)
    return _limits_from_native(native_limits)


def device_features(device: Any) -> frozenset[str]:
    """The WebGPU names of the features enabled on an open ``device``."""
    ffi, lib = load_native()
    supported = ffi.new("WGPUSupportedFeatures *")
    # void wgpuDeviceGetFeatures(WGPUDevice device, WGPUSupportedFeatures * features)
    lib.wgpuDeviceGetFeatures(device, supported)
    feature_names, _ = _feature_tables()
    try:
        return frozenset(
            feature_names[int(supported.features[i])]
            for i in range(supported.featureCount)
            if int(supported.features[i]) in feature_names
        )
    finally:
        # void wgpuSupportedFeaturesFreeMembers(WGPUSupportedFeatures supportedFeatures)
        lib.wgpuSupportedFeaturesFreeMembers(supported[0])
