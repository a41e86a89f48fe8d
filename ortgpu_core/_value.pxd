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
    cdef readonly int vendor_id
    cdef readonly int device_id
    cdef readonly object device
    cdef readonly str allocator_kind
    cdef readonly object session_id
    cdef readonly object env_id

cdef class OrtValue:
    cdef readonly Provenance provenance
    cdef object _array
    cdef DeviceBuffer _buffer
    cdef tuple _shape
    cdef object _dtype
    cdef Py_ssize_t _nbytes
    cdef bint _released
    cdef object __weakref__
    cdef int _check_usable(self, str what) except -1
    cdef DeviceBuffer device_buffer(self)
    cdef OrtValue _host_copy(self, str what)

cdef OrtValue make_device_value(DeviceBuffer buffer, tuple shape, object dtype, Provenance provenance)
cdef OrtValue make_cpu_value(object array)
