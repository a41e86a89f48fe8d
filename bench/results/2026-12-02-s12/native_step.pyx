# cython: language_level=3, boundscheck=False, wraparound=False
"""Session 12 diagnostic: a captured step's native work with no Python in it (the floor a native hot path could
reach).  ``Stepper.step`` is one call that releases the GIL once: write the input (wgpuQueueWriteBuffer), encode the
graph's frozen command list with a copy of the output into a staging buffer and submit it, request the staging
buffer's mapping, poll until this thread's map callback fired (one poller at a time: a C mutex taken with trylock,
the others spin), copy the mapping out, unmap.  ``write``, ``submit`` and ``read`` are the same work as three calls
(three GIL releases: the shape of the public update_inplace / replay / to_numpy).  Not part of the library."""

from libc.stdint cimport uint32_t, uint64_t, uintptr_t
from libc.string cimport memcpy

from ortgpu_core.backends._commands cimport COMMAND_COPY, CommandList, CommandRecord, NativeTable
from ortgpu_core.backends._webgpu_types cimport MapCallbackInfo, StringView, map_async_fn, device_poll_fn

cdef extern from *:
    """
    #include <pthread.h>
    #include <sched.h>
    static pthread_mutex_t s12_poll_mutex = PTHREAD_MUTEX_INITIALIZER;
    static inline int s12_poll_trylock(void) { return pthread_mutex_trylock(&s12_poll_mutex) == 0; }
    static inline void s12_poll_unlock(void) { pthread_mutex_unlock(&s12_poll_mutex); }
    static inline int s12_load(const int *f) { return __atomic_load_n(f, __ATOMIC_ACQUIRE); }
    static inline void s12_store(int *f, int v) { __atomic_store_n(f, v, __ATOMIC_RELEASE); }
    """
    int s12_poll_trylock() nogil
    void s12_poll_unlock() nogil
    int s12_load(const int*) nogil
    void s12_store(int*, int) nogil
    int sched_yield() nogil

ctypedef void (*write_fn)(void*, void*, uint64_t, const void*, size_t) noexcept nogil
ctypedef const void* (*range_fn)(void*, size_t, size_t) noexcept nogil
ctypedef void (*unmap_fn)(void*) noexcept nogil

cdef uintptr_t MASK = 0x0000FFFFFFFFFFFF


cdef void _on_map(uint32_t status, StringView message, void* userdata1, void* userdata2) noexcept nogil:
    s12_store(<int*>userdata1, 1 if status == <uint32_t><uintptr_t>userdata2 else 2)


cdef class Stepper:
    cdef NativeTable table
    cdef CommandList commands
    cdef CommandList empty
    cdef CommandRecord tail[1]
    cdef void* queue
    cdef void* device
    cdef void* input_buffer
    cdef void* staging
    cdef size_t out_size
    cdef write_fn fn_write
    cdef map_async_fn fn_map
    cdef range_fn fn_range
    cdef unmap_fn fn_unmap
    cdef device_poll_fn fn_poll
    cdef uint32_t callback_mode
    cdef uint32_t map_read
    cdef uint32_t success
    cdef int flag
    cdef public long polls

    def __init__(self, NativeTable table, CommandList commands, uintptr_t queue, uintptr_t device,
                 uintptr_t input_buffer, uintptr_t output_buffer, uintptr_t staging, size_t out_size,
                 dict fns, uint32_t callback_mode, uint32_t map_read, uint32_t success):
        self.table = table
        self.commands = commands
        self.empty = CommandList()
        self.queue = <void*>queue
        self.device = <void*>device
        self.input_buffer = <void*>(input_buffer & MASK)
        self.staging = <void*>(staging & MASK)
        self.out_size = out_size
        self.tail[0].kind = COMMAND_COPY
        self.tail[0].a = output_buffer
        self.tail[0].b = staging
        self.tail[0].offset_a = 0
        self.tail[0].offset_b = 0
        self.tail[0].size = out_size
        self.fn_write = <write_fn><uintptr_t>fns["wgpuQueueWriteBuffer"]
        self.fn_map = <map_async_fn><uintptr_t>fns["wgpuBufferMapAsync"]
        self.fn_range = <range_fn><uintptr_t>fns["wgpuBufferGetConstMappedRange"]
        self.fn_unmap = <unmap_fn><uintptr_t>fns["wgpuBufferUnmap"]
        self.fn_poll = <device_poll_fn><uintptr_t>fns["wgpuDevicePoll"]
        self.callback_mode = callback_mode
        self.map_read = map_read
        self.success = success
        self.polls = 0

    cdef int _write(self, const unsigned char* src, size_t size) noexcept nogil:
        self.fn_write(self.queue, self.input_buffer, 0, src, size)
        return 0

    cdef int _submit(self, bint with_tail) except -1 nogil:
        if with_tail:
            return self.commands.encode_submit(self.table, NULL, self.tail, 1)
        return self.commands.encode_submit(self.table, NULL, NULL, 0)

    cdef int _read(self, unsigned char* dst) noexcept nogil:
        cdef MapCallbackInfo info
        cdef const void* mapped
        info.nextInChain = NULL
        info.mode = self.callback_mode
        info.callback = <void*>_on_map
        info.userdata1 = <void*>&self.flag
        info.userdata2 = <void*><uintptr_t>self.success
        s12_store(&self.flag, 0)
        self.fn_map(self.staging, self.map_read, 0, self.out_size, info)
        while s12_load(&self.flag) == 0:
            if s12_poll_trylock():
                self.fn_poll(self.device, 0, NULL)
                self.polls += 1
                s12_poll_unlock()
            else:
                sched_yield()
        if s12_load(&self.flag) != 1:
            return -1
        mapped = self.fn_range(self.staging, 0, self.out_size)
        if mapped == NULL:
            self.fn_unmap(self.staging)
            return -2
        memcpy(dst, mapped, self.out_size)
        self.fn_unmap(self.staging)
        return 0

    def step(self, const unsigned char[::1] src, unsigned char[::1] dst):
        """The whole step, one GIL release."""
        cdef int status
        if <size_t>dst.shape[0] < self.out_size:
            raise ValueError("dst too small")
        with nogil:
            self._write(&src[0], <size_t>src.shape[0])
            self._submit(True)
            status = self._read(&dst[0])
        if status != 0:
            raise RuntimeError(f"native step failed: {status}")

    def write(self, const unsigned char[::1] src):
        with nogil:
            self._write(&src[0], <size_t>src.shape[0])

    def submit(self):
        """The graph's commands alone (no copy): the shape of replay()."""
        with nogil:
            self._submit(False)

    def read(self, unsigned char[::1] dst):
        """Copy the output to the staging buffer (its own submission), map, wait, copy out: the shape of
        to_numpy()."""
        cdef int status
        with nogil:
            self.empty.encode_submit(self.table, NULL, self.tail, 1)
            status = self._read(&dst[0])
        if status != 0:
            raise RuntimeError(f"native read failed: {status}")
