from ._env cimport Device, Env

cdef class DeviceAllocator:
    cdef readonly Device device
    cdef readonly str kind
    cdef readonly object session_id
    cdef readonly long long env_id
    cdef object _env_ref
    cdef object _buffers
    cdef object _lock
    cdef bint _closed
    cdef str _closed_reason
    cdef object _provenance
    cdef object __weakref__
    cdef void _setup(self, Env env, Device device, str kind, object session_id)
    cpdef check_open(self)
    cdef _close_buffers(self, list buffers, object reason, bint force)
