# Internal contract of Env and Device.

cdef class Env

cdef class Device:
    cdef readonly int index
    cdef readonly int adapter_index
    cdef readonly int vendor_id
    cdef readonly int device_id
    cdef readonly str name
    cdef readonly str driver
    cdef readonly str backend_type
    cdef readonly str adapter_type
    cdef readonly long long env_id
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
    cdef readonly str backend_name
    cdef readonly str execution_mode
    cdef object _backend
    cdef list _devices
    cdef dict _shared_allocators
    cdef object _sessions
    cdef object _lock
    cdef bint _closed
    cdef object __weakref__
    cpdef check_open(self)
