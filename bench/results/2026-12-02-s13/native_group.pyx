# cython: language_level=3, boundscheck=False, wraparound=False
"""Session 13 diagnostic: does the GPU step faster when several threads' steps share one wgpuQueueSubmit?

``Stepper`` holds one captured mlp16 step's native work (as session 12's ``native_step.pyx``: write the input, the
graph's frozen command list with a copy of the output into a staging buffer, map, poll until this thread's map
callback fired, copy out, unmap), with the step's command buffer encoded *ahead* (the library's shape: the next
replay is encoded right after a submit, while the GPU works).  Steps:
  ``ahead``    submit this thread's command buffer alone (one wgpuQueueSubmit per step)
  ``grouped``  hand it to a combiner: the first thread to arrive submits every command buffer waiting (its own and
               those that arrived meanwhile) in one wgpuQueueSubmit; the others wait until theirs was submitted
  ``batch(steppers)``  one thread runs K steps at once: K writes, one submit of K command buffers, K maps, one wait
Not part of the library."""

from libc.stdint cimport uint32_t, uint64_t, uintptr_t
from libc.string cimport memcpy

from ortgpu_core.backends._commands cimport COMMAND_COPY, CommandList, CommandRecord, NativeTable
from ortgpu_core.backends._webgpu_types cimport MapCallbackInfo, StringView, map_async_fn, device_poll_fn

cdef extern from *:
    """
    #include <pthread.h>
    #include <sched.h>
    static pthread_mutex_t s13_poll_mutex = PTHREAD_MUTEX_INITIALIZER;
    static inline int s13_poll_trylock(void) { return pthread_mutex_trylock(&s13_poll_mutex) == 0; }
    static inline void s13_poll_unlock(void) { pthread_mutex_unlock(&s13_poll_mutex); }
    static inline int s13_load(const int *f) { return __atomic_load_n(f, __ATOMIC_ACQUIRE); }
    static inline void s13_store(int *f, int v) { __atomic_store_n(f, v, __ATOMIC_RELEASE); }

    typedef void (*s13_submit_fn)(void*, size_t, void* const*);
    typedef void (*s13_release_fn)(void*);
    #define S13_MAX 64
    static pthread_mutex_t s13_m = PTHREAD_MUTEX_INITIALIZER;
    static pthread_cond_t s13_c = PTHREAD_COND_INITIALIZER;
    static void* s13_pending[S13_MAX];
    static int s13_count = 0;
    static int s13_leader = 0;
    static unsigned long long s13_enqueued = 0, s13_done = 0, s13_submits = 0;
    /* submit cb through the combiner; returns once it is submitted */
    static void s13_group_submit(void* queue, void* cb, s13_submit_fn submit, s13_release_fn release) {
        void* batch[S13_MAX];
        int n, i;
        unsigned long long mine;
        pthread_mutex_lock(&s13_m);
        while (s13_count == S13_MAX) pthread_cond_wait(&s13_c, &s13_m);
        s13_pending[s13_count++] = cb;
        mine = s13_enqueued++;
        if (s13_leader) {
            while (s13_done <= mine) pthread_cond_wait(&s13_c, &s13_m);
            pthread_mutex_unlock(&s13_m);
            return;
        }
        s13_leader = 1;
        while (s13_count > 0) {
            n = s13_count;
            for (i = 0; i < n; i++) batch[i] = s13_pending[i];
            s13_count = 0;
            pthread_mutex_unlock(&s13_m);
            submit(queue, (size_t)n, batch);
            for (i = 0; i < n; i++) release(batch[i]);
            pthread_mutex_lock(&s13_m);
            s13_done += n;
            s13_submits += 1;
            pthread_cond_broadcast(&s13_c);
        }
        s13_leader = 0;
        pthread_mutex_unlock(&s13_m);
    }
    static unsigned long long s13_submit_count(void) { return s13_submits; }
    """
    int s13_poll_trylock() nogil
    void s13_poll_unlock() nogil
    int s13_load(const int*) nogil
    void s13_store(int*, int) nogil
    int sched_yield() nogil
    ctypedef void (*s13_submit_fn)(void*, size_t, void* const*) noexcept nogil
    ctypedef void (*s13_release_fn)(void*) noexcept nogil
    void s13_group_submit(void*, void*, s13_submit_fn, s13_release_fn) nogil
    unsigned long long s13_submit_count() nogil

ctypedef void (*write_fn)(void*, void*, uint64_t, const void*, size_t) noexcept nogil
ctypedef const void* (*range_fn)(void*, size_t, size_t) noexcept nogil
ctypedef void (*unmap_fn)(void*) noexcept nogil

cdef uintptr_t MASK = 0x0000FFFFFFFFFFFF


cdef void _on_map(uint32_t status, StringView message, void* userdata1, void* userdata2) noexcept nogil:
    s13_store(<int*>userdata1, 1 if status == <uint32_t><uintptr_t>userdata2 else 2)


def submits():
    """wgpuQueueSubmit calls the combiner made."""
    return s13_submit_count()


cdef class Stepper:
    cdef NativeTable table
    cdef CommandList commands
    cdef CommandRecord tail[1]
    cdef void* queue
    cdef void* device
    cdef void* input_buffer
    cdef void* staging
    cdef void* next_cb
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

    def __init__(self, NativeTable table, CommandList commands, uintptr_t queue, uintptr_t device,
                 uintptr_t input_buffer, uintptr_t output_buffer, uintptr_t staging, size_t out_size,
                 dict fns, uint32_t callback_mode, uint32_t map_read, uint32_t success):
        self.table = table
        self.commands = commands
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
        self.next_cb = self.commands.encode(self.table, self.tail, 1)
        if self.next_cb == NULL:
            raise RuntimeError("encoding failed")

    cdef void* _take(self) noexcept nogil:
        cdef void* cb = self.next_cb
        self.next_cb = NULL
        return cb

    cdef void _encode_next(self) noexcept nogil:
        self.next_cb = self.commands.encode(self.table, self.tail, 1)

    cdef void _request(self) noexcept nogil:
        cdef MapCallbackInfo info
        info.nextInChain = NULL
        info.mode = self.callback_mode
        info.callback = <void*>_on_map
        info.userdata1 = <void*>&self.flag
        info.userdata2 = <void*><uintptr_t>self.success
        s13_store(&self.flag, 0)
        self.fn_map(self.staging, self.map_read, 0, self.out_size, info)

    cdef int _copy_out(self, unsigned char* dst) noexcept nogil:
        cdef const void* mapped
        if s13_load(&self.flag) != 1:
            return -1
        mapped = self.fn_range(self.staging, 0, self.out_size)
        if mapped == NULL:
            self.fn_unmap(self.staging)
            return -2
        memcpy(dst, mapped, self.out_size)
        self.fn_unmap(self.staging)
        return 0

    cdef void _wait(self) noexcept nogil:
        while s13_load(&self.flag) == 0:
            if s13_poll_trylock():
                self.fn_poll(self.device, 0, NULL)
                s13_poll_unlock()
            else:
                sched_yield()

    cdef void _submit_alone(self) noexcept nogil:
        cdef void* cb = self._take()
        (<s13_submit_fn>self.table.fn_submit)(self.queue, 1, &cb)
        (<s13_release_fn>self.table.fn_release_command_buffer)(cb)

    def ahead(self, const unsigned char[::1] src, unsigned char[::1] dst):
        """write; submit the command buffer encoded ahead, alone; encode the next; map; wait; copy out."""
        cdef int status
        with nogil:
            self.fn_write(self.queue, self.input_buffer, 0, &src[0], <size_t>src.shape[0])
            self._submit_alone()
            self._request()
            self._encode_next()
            self._wait()
            status = self._copy_out(&dst[0])
        if status != 0:
            raise RuntimeError(f"native step failed: {status}")

    def grouped(self, const unsigned char[::1] src, unsigned char[::1] dst):
        """As ``ahead``, the submit through the combiner (one wgpuQueueSubmit for the threads waiting)."""
        cdef int status
        with nogil:
            self.fn_write(self.queue, self.input_buffer, 0, &src[0], <size_t>src.shape[0])
            s13_group_submit(self.queue, self._take(), <s13_submit_fn>self.table.fn_submit,
                             <s13_release_fn>self.table.fn_release_command_buffer)
            self._request()
            self._encode_next()
            self._wait()
            status = self._copy_out(&dst[0])
        if status != 0:
            raise RuntimeError(f"native step failed: {status}")

    def write(self, const unsigned char[::1] src):
        """The upload alone (one GIL release): the shape of update_inplace."""
        with nogil:
            self.fn_write(self.queue, self.input_buffer, 0, &src[0], <size_t>src.shape[0])

    def submit(self):
        """Submit the command buffer encoded ahead (the copy of the output rides in it), then encode the next: the
        shape of a replay() whose outputs' copies ride in its submission."""
        with nogil:
            self._submit_alone()
            self._encode_next()

    def read(self, unsigned char[::1] dst):
        """Map the staging buffer the last submit copied into, wait, copy out: the shape of a to_numpy() that
        finds its copy made by the replay (no submission of its own)."""
        cdef int status
        with nogil:
            self._request()
            self._wait()
            status = self._copy_out(&dst[0])
        if status != 0:
            raise RuntimeError(f"native read failed: {status}")

    def close(self):
        if self.next_cb != NULL:
            # submitted rather than released unsubmitted (a diagnostic: keeps wgpu-native's accounting simple)
            self._submit_alone()


def batch(list steppers, list srcs, list dsts):
    """One thread, K steps at once: K writes, one wgpuQueueSubmit of K command buffers, K map requests, one wait
    for all, K copies out; then the next K command buffers are encoded (ahead of the next call)."""
    cdef Py_ssize_t k = len(steppers), i
    cdef void* cbs[64]
    cdef Stepper s
    cdef const unsigned char[::1] src
    cdef unsigned char[::1] dst
    cdef int status = 0
    assert k <= 64
    for i in range(k):
        s = <Stepper>steppers[i]
        src = srcs[i]
        s.fn_write(s.queue, s.input_buffer, 0, &src[0], <size_t>src.shape[0])
        cbs[i] = s._take()
    s = <Stepper>steppers[0]
    with nogil:
        (<s13_submit_fn>s.table.fn_submit)(s.queue, <size_t>k, cbs)
        for i in range(k):
            (<s13_release_fn>s.table.fn_release_command_buffer)(cbs[i])
    for i in range(k):
        (<Stepper>steppers[i])._request()
    for i in range(k):
        s = <Stepper>steppers[i]
        s._encode_next()
    for i in range(k):
        s = <Stepper>steppers[i]
        with nogil:
            s._wait()
        dst = dsts[i]
        status |= s._copy_out(&dst[0])
    if status != 0:
        raise RuntimeError(f"native batch failed: {status}")
