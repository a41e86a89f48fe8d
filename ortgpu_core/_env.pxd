# Internal contract of Env and Device.

cdef class Env

cdef class Device:
    cdef readonly int index
    """The device's position in ``env.devices``."""
    cdef readonly int adapter_index
    """The adapter's index in the backend's enumeration (``Env(devices=...)`` may skip some)."""
    cdef readonly int vendor_id
    """The adapter's PCI vendor id (e.g. 0x10de for NVIDIA); part of the identity transfers are routed by."""
    cdef readonly int device_id
    """The adapter's PCI device id; with ``vendor_id``, the identity transfers are routed by."""
    cdef readonly str name
    """The adapter's name as the driver reports it."""
    cdef readonly str driver
    """The driver's description (name and version) as the backend reports it."""
    cdef readonly str backend_type
    """The native API under the adapter: "Vulkan", "Metal", "D3D12", "OpenGL", or "Fake"."""
    cdef readonly str adapter_type
    """"DiscreteGPU", "IntegratedGPU", "CPU" (a software rasterizer such as lavapipe) or "Unknown"."""
    cdef readonly long long env_id
    """The id of the Env that opened the device (values carry it in their provenance)."""
    cdef object _env_ref
    cdef object _backend
    cdef object _backend_device
    cdef object _lock
    cdef bint _closed
    cdef object __weakref__

    @staticmethod
    cdef Device _create(Env env, object backend, object info, int index)
    cpdef object _native_device(self)
    cdef void _close(self)

cdef class Env:
    cdef readonly long long id
    """A number unique to this Env in the process; provenance names the Env by it."""
    cdef readonly str backend_name
    """The backend the Env opened: "wgpu" (wgpu-native) or "fake" (numpy, for tests)."""
    cdef readonly str execution_mode
    """"concurrent" (each device serializes its own native calls) or "serialized" (every submit also takes one
    Env-wide lock)."""
    cdef object _backend
    cdef list _devices
    cdef dict _shared_allocators
    cdef object _sessions
    cdef object _lock
    cdef bint _closed
    cdef object __weakref__
    cpdef check_open(self)
