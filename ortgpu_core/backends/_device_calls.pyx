# cython: language_level=3, boundscheck=False, wraparound=False
"""The native calls of a wgpu device's hot path, made from C: spinning without the GIL, and the short calls made
under the device's lock *without* releasing the GIL.

Spinning: a thread that waits for its read or ``wait_idle`` polls wgpu-native without blocking for a while before it
blocks (blocking costs a wake-up's latency; see ``_wgpu_readback``).  Spun in Python, each poll would take and
release the GIL, and the spinning thread would keep re-taking it before the threads that need it to prepare their
next submission could.  :func:`spin_poll` runs the loop in C with the GIL released: it calls
``wgpuDevicePoll(device, false, NULL)`` until the int the map and work-done callbacks set when they fire becomes
nonzero, or the time is up.  The callbacks are C too (:class:`Completions`): they run inside wgpu-native's polls
and submits, holding its locks, and take no GIL there; they queue what they report for Python to read.

Under the lock: cffi releases the GIL around every call, so a thread holding the device's lock would give the GIL
away for a call of a few microseconds and then queue for it behind whatever Python another thread runs, with the
device locked all that time (with two threads reading, the under-the-lock part of a small read grew many times
over; keeping the GIL there made it shorter and two threads' small reads faster).
:func:`map_read` (``wgpuBufferMapAsync``), :func:`copy_out` (get the mapped range, copy out, unmap),
:func:`queue_write` (the empty write that probes for a lost device) and :func:`request_work_done` keep the GIL: they
are short.  (Submits and uploads keeping the GIL made no difference to the threads bench's throughput and worsened
its p99 at K=8 threads: they release it.)  Keeping the GIL in a native call is
safe because no wgpu-native callback needs it: all of them are C, here (:class:`Completions`,
:class:`ErrorReports`).
"""

from cpython.pythread cimport (
    PyThread_type_lock, PyThread_allocate_lock, PyThread_free_lock, PyThread_acquire_lock, PyThread_release_lock,
    WAIT_LOCK,
)
from libc.stdint cimport uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy

from posix.time cimport clock_gettime, nanosleep, timespec, CLOCK_MONOTONIC

from ._host_copy cimport host_copy
from ._webgpu_types cimport (
    Future, MapCallbackInfo, StringView, device_poll_fn, map_async_fn, mapped_range_fn, unmap_fn,
)

cdef extern from *:
    """
    static inline int ortgpu_load_flag(const int *flag) { return __atomic_load_n(flag, __ATOMIC_ACQUIRE); }
    static inline void ortgpu_store_flag(int *flag, int value) { __atomic_store_n(flag, value, __ATOMIC_RELEASE); }
    static inline size_t ortgpu_load_size(const size_t *value) { return __atomic_load_n(value, __ATOMIC_ACQUIRE); }
    static inline void ortgpu_store_size(size_t *target, size_t value) {
        __atomic_store_n(target, value, __ATOMIC_RELEASE);
    }
    static inline void ortgpu_count_up(uint32_t *counter) { __atomic_add_fetch(counter, 1, __ATOMIC_SEQ_CST); }
    static inline unsigned long ortgpu_thread_ident(void) { return PyThread_get_thread_ident(); }
    """
    int ortgpu_load_flag(const int *flag) nogil
    void ortgpu_store_flag(int *flag, int value) nogil
    size_t ortgpu_load_size(const size_t *value) nogil
    void ortgpu_store_size(size_t *target, size_t value) nogil
    void ortgpu_count_up(uint32_t *counter) nogil
    unsigned long ortgpu_thread_ident() nogil

MAP_CALLBACK_INFO_SIZE = sizeof(MapCallbackInfo)


cdef inline double _monotonic_seconds() noexcept nogil:
    cdef timespec now
    clock_gettime(CLOCK_MONOTONIC, &now)
    return now.tv_sec + now.tv_nsec * 1e-9


def spin_poll(uintptr_t device_poll, uintptr_t device, uintptr_t flag, double seconds, bint nap=False):
    """Poll ``device`` without blocking (``device_poll``: the address of wgpuDevicePoll), with the GIL released,
    until the int at ``flag`` is nonzero or ``seconds`` have passed; returns the number of polls made (at least
    one).  With ``nap``, sleep between polls (20 us, doubling up to 200 us) instead of spinning.  The caller keeps
    the device and the flag alive meanwhile."""
    cdef const int* fired = <const int*>flag
    cdef device_poll_fn poll = <device_poll_fn>device_poll
    cdef long polls = 0
    cdef double deadline
    cdef timespec pause
    cdef long nap_ns = 20000
    if device_poll == 0 or device == 0 or flag == 0:
        raise ValueError("spin_poll: a null address")
    with nogil:
        deadline = _monotonic_seconds() + seconds
        while True:
            poll(<void*>device, 0, NULL)
            polls += 1
            if ortgpu_load_flag(fired) != 0 or _monotonic_seconds() >= deadline:
                break
            if nap:
                pause.tv_sec = 0
                pause.tv_nsec = nap_ns
                nanosleep(&pause, NULL)
                nap_ns = nap_ns * 2 if nap_ns * 2 < 200000 else 200000
    return polls


def map_read(uintptr_t map_async, uintptr_t buffer, uint64_t mode, size_t size, uint32_t callback_mode,
             uintptr_t callback, uintptr_t token, uintptr_t userdata2=0):
    """``wgpuBufferMapAsync(buffer, mode, 0, size, {callback_mode, callback, token, userdata2})``, keeping the
    GIL."""
    cdef MapCallbackInfo info
    info.nextInChain = NULL
    info.mode = callback_mode
    info.callback = <void*>callback
    info.userdata1 = <void*>token
    info.userdata2 = <void*>userdata2
    if map_async == 0 or buffer == 0 or callback == 0:
        raise ValueError("map_read: a null address")
    (<map_async_fn>map_async)(<void*>buffer, mode, 0, size, info)


# -- completions: the map and work-done callbacks, in C --------------------------------------------------------


cdef enum:
    _MESSAGE_BYTES = 240
    _KIND_MAP = 0
    _KIND_WORK_DONE = 1

ctypedef struct Completion:
    uint64_t token
    uint32_t kind  # COMPLETION_MAP or COMPLETION_WORK_DONE
    uint32_t status
    char message[_MESSAGE_BYTES]

ctypedef struct CompletionQueue:
    PyThread_type_lock lock
    Completion* items
    size_t count  # written under lock, read without it (atomically) to skip an empty take
    size_t capacity
    size_t dropped  # completions lost to a failed allocation
    int fired  # set by every callback: what spin_poll watches

#: ``kind`` of a completion made by the map callback / the queue's work-done callback.
COMPLETION_MAP = _KIND_MAP
COMPLETION_WORK_DONE = _KIND_WORK_DONE


# The queues below are written by callbacks inside native calls (any thread, with or without the GIL) and read
# from Python.  Their locks are held for a few C statements only, and Python takes them keeping the GIL
# (:func:`_hold`): a holder that waited for the GIL could deadlock with a callback running inside a native call
# made keeping the GIL.


cdef inline void _hold(PyThread_type_lock lock) noexcept:
    """Take a queue's lock from Python, keeping the GIL (see above)."""
    PyThread_acquire_lock(lock, WAIT_LOCK)


cdef int _reserve(void** items, size_t* capacity, size_t count, size_t item_size) noexcept nogil:
    """Room for one more item in a queue's array (grown by doubling); 0 when there is no memory."""
    cdef size_t grown_capacity
    cdef void* grown
    if count < capacity[0]:
        return 1
    grown_capacity = capacity[0] * 2 if capacity[0] else 16
    grown = realloc(items[0], grown_capacity * item_size)
    if grown == NULL:
        return 0
    items[0] = grown
    capacity[0] = grown_capacity
    return 1


cdef size_t _message_length(StringView message, size_t limit) noexcept nogil:
    """The length of ``message`` (WGPU_STRLEN: NUL-terminated), at most ``limit``."""
    cdef size_t length = 0
    if message.data == NULL:
        return 0
    if message.length != <size_t>-1:
        return message.length if message.length < limit else limit
    while length < limit and message.data[length] != 0:
        length += 1
    return length


cdef void _push(CompletionQueue* queue, uint32_t kind, void* token, uint32_t status, StringView message) noexcept nogil:
    cdef Completion* item
    cdef size_t length
    if queue == NULL:
        return
    PyThread_acquire_lock(queue.lock, WAIT_LOCK)
    if not _reserve(<void**>&queue.items, &queue.capacity, queue.count, sizeof(Completion)):
        queue.dropped += 1
    else:
        item = &queue.items[queue.count]
        item.token = <uint64_t><uintptr_t>token
        item.kind = kind
        item.status = status
        length = _message_length(message, _MESSAGE_BYTES - 1)
        if length:
            memcpy(item.message, message.data, length)
        item.message[length] = 0
        ortgpu_store_size(&queue.count, queue.count + 1)
    PyThread_release_lock(queue.lock)
    ortgpu_store_flag(&queue.fired, 1)


# void (*WGPUBufferMapCallback)(WGPUMapAsyncStatus, WGPUStringView message, void* userdata1, void* userdata2)
cdef void _on_map(uint32_t status, StringView message, void* userdata1, void* userdata2) noexcept nogil:
    _push(<CompletionQueue*>userdata2, _KIND_MAP, userdata1, status, message)


# void (*WGPUQueueWorkDoneCallback)(WGPUQueueWorkDoneStatus, WGPUStringView message, void* userdata1, void* userdata2)
cdef void _on_work_done(uint32_t status, StringView message, void* userdata1, void* userdata2) noexcept nogil:
    _push(<CompletionQueue*>userdata2, _KIND_WORK_DONE, userdata1, status, message)


#: The addresses of the two C callbacks (each takes its request's token as userdata1 and the
#: :class:`Completions` queue's ``address`` as userdata2).
MAP_CALLBACK = <uintptr_t>&_on_map
WORK_DONE_CALLBACK = <uintptr_t>&_on_work_done


cdef class Completions:
    """What the C map and work-done callbacks report: ``(kind, token, status, message)`` in the order they fired,
    until :meth:`take`n.  The callbacks run inside whichever native call completes a request (a poll, another
    thread's submit) and take no GIL, so a thread inside wgpu-native never waits for Python there.  The queue
    must outlive every request made with its ``address``."""

    cdef CompletionQueue queue

    def __cinit__(self):
        self.queue.lock = PyThread_allocate_lock()
        if self.queue.lock == NULL:
            raise MemoryError("Completions: no lock")
        self.queue.items = NULL
        self.queue.count = 0
        self.queue.capacity = 0
        self.queue.dropped = 0
        self.queue.fired = 0

    def __dealloc__(self):
        if self.queue.lock != NULL:
            PyThread_free_lock(self.queue.lock)
        free(self.queue.items)

    @property
    def address(self):
        """The queue's address: the callbacks' userdata2."""
        return <uintptr_t>&self.queue

    @property
    def fired_address(self):
        """The address of the int every callback sets to 1 (what :func:`spin_poll` watches)."""
        return <uintptr_t>&self.queue.fired

    @property
    def fired(self):
        return ortgpu_load_flag(&self.queue.fired) != 0

    @property
    def pending(self):
        """How many completions wait to be taken."""
        return ortgpu_load_size(&self.queue.count)

    def clear_fired(self):
        ortgpu_store_flag(&self.queue.fired, 0)

    def take(self):
        """The completions recorded since the last take, oldest first (an empty list, without locking, when
        there are none).  Raises MemoryError if a completion was lost to a failed allocation."""
        cdef list taken = []
        cdef size_t i, dropped
        cdef Completion* item
        if ortgpu_load_size(&self.queue.count) == 0 and self.queue.dropped == 0:
            return taken
        _hold(self.queue.lock)
        try:
            for i in range(self.queue.count):
                item = &self.queue.items[i]
                taken.append((item.kind, item.token, item.status, (<char*>item.message).decode("utf-8", "replace")))
            ortgpu_store_size(&self.queue.count, 0)
            dropped, self.queue.dropped = self.queue.dropped, 0
        finally:
            PyThread_release_lock(self.queue.lock)
        if dropped:
            raise MemoryError(f"{dropped} map or work-done completions were lost (no memory to record them)")
        return taken


# void wgpuQueueWriteBuffer(WGPUQueue, WGPUBuffer, uint64_t bufferOffset, void const * data, size_t size)
ctypedef void (*queue_write_fn)(void*, void*, uint64_t, const void*, size_t) noexcept
# WGPUFuture wgpuQueueOnSubmittedWorkDone(WGPUQueue queue, WGPUQueueWorkDoneCallbackInfo callbackInfo)
ctypedef struct WorkDoneCallbackInfo:
    void* nextInChain
    uint32_t mode
    void* callback
    void* userdata1
    void* userdata2
ctypedef Future (*work_done_fn)(void*, WorkDoneCallbackInfo) noexcept


WORK_DONE_CALLBACK_INFO_SIZE = sizeof(WorkDoneCallbackInfo)


def queue_write(uintptr_t write_buffer, uintptr_t queue, uintptr_t buffer, uint64_t offset, uintptr_t data,
                size_t size):
    """``wgpuQueueWriteBuffer(queue, buffer, offset, data, size)``, keeping the GIL (for short writes made under
    the device's lock; ``data`` may be 0 when ``size`` is 0)."""
    if write_buffer == 0 or queue == 0 or buffer == 0 or (data == 0 and size != 0):
        raise ValueError("queue_write: a null address")
    (<queue_write_fn>write_buffer)(<void*>queue, <void*>buffer, offset, <const void*>data, size)


def request_work_done(uintptr_t on_submitted_work_done, uintptr_t queue, uint32_t callback_mode,
                      uintptr_t callback, uintptr_t token, uintptr_t userdata2):
    """``wgpuQueueOnSubmittedWorkDone(queue, {callback_mode, callback, token, userdata2})``, keeping the GIL."""
    cdef WorkDoneCallbackInfo info
    info.nextInChain = NULL
    info.mode = callback_mode
    info.callback = <void*>callback
    info.userdata1 = <void*>token
    info.userdata2 = <void*>userdata2
    if on_submitted_work_done == 0 or queue == 0 or callback == 0:
        raise ValueError("request_work_done: a null address")
    (<work_done_fn>on_submitted_work_done)(<void*>queue, info)


def copy_out(uintptr_t mapped_range, uintptr_t unmap, uintptr_t buffer, size_t size, list regions):
    """Get the first ``size`` bytes of the mapped ``buffer``, copy each ``(destination address, bytes, offset in
    the mapping)`` of ``regions`` out (a large one split across threads: :mod:`._host_copy`), and unmap, keeping
    the GIL.  Returns False (after unmapping) when the mapped
    range is NULL.  The caller checked that every region lies inside ``size`` and its destination."""
    cdef const char* mapped
    cdef uintptr_t destination
    cdef size_t count, offset
    if mapped_range == 0 or unmap == 0 or buffer == 0:
        raise ValueError("copy_out: a null address")
    mapped = <const char*>(<mapped_range_fn>mapped_range)(<void*>buffer, 0, size)
    try:
        if mapped == NULL:
            return False
        for destination, count, offset in regions:
            if count:
                host_copy(<void*>destination, mapped + offset, count)
        return True
    finally:
        (<unmap_fn>unmap)(<void*>buffer)


# -- errors and device loss: the device's uncaptured-error and device-lost callbacks, in C ----------------------

ctypedef struct ErrorEntry:
    unsigned long thread  # the thread whose native call reported it (the callback runs inside that call)
    uint32_t type  # WGPUErrorType
    char* message  # malloc'd, NUL-terminated

ctypedef struct ErrorQueue:
    PyThread_type_lock lock
    ErrorEntry* items
    size_t count
    size_t capacity
    size_t dropped
    uint32_t error_count  # every error reported (the command loop compares it around wgpuCommandEncoderFinish)
    int lost  # set once by the device-lost callback (unless ignore_lost)
    uint32_t lost_reason
    char* lost_message
    int ignore_lost


cdef char* _copy_message(StringView message) noexcept nogil:
    cdef size_t length = _message_length(message, <size_t>-1)
    cdef char* copy = <char*>malloc(length + 1)
    if copy != NULL:
        if length:
            memcpy(copy, message.data, length)
        copy[length] = 0
    return copy


# void (*WGPUUncapturedErrorCallback)(WGPUDevice const * device, WGPUErrorType type, WGPUStringView message,
#                                     void* userdata1, void* userdata2)
cdef void _on_uncaptured_error(const void* device, uint32_t error_type, StringView message, void* userdata1,
                               void* userdata2) noexcept nogil:
    cdef ErrorQueue* queue = <ErrorQueue*>userdata1
    if queue == NULL:
        return
    ortgpu_count_up(&queue.error_count)
    PyThread_acquire_lock(queue.lock, WAIT_LOCK)
    if not _reserve(<void**>&queue.items, &queue.capacity, queue.count, sizeof(ErrorEntry)):
        queue.dropped += 1
    else:
        queue.items[queue.count].thread = ortgpu_thread_ident()
        queue.items[queue.count].type = error_type
        queue.items[queue.count].message = _copy_message(message)
        queue.count += 1
    PyThread_release_lock(queue.lock)


# void (*WGPUDeviceLostCallback)(WGPUDevice const * device, WGPUDeviceLostReason reason, WGPUStringView message,
#                                void* userdata1, void* userdata2)
cdef void _on_device_lost(const void* device, uint32_t reason, StringView message, void* userdata1,
                          void* userdata2) noexcept nogil:
    cdef ErrorQueue* queue = <ErrorQueue*>userdata1
    if queue == NULL:
        return
    PyThread_acquire_lock(queue.lock, WAIT_LOCK)
    if not queue.ignore_lost and not queue.lost:
        queue.lost_reason = reason
        queue.lost_message = _copy_message(message)
        queue.lost = 1
    PyThread_release_lock(queue.lock)


#: The addresses of the device's uncaptured-error and device-lost callbacks (userdata1: an
#: :class:`ErrorReports`' ``address``).
UNCAPTURED_ERROR_CALLBACK = <uintptr_t>&_on_uncaptured_error
DEVICE_LOST_CALLBACK = <uintptr_t>&_on_device_lost


cdef class ErrorReports:
    """What a device's uncaptured-error and device-lost callbacks report.  Both are C and take no GIL, so no
    native call ever waits for Python (a thread may then hold the GIL across a short native call without risking
    a deadlock with another thread inside wgpu-native).  wgpu-native 29 calls the error callback synchronously
    inside the failing call, so each error is recorded with the thread that made it, and :meth:`take` hands a
    thread its own errors only: an error reaches the caller whose call caused it, whatever other threads do."""

    cdef ErrorQueue queue

    def __cinit__(self):
        self.queue.lock = PyThread_allocate_lock()
        if self.queue.lock == NULL:
            raise MemoryError("ErrorReports: no lock")
        self.queue.items = NULL
        self.queue.count = 0
        self.queue.capacity = 0
        self.queue.dropped = 0
        self.queue.error_count = 0
        self.queue.lost = 0
        self.queue.lost_reason = 0
        self.queue.lost_message = NULL
        self.queue.ignore_lost = 0

    def __dealloc__(self):
        cdef size_t i
        for i in range(self.queue.count):
            free(self.queue.items[i].message)
        free(self.queue.items)
        free(self.queue.lost_message)
        if self.queue.lock != NULL:
            PyThread_free_lock(self.queue.lock)

    @property
    def address(self):
        """The callbacks' userdata1."""
        return <uintptr_t>&self.queue

    @property
    def error_count_address(self):
        """The address of the uint32 count of every error reported."""
        return <uintptr_t>&self.queue.error_count

    @property
    def lost_address(self):
        """The address of the int the device-lost callback sets (nonzero once a loss was reported)."""
        return <uintptr_t>&self.queue.lost

    @property
    def pending(self):
        """Errors not taken yet, of every thread."""
        return self.queue.count

    @property
    def lost(self):
        """``(WGPUDeviceLostReason, message)`` once the device-lost callback reported a loss, else None."""
        if not ortgpu_load_flag(&self.queue.lost):
            return None
        message = "" if self.queue.lost_message == NULL else (<bytes>self.queue.lost_message).decode("utf-8", "replace")
        return (self.queue.lost_reason, message)

    @property
    def ignore_lost(self):
        return bool(self.queue.ignore_lost)

    @ignore_lost.setter
    def ignore_lost(self, bint value):
        _hold(self.queue.lock)
        self.queue.ignore_lost = value
        PyThread_release_lock(self.queue.lock)

    def take(self, unsigned long thread):
        """The errors reported inside ``thread``'s native calls since its last take, oldest first, as
        ``(WGPUErrorType, message)``; the other threads' stay.  Raises MemoryError if one was lost to a failed
        allocation."""
        cdef list taken = []
        cdef size_t i, kept = 0, dropped
        cdef ErrorEntry* item
        if self.queue.count == 0 and self.queue.dropped == 0:
            return taken
        _hold(self.queue.lock)
        try:
            for i in range(self.queue.count):
                item = &self.queue.items[i]
                if item.thread == thread:
                    text = "" if item.message == NULL else (<bytes>item.message).decode("utf-8", "replace")
                    taken.append((item.type, text))
                    free(item.message)
                else:
                    self.queue.items[kept] = item[0]
                    kept += 1
            self.queue.count = kept
            dropped, self.queue.dropped = self.queue.dropped, 0
        finally:
            PyThread_release_lock(self.queue.lock)
        if dropped:
            raise MemoryError(f"{dropped} wgpu-native errors were lost (no memory to record them)")
        return taken

    def clear(self):
        """Drop every thread's errors (the device is being destroyed)."""
        cdef size_t i
        _hold(self.queue.lock)
        for i in range(self.queue.count):
            free(self.queue.items[i].message)
        self.queue.count = 0
        self.queue.dropped = 0
        PyThread_release_lock(self.queue.lock)
