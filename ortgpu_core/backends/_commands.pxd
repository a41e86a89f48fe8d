# The internal contract of the command list: a flat C array of records that the
# wgpu backend encodes with the GIL released.
from libc.stdint cimport uint8_t, uint32_t, uint64_t, uintptr_t

cdef enum CommandKind:
    COMMAND_DISPATCH = 0
    COMMAND_COPY = 1
    COMMAND_CLEAR = 2
    COMMAND_TIMESTAMP = 3
    COMMAND_RESOLVE = 4

cdef struct CommandRecord:
    int kind
    # dispatch: a = pipeline, b = bind group; copy: a = source, b = destination; clear: a = buffer;
    # timestamp: a = query set, x = query index; resolve: a = query set, x = first query, y = query count,
    # b = destination buffer, offset_b = destination offset
    uintptr_t a
    uintptr_t b
    uint64_t offset_a
    uint64_t offset_b
    uint64_t size
    uint32_t x
    uint32_t y
    uint32_t z

cdef class NativeTable:
    cdef uintptr_t device
    cdef uintptr_t queue
    # Optional: a counter the device's error callback increments; when it moves
    # while encoding, the command buffer is invalid and is not submitted
    # (wgpu-native aborts the process on submitting one).  NULL: no check.
    cdef uint32_t* error_count
    # Optional: the offset, in wgpu-native's command buffer object, of the flag its wgpuQueueSubmit sets and its
    # release reads to free the buffer (-1: unknown).  A command buffer released unsubmitted gets the flag set
    # first, or wgpu-native never frees it (see NativeTable.submitted_flag_offset).
    cdef Py_ssize_t submitted_flag
    cdef void* fn_create_encoder
    cdef void* fn_begin_compute_pass
    cdef void* fn_set_pipeline
    cdef void* fn_set_bind_group
    cdef void* fn_dispatch
    cdef void* fn_end_pass
    cdef void* fn_release_pass
    cdef void* fn_copy_buffer
    cdef void* fn_clear_buffer
    cdef void* fn_finish
    cdef void* fn_release_encoder
    cdef void* fn_submit
    cdef void* fn_release_command_buffer
    cdef void* fn_write_timestamp
    cdef void* fn_pass_write_timestamp
    # Whether timestamps may be written inside a compute pass (wgpu-native's timestamp-query-inside-passes): a
    # timestamp record then keeps the open pass instead of ending it.
    cdef bint pass_timestamps
    cdef bint open_pass_timestamps
    cdef void* fn_resolve_query_set

cdef class CommandList:
    cdef CommandRecord* _records
    cdef Py_ssize_t _count
    cdef Py_ssize_t _capacity
    cdef bint _frozen
    cdef Py_ssize_t _early_submit
    cdef object __weakref__
    cdef CommandRecord* _append(self) except NULL
    cdef void* _finish(self, NativeTable table, void* encoder, uint32_t errors_before) noexcept nogil
    cdef int _finish_submit(
        self, NativeTable table, void* encoder, uint32_t errors_before, double* phases
    ) noexcept nogil
    cdef void* encode(self, NativeTable table, CommandRecord* tail, Py_ssize_t tail_count) noexcept nogil
    cdef int encode_submit(
        self, NativeTable table, double* phases, CommandRecord* tail, Py_ssize_t tail_count
    ) except -1 nogil
