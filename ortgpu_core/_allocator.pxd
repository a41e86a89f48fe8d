from ._env cimport Device, Env

cdef class DeviceAllocator:
    cdef readonly Device device
    """The device whose memory the allocator's values live in."""
    cdef readonly str kind
    """"shared" (the Env's, bindable by every session on the device) or "session" (one session's own)."""
    cdef readonly object session_id
    """The owning session's id for a session allocator; None for the Env's shared one."""
    cdef readonly long long env_id
    """The id of the Env the allocator belongs to."""
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
