from libc.stddef cimport size_t

cdef void host_copy(void* destination, const void* source, size_t size) noexcept nogil
