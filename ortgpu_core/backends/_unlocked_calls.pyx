# cython: language_level=3, boundscheck=False, wraparound=False
"""The native calls a wgpu device makes outside its lock, in C without the GIL: a read's copy into the staging buffer,
its submission and map request (one call), the wait for that map (another), the submit of a command buffer
encoded ahead for a captured graph (its replay), and an upload's queue write (entered with the GIL by
``try_enter_write``, which never waits: a write that finds the device's lock held is made under the lock instead).

Why: with K threads each stepping a captured graph on one device, a step made of Python calls under the device's
lock hands the GIL and that lock between threads many times per step; each hand-over wakes a thread on another
core, and a thread that gives the GIL away for a native call while it holds the device's lock makes every other
thread queue behind it.  A Python to_numpy(), in a step whose other parts were native, cost a good part of
the step rate at K=4 threads and more at K=8.  Here the GIL is released once per call, and no lock but the poll
lock is held.

Pieces:

* :class:`NativeLock`: the device's *poll lock* (one thread polls wgpu-native at a time: two polling threads can
  trip an assertion in wgpu-native 29's ``Device::maintain``), usable from Python like ``threading.Lock`` and taken
  from C with a try-lock, so the Python waits of ``_wgpu_readback`` and the C waits here exclude each other.
* :class:`MapWait`: one map request's status, set by a C callback (no GIL) that fires inside whichever thread's
  poll or submit completes the request.  The callback writes into the object, so an object whose request may still
  complete is kept alive by the caller (``_wgpu_readback`` keeps abandoned ones for the life of the process).
* :class:`UnlockedCalls`: the device's pointers and entry points, and a *gate*: every call here enters it first and
  leaves it last (an atomic count), and the device's ``destroy`` closes it and waits until no call is inside before
  it frees anything, so nothing here ever uses a freed device, queue or staging buffer.  A call that finds the gate
  closed returns ``CLOSING`` at once.

What a call here uses, the caller keeps alive: the source buffer of a read's copy (``_wgpu_readback`` marks its
record busy, and a release meanwhile is done when the read ends: wgpu-native 29 aborts the process on a submission
that uses a destroyed buffer), and what a command buffer encoded ahead names (a captured graph's buffers are pinned
while it is captured; a release of one of its handles cancels what was encoded ahead, under the lock, before the
submit takes it).
"""

from cpython.pythread cimport (
    NOWAIT_LOCK, PyThread_acquire_lock, PyThread_allocate_lock, PyThread_free_lock, PyThread_release_lock,
    PyThread_type_lock, WAIT_LOCK,
)
from libc.stdint cimport uint32_t, uint64_t, uintptr_t
from libc.string cimport memcpy
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, nanosleep, timespec

from ._commands cimport COMMAND_COPY, CommandList, CommandRecord, NativeTable
from ._host_copy cimport host_copy
from ._webgpu_types cimport MapCallbackInfo, StringView, device_poll_fn, map_async_fn

cdef extern from *:
    """
    #include <sched.h>
    static inline int ortgpu_read_int(const int *v) { return __atomic_load_n(v, __ATOMIC_SEQ_CST); }
    static inline void ortgpu_write_int(int *v, int x) { __atomic_store_n(v, x, __ATOMIC_SEQ_CST); }
    static inline int ortgpu_add_int(int *v, int x) { return __atomic_add_fetch(v, x, __ATOMIC_SEQ_CST); }
    static inline unsigned long ortgpu_read_ulong(const unsigned long *v) {
        return __atomic_load_n(v, __ATOMIC_SEQ_CST);
    }
    static inline void ortgpu_write_ulong(unsigned long *v, unsigned long x) {
        __atomic_store_n(v, x, __ATOMIC_SEQ_CST);
    }
    static inline unsigned long ortgpu_this_thread(void) { return PyThread_get_thread_ident(); }
    static inline uint32_t ortgpu_read_uint(const uint32_t *v) { return __atomic_load_n(v, __ATOMIC_SEQ_CST); }
    """
    int ortgpu_read_int(const int*) nogil
    void ortgpu_write_int(int*, int) nogil
    int ortgpu_add_int(int*, int) nogil
    unsigned long ortgpu_read_ulong(const unsigned long*) nogil
    void ortgpu_write_ulong(unsigned long*, unsigned long) nogil
    unsigned long ortgpu_this_thread() nogil
    uint32_t ortgpu_read_uint(const uint32_t*) nogil
    int sched_yield() nogil

# void wgpuQueueSubmit(WGPUQueue, size_t, WGPUCommandBuffer const*)
ctypedef void (*submit_fn)(void*, size_t, void* const*) noexcept nogil
# void wgpuCommandBufferRelease(WGPUCommandBuffer)
ctypedef void (*release_fn)(void*) noexcept nogil
# void wgpuQueueWriteBuffer(WGPUQueue, WGPUBuffer, uint64_t bufferOffset, void const * data, size_t size)
ctypedef void (*queue_write_fn)(void*, void*, uint64_t, const void*, size_t) noexcept nogil
# void const * wgpuBufferGetConstMappedRange(WGPUBuffer buffer, size_t offset, size_t size)
ctypedef const void* (*const_range_fn)(void*, size_t, size_t) noexcept nogil
# void wgpuBufferUnmap(WGPUBuffer buffer)
ctypedef void (*buffer_unmap_fn)(void*) noexcept nogil
# void * wgpuBufferGetMappedRange(WGPUBuffer buffer, size_t offset, size_t size)
ctypedef void* (*range_fn)(void*, size_t, size_t) noexcept nogil

cdef enum:
    _DONE = 0
    _NOT_SUBMITTED = 1
    _IDLE = 2
    _CLOSING = 3
    _LOST = 4
    _MAP_FAILED = 5

#: What the calls of :class:`UnlockedCalls` return.
DONE = _DONE  # copy_and_map: submitted and requested; wait: the request's callback fired; submit_encoded: submitted
NOT_SUBMITTED = _NOT_SUBMITTED  # copy_and_map: wgpu-native could not encode the copy (its errors: the caller's)
WAIT_IDLE = _IDLE  # wait: a blocking poll returned and the request had not completed (a lost device, maybe)
CLOSING = _CLOSING  # the device is being destroyed (nothing was done)
LOST = _LOST  # wait: the device-lost callback reported a loss
MAP_FAILED = _MAP_FAILED  # read_mapped: the map request completed with another status than success (still mapped: no)

# A thread that is not polling, once the spin is over, sleeps this long between checks (nanoseconds).
cdef long _NAP_NS = 20000
# The polling thread, once the spin is over, keeps polling without blocking for a wait's ``nap_seconds`` more, sleeping
# between polls from this long, doubling up to the longest (nanoseconds); only then does it block in the driver.
# A blocking poll holds wgpu-native 29's fence lock until the GPU has finished all work submitted before it, so
# every other thread's submission waits that long and the GPU runs dry behind it.
cdef long _NAP_POLL_FIRST_NS = 20000
cdef long _NAP_POLL_LONGEST_NS = 200000


cdef inline double _monotonic_seconds() noexcept nogil:
    cdef timespec now
    clock_gettime(CLOCK_MONOTONIC, &now)
    return now.tv_sec + now.tv_nsec * 1e-9


cdef inline void _sleep_ns(long nanoseconds) noexcept nogil:
    cdef timespec pause
    pause.tv_sec = 0
    pause.tv_nsec = nanoseconds
    nanosleep(&pause, NULL)


cdef inline void _nap() noexcept nogil:
    _sleep_ns(_NAP_NS)


cdef class NativeLock:
    """A lock like ``threading.Lock`` (``acquire(blocking=True)``, ``release()``, ``locked()``, ``with``) that C
    code can also try to take without the GIL."""

    cdef PyThread_type_lock _lock
    cdef int _held

    def __cinit__(self):
        self._lock = PyThread_allocate_lock()
        if self._lock == NULL:
            raise MemoryError("NativeLock: no lock")
        self._held = 0

    def __dealloc__(self):
        if self._lock != NULL:
            PyThread_free_lock(self._lock)

    def acquire(self, bint blocking=True):
        """Take the lock; with ``blocking=False`` return False at once when it is held.  A blocking acquire
        releases the GIL while it waits."""
        cdef int taken = PyThread_acquire_lock(self._lock, NOWAIT_LOCK)
        if not taken:
            if not blocking:
                return False
            with nogil:
                PyThread_acquire_lock(self._lock, WAIT_LOCK)
        ortgpu_write_int(&self._held, 1)
        return True

    def release(self):
        if not ortgpu_read_int(&self._held):
            raise RuntimeError("release of a NativeLock that is not held")
        ortgpu_write_int(&self._held, 0)
        PyThread_release_lock(self._lock)

    def locked(self):
        return bool(ortgpu_read_int(&self._held))

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc_info):
        self.release()

    cdef bint try_take(self) noexcept nogil:
        if PyThread_acquire_lock(self._lock, NOWAIT_LOCK):
            ortgpu_write_int(&self._held, 1)
            return True
        return False

    cdef void give(self) noexcept nogil:
        ortgpu_write_int(&self._held, 0)
        PyThread_release_lock(self._lock)


cdef void _on_map(uint32_t status, StringView message, void* userdata1, void* userdata2) noexcept nogil:
    # WGPUMapAsyncStatus values start at 1 (Success); 0 would read as "pending", so it is stored as -1
    ortgpu_write_int(<int*>userdata1, <int>status if status != 0 else -1)


cdef class MapWait:
    """One map request's outcome: ``status`` is 0 while it is pending, then the WGPUMapAsyncStatus its callback
    reported (-1 for 0)."""

    cdef int _status

    @property
    def status(self):
        return ortgpu_read_int(&self._status)

    cdef MapCallbackInfo callback_info(self, uint32_t callback_mode) noexcept:
        # the descriptor of a map request reported to this object (built with the GIL, passed by value)
        cdef MapCallbackInfo info
        info.nextInChain = NULL
        info.mode = callback_mode
        info.callback = <void*>_on_map
        info.userdata1 = <void*>&self._status
        info.userdata2 = NULL
        return info


cdef class UnlockedCalls:
    """A device's native calls made outside its lock (see the module's docstring): built once per device, closed by
    its ``destroy``."""

    cdef NativeTable table
    cdef NativeLock poll_lock
    cdef CommandList empty  # encodes a lone copy (its tail)
    cdef void* device
    cdef map_async_fn fn_map
    cdef device_poll_fn fn_poll
    cdef queue_write_fn fn_write
    cdef uint32_t map_mode
    cdef uint32_t callback_mode
    cdef const int* lost
    cdef int inflight
    cdef int closing
    # The device's lock and the calls here that submit exclude each other (see lock_taken): set while a thread holds
    # the lock (its ident in locker), and the count of submitting calls inside.
    cdef int locked
    cdef unsigned long locker
    cdef int submitting
    # Blocking polls made by the waits (here and the Python waits of _wgpu_readback, always under the poll lock):
    # each one holds wgpu-native's fence lock, and so every other thread's submission, until the GPU is done.
    cdef public unsigned long blocking_polls

    def __init__(self, NativeTable table, NativeLock poll_lock, uintptr_t device, uintptr_t map_async,
                 uintptr_t device_poll, uintptr_t queue_write, uint32_t map_mode, uint32_t callback_mode,
                 uintptr_t lost_flag):
        """``table``: the device's command-loop table; ``poll_lock``: the device's poll lock; ``device``: the
        WGPUDevice; ``map_async``/``device_poll``: the addresses of wgpuBufferMapAsync and wgpuDevicePoll;
        ``queue_write``: the address of wgpuQueueWriteBuffer (the liveness probe); ``map_mode``: WGPUMapMode_Read;
        ``callback_mode``: WGPUCallbackMode_AllowProcessEvents; ``lost_flag``: the address of the int the device-lost
        callback sets (0: none).  The caller keeps all of them alive until
        :meth:`close` returned."""
        if device == 0 or map_async == 0 or device_poll == 0 or queue_write == 0:
            raise ValueError("UnlockedCalls: a null address")
        self.fn_write = <queue_write_fn>queue_write
        self.table = table
        self.poll_lock = poll_lock
        self.empty = CommandList()
        self.device = <void*>device
        self.fn_map = <map_async_fn>map_async
        self.fn_poll = <device_poll_fn>device_poll
        self.map_mode = map_mode
        self.callback_mode = callback_mode
        self.lost = <const int*>lost_flag
        self.inflight = 0
        self.closing = 0
        self.locked = 0
        self.locker = 0
        self.submitting = 0
        self.blocking_polls = 0

    cdef bint _enter(self) noexcept nogil:
        # Counted in first, then the flag checked: close() sets the flag first, then waits for the count, so
        # either this sees the flag or close() sees this section (sequentially consistent atomics).
        ortgpu_add_int(&self.inflight, 1)
        if ortgpu_read_int(&self.closing):
            ortgpu_add_int(&self.inflight, -1)
            return False
        return True

    cdef void _leave(self) noexcept nogil:
        ortgpu_add_int(&self.inflight, -1)

    cdef bint _enter_submit(self) noexcept nogil:
        # (Inside the gate.)  A call that submits waits while another thread holds the device's lock, and counts
        # itself in: the lock's holder then waits for it (lock_taken).  Counted in first, then the flag checked (as
        # in _enter).  False when the gate closed meanwhile (the lock's holder may be the destroy, waiting for this
        # call to leave the gate): the call then does nothing.
        cdef unsigned long me = ortgpu_this_thread()
        while True:
            ortgpu_add_int(&self.submitting, 1)
            if not ortgpu_read_int(&self.locked) or ortgpu_read_ulong(&self.locker) == me:
                return True
            ortgpu_add_int(&self.submitting, -1)
            while ortgpu_read_int(&self.locked) and ortgpu_read_ulong(&self.locker) != me:
                if ortgpu_read_int(&self.closing):
                    return False
                sched_yield()

    cdef void _leave_submit(self) noexcept nogil:
        ortgpu_add_int(&self.submitting, -1)

    cdef bint _alive(self, uintptr_t sentinel) noexcept nogil:
        # (Submitting.)  Whether the device can take a submission of a command buffer encoded earlier: an empty
        # write to the device's own small buffer reports "device is lost" (wgpu-native 29 calls no device-lost
        # callback for every loss) by counting up the device's errors; a submission to a lost device would abort
        # the process.  Another thread's error counted meanwhile reads as a loss too: the caller then submits the
        # ordinary way, under the lock, where the loss is checked again.
        cdef uint32_t before
        if self.table.error_count == NULL or sentinel == 0:
            return True
        before = ortgpu_read_uint(self.table.error_count)
        self.fn_write(<void*>self.table.queue, <void*>sentinel, 0, NULL, 0)
        return ortgpu_read_uint(self.table.error_count) == before

    def lock_taken(self):
        """(The device's lock was just taken by the calling thread, outermost.)  Keep the calls here that submit
        out until :meth:`lock_released`, and wait (without the GIL) for those already submitting: what is done
        under the device's lock never interleaves with a submission made here.  wgpu-native 29 aborts the process
        on a submission to a device destroyed between the encoding and the submit; a loss made under the lock (a
        test's, or the destroy's) cannot land inside one of these submissions, as it could not inside the ones
        made under the lock."""
        ortgpu_write_ulong(&self.locker, ortgpu_this_thread())
        ortgpu_write_int(&self.locked, 1)
        if ortgpu_read_int(&self.submitting) > 0:  # (else the GIL is kept: handing it around costs every thread)
            with nogil:
                while ortgpu_read_int(&self.submitting) > 0:
                    sched_yield()

    def lock_released(self):
        """(The calling thread is about to release the device's lock, outermost.)"""
        ortgpu_write_int(&self.locked, 0)

    def close(self):
        """Refuse every later call and wait (without the GIL) until none is inside.  Idempotent."""
        ortgpu_write_int(&self.closing, 1)
        with nogil:
            while ortgpu_read_int(&self.inflight) > 0:
                _nap()

    @property
    def closed(self):
        return bool(ortgpu_read_int(&self.closing))

    @property
    def inflight(self):
        """Calls inside the gate now (for tests)."""
        return ortgpu_read_int(&self.inflight)

    def copy_and_map(self, uintptr_t source, uint64_t offset, uintptr_t staging, uint64_t size, MapWait wait):
        """Without the GIL: encode a copy of ``size`` bytes at ``offset`` of the buffer ``source`` (a backend
        handle) into the staging buffer ``staging`` (an address) and submit it, then request the staging buffer's
        mapping, reported to ``wait``.  Returns DONE, NOT_SUBMITTED or CLOSING."""
        cdef CommandRecord copy
        cdef int code
        cdef MapCallbackInfo info
        copy.kind = COMMAND_COPY
        copy.a = source
        copy.b = staging
        copy.offset_a = offset
        copy.offset_b = 0
        copy.size = size
        copy.x = copy.y = copy.z = 0
        info = wait.callback_info(self.callback_mode)
        with nogil:
            if not self._enter():
                code = _CLOSING
            else:
                if not self._enter_submit():
                    code = _CLOSING
                elif self.empty.encode_submit(self.table, NULL, &copy, 1):
                    self.fn_map(<void*>staging, self.map_mode, 0, size, info)
                    code = _DONE
                    self._leave_submit()
                else:
                    code = _NOT_SUBMITTED
                    self._leave_submit()
                self._leave()
        return code

    def staged_write(self, uintptr_t staging, uintptr_t mapped_range, uintptr_t unmap, uintptr_t data, uint64_t size,
                     uintptr_t target, uint64_t offset, uint32_t write_mode, uint64_t map_size, MapWait wait):
        """Without the GIL: copy ``size`` bytes at ``data`` into the staging buffer ``staging`` (mapped for writing;
        ``mapped_range``/``unmap``: wgpuBufferGetMappedRange / wgpuBufferUnmap) split across threads
        (:mod:`._host_copy`), unmap it, encode and submit a copy of them into the buffer ``target`` at ``offset``, then
        request the staging buffer's first ``map_size`` bytes mapped for writing again (``write_mode``:
        WGPUMapMode_Write), reported to ``wait``: it completes once that copy has run.  Returns DONE, NOT_SUBMITTED
        (no mapped range, or wgpu-native could not encode the copy: the staging buffer is unmapped and nothing was
        requested) or CLOSING (nothing done)."""
        cdef CommandRecord copy
        cdef int code = _CLOSING
        cdef MapCallbackInfo info
        cdef void* mapped
        if staging == 0 or mapped_range == 0 or unmap == 0 or target == 0 or (size and data == 0):
            raise ValueError("staged_write: a null address")
        if size > map_size:
            raise ValueError("staged_write: the write is larger than the staging buffer")
        copy.kind = COMMAND_COPY
        copy.a = staging
        copy.b = target
        copy.offset_a = 0
        copy.offset_b = offset
        copy.size = size
        copy.x = copy.y = copy.z = 0
        info = wait.callback_info(self.callback_mode)
        with nogil:
            if self._enter():
                if self._enter_submit():
                    mapped = (<range_fn>mapped_range)(<void*>staging, 0, size)
                    if mapped == NULL:
                        code = _NOT_SUBMITTED
                    else:
                        host_copy(mapped, <const void*>data, size)
                    (<buffer_unmap_fn>unmap)(<void*>staging)
                    if mapped != NULL:
                        if self.empty.encode_submit(self.table, NULL, &copy, 1):
                            self.fn_map(<void*>staging, write_mode, 0, map_size, info)
                            code = _DONE
                        else:
                            code = _NOT_SUBMITTED
                    self._leave_submit()
                self._leave()
        return code

    def submit_encoded(self, uintptr_t command_buffer, uintptr_t sentinel):
        """Without the GIL: submit a command buffer encoded ahead (:meth:`CommandList.encode_native`) and release
        it, once the empty write to ``sentinel`` (a small buffer of the device's) found the device alive.  Returns
        DONE; NOT_SUBMITTED (the probe counted an error: the buffer was released unsubmitted, submit the ordinary
        way); or CLOSING (the device is being destroyed: released unsubmitted)."""
        return self._submit(command_buffer, sentinel, 0, 0, None)

    def submit_and_map(self, uintptr_t command_buffer, uintptr_t staging, uint64_t size, MapWait wait,
                       uintptr_t sentinel):
        """:meth:`submit_encoded` for a command buffer whose last commands copy into the staging buffer ``staging``
        (a captured graph's replay_and_read), then, once submitted, the request of the mapping of the first
        ``size`` bytes of ``staging``, reported to ``wait`` (nothing is requested unless DONE)."""
        if staging == 0:
            raise ValueError("submit_and_map: a null staging address")
        return self._submit(command_buffer, sentinel, staging, size, wait)

    cdef int _submit(self, uintptr_t command_buffer, uintptr_t sentinel, uintptr_t staging, uint64_t size,
                     MapWait wait) except -1:
        cdef void* pointer = <void*>command_buffer
        cdef int code = _CLOSING
        cdef MapCallbackInfo info
        if command_buffer == 0:
            raise ValueError("a command buffer address, not 0, is needed")
        if wait is not None:
            info = wait.callback_info(self.callback_mode)
        with nogil:
            if self._enter():
                if self._enter_submit():
                    if self._alive(sentinel):
                        (<submit_fn>self.table.fn_submit)(<void*>self.table.queue, 1, &pointer)
                        (<release_fn>self.table.fn_release_command_buffer)(pointer)
                        if staging != 0:
                            self.fn_map(<void*>staging, self.map_mode, 0, size, info)
                        code = _DONE
                    else:
                        code = _NOT_SUBMITTED
                    self._leave_submit()
                self._leave()
        if code != _DONE:
            self.table.release_encoded(command_buffer)
        return code

    def read_mapped(self, uintptr_t staging, uint64_t size, MapWait wait, double spin_seconds, double nap_seconds,
                    uintptr_t mapped_range, uintptr_t unmap, uint32_t success, uintptr_t destination, size_t count,
                    size_t offset, uintptr_t sentinel):
        """Without the GIL or the device's lock, in one call: request the mapping of the first ``size`` bytes of
        the staging buffer ``staging`` (a copy an earlier submission made into it: a read ahead), wait for it as
        :meth:`wait` does, and once it succeeded copy ``count`` bytes at ``offset`` of the mapping to
        ``destination`` and unmap (``mapped_range``/``unmap``: wgpuBufferGetConstMappedRange / wgpuBufferUnmap;
        ``success``: WGPUMapAsyncStatus_Success).  The mapping is read inside a submitting section, once the empty
        write to ``sentinel`` found the device alive: wgpu-native 29 completes a map on a destroyed device as a
        success and then aborts the process in wgpuBufferGetConstMappedRange, and a loss made under the device's
        lock cannot land inside the section.  Returns DONE (copied and unmapped), CLOSING (nothing requested, or
        the device is being destroyed), LOST (the callback or the probe saw a loss, or the probe counted another
        thread's error: the mapping was not read, nor unmapped), WAIT_IDLE (still pending: the caller waits on),
        MAP_FAILED (the request failed: nothing is mapped) or NOT_SUBMITTED (mapped but no range: unmapped)."""
        cdef MapCallbackInfo info = wait.callback_info(self.callback_mode)
        cdef int code = _CLOSING
        cdef const char* mapped
        if mapped_range == 0 or unmap == 0 or staging == 0 or (count and destination == 0):
            raise ValueError("read_mapped: a null address")
        if offset + count > size:
            raise ValueError("read_mapped: the copy is past the mapped range")
        with nogil:
            if self._enter():
                if self._enter_submit():
                    self.fn_map(<void*>staging, self.map_mode, 0, size, info)
                    self._leave_submit()
                    code = self._wait(wait, spin_seconds, nap_seconds)
                    if code == _DONE:
                        if <uint32_t>ortgpu_read_int(&wait._status) != success:
                            code = _MAP_FAILED
                        elif not self._enter_submit():
                            code = _CLOSING
                        else:
                            if not self._alive(sentinel):
                                code = _LOST
                            else:
                                mapped = <const char*>(<const_range_fn>mapped_range)(<void*>staging, 0, size)
                                if mapped == NULL:
                                    code = _NOT_SUBMITTED
                                elif count:
                                    memcpy(<void*>destination, mapped + offset, count)
                                (<buffer_unmap_fn>unmap)(<void*>staging)
                            self._leave_submit()
                self._leave()
        return code

    def queue_write(self, uintptr_t buffer, uint64_t offset, uintptr_t data, size_t size):
        """wgpuQueueWriteBuffer of ``size`` bytes at ``data`` into the buffer ``buffer`` (a native address) at
        ``offset``, *keeping* the GIL: a short call (a copy into wgpu-native's staging memory), made under the
        device's lock, where handing the GIL to another thread and waiting to get it back would cost more than the
        call (cffi releases it for every call)."""
        self.fn_write(<void*>self.table.queue, <void*>buffer, offset, <const void*>data, size)

    def try_enter_write(self):
        """(With the GIL, never waiting.)  Enter the gate as a call that writes outside the device's lock: False when
        the gate is closed or another thread holds the lock exclusively (the caller then writes under the lock).
        Once entered, an exclusive holder (a buffer's destroy) waits for :meth:`write_entered` or
        :meth:`leave_write`."""
        cdef unsigned long me = ortgpu_this_thread()
        if not self._enter():
            return False
        ortgpu_add_int(&self.submitting, 1)
        if not ortgpu_read_int(&self.locked) or ortgpu_read_ulong(&self.locker) == me:
            return True
        ortgpu_add_int(&self.submitting, -1)
        self._leave()
        return False

    def leave_write(self):
        """Leave the gate entered by :meth:`try_enter_write` without writing."""
        ortgpu_add_int(&self.submitting, -1)
        self._leave()

    def write_entered(self, uintptr_t buffer, uint64_t offset, uintptr_t data, size_t size):
        """(Entered by :meth:`try_enter_write`.)  wgpuQueueWriteBuffer of ``size`` bytes at ``data`` into the
        buffer ``buffer`` (a native address) at ``offset``, without the GIL, then leave the gate."""
        with nogil:
            self.fn_write(<void*>self.table.queue, <void*>buffer, offset, <const void*>data, size)
            ortgpu_add_int(&self.submitting, -1)
            self._leave()

    def request_map(self, uintptr_t staging, uint64_t size, MapWait wait):
        """Request the mapping of the first ``size`` bytes of the staging buffer ``staging``, reported to ``wait``,
        keeping the GIL (a short call, made under the device's lock: the device is not being destroyed)."""
        cdef MapCallbackInfo info = wait.callback_info(self.callback_mode)
        self.fn_map(<void*>staging, self.map_mode, 0, size, info)

    def wait(self, MapWait wait, double spin_seconds, double nap_seconds):
        """Without the GIL: wait until ``wait``'s request completes.  Polls wgpu-native while no other thread does
        (the poll lock): without blocking for ``spin_seconds``, then still without blocking but sleeping between
        polls (20 us, doubling up to 200 us) for ``nap_seconds``, then blocking; a thread that is not polling spins
        (yielding its core) meanwhile, then naps between checks.  Returns DONE, WAIT_IDLE (a blocking poll
        completed the device's submitted work but not this request), CLOSING or LOST."""
        cdef int code
        with nogil:
            if not self._enter():
                code = _CLOSING
            else:
                code = self._wait(wait, spin_seconds, nap_seconds)
                self._leave()
        return code

    cdef int _wait(self, MapWait wait, double spin_seconds, double nap_seconds) noexcept nogil:
        # Spin (polling without blocking) for spin_seconds; then poll without blocking with naps between polls for
        # nap_seconds more; then block in the driver.  Only the thread holding the poll lock polls; the others
        # yield their core while spinning, then nap.
        cdef double now = _monotonic_seconds()
        cdef double spin_end = now + spin_seconds
        cdef double nap_end = spin_end + nap_seconds
        cdef long nap_ns = _NAP_POLL_FIRST_NS
        cdef bint spinning, napping
        while True:
            if ortgpu_read_int(&wait._status) != 0:
                return _DONE
            if ortgpu_read_int(&self.closing):
                return _CLOSING
            if self.lost != NULL and ortgpu_read_int(self.lost):
                return _LOST
            now = _monotonic_seconds()
            spinning = now < spin_end
            napping = not spinning and now < nap_end
            if self.poll_lock.try_take():
                if spinning or napping:
                    self.fn_poll(self.device, 0, NULL)
                else:
                    self.blocking_polls += 1
                    self.fn_poll(self.device, 1, NULL)
                self.poll_lock.give()
                if napping:
                    if ortgpu_read_int(&wait._status) == 0:
                        _sleep_ns(nap_ns)
                        nap_ns = nap_ns * 2 if nap_ns * 2 < _NAP_POLL_LONGEST_NS else _NAP_POLL_LONGEST_NS
                elif not spinning and ortgpu_read_int(&wait._status) == 0:
                    # a blocking poll waits for all work submitted before it, this request's copy included
                    return _IDLE
            elif spinning:
                sched_yield()
            else:
                _nap()
