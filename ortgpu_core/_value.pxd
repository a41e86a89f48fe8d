# Internal contract of device buffers, provenance and OrtValue.
from ._env cimport Device

cdef class DeviceBuffer:
    cdef readonly Device device
    cdef readonly object handle
    cdef readonly Py_ssize_t nbytes
    cdef readonly unsigned long long generation
    cdef readonly object owner_description
    cdef list _pins
    cdef bint _released
    cdef str _release_reason
    cdef object __weakref__
    cdef int check_alive(self, str what) except -1
    cpdef release(self, str reason=*)
    # Pins are taken and dropped only by the core (a graph's PinSet), never from Python.
    cdef int pin(self, object label) except -1
    cdef void unpin(self, object label)
    cdef void force_release(self, str reason)

cdef class Provenance:
    cdef readonly str placement
    """"webgpu" for a device value, "cpu" for a host value."""
    cdef readonly int vendor_id
    """The PCI vendor id of the value's device (0 for a host value)."""
    cdef readonly int device_id
    """The PCI device id of the value's device (0 for a host value)."""
    cdef readonly object device
    """The :class:`Device` holding the value, or None for a host value."""
    cdef readonly str allocator_kind
    """"shared", "session", or "host": which allocator made the value."""
    cdef readonly object session_id
    """The owning session's id, for a value of a session allocator; else None."""
    cdef readonly object env_id
    """The id of the Env the value belongs to, or None for a host value."""

cdef class OrtValue:
    cdef readonly Provenance provenance
    """Where the value lives and who owns it; checked whenever the value is bound or copied."""
    cdef object _array
    cdef DeviceBuffer _buffer
    cdef tuple _shape
    cdef object _dtype
    cdef Py_ssize_t _nbytes
    cdef bint _released
    cdef object _sparse  # the SparseTensor a CPU value holds instead of an array (None for a dense value)
    cdef object __weakref__
    cdef int _check_usable(self, str what) except -1
    cdef DeviceBuffer device_buffer(self)
    cdef OrtValue _host_copy(self, str what)

cdef OrtValue make_device_value(DeviceBuffer buffer, tuple shape, object dtype, Provenance provenance)
cdef OrtValue make_cpu_value(object array)
