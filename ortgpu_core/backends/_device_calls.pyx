# cython: language_level=3, boundscheck=False, wraparound=False
"""The native calls of a wgpu device's hot path, made from C: spinning without the GIL, and the short calls made
under the device's lock *without* releasing the GIL.

Spinning: a thread that waits for its read or ``wait_idle`` polls wgpu-native without blocking for a while before it
blocks (blocking costs a wake-up's latency; see ``_wgpu_readback``).  Spun in Python, each poll would take and
release the GIL, and the spinning thread would keep re-taking it before the threads that need it to prepare their
next submission could.  :func:`spin_poll` runs the loop in C with the GIL released: it calls
``wgpuDevicePoll(device, false, NULL)`` until the int the map and work-done callbacks set when they fire becomes
nonzero, or the time is up.  (The callbacks are Python: cffi takes the GIL to run them.)

Under the lock: cffi releases the GIL around every call, so a thread holding the device's lock would give the GIL
away for a call of a few microseconds and then queue for it behind whatever Python another thread runs, with the
device locked all that time (measured on the H200: with two threads reading, the under-the-lock part of a 4 KB read
went from 8 us to 110 us; keeping the GIL there, 50 us, and 4 KB reads by two threads 9.6k -> 14.3k per second).
:func:`map_read` (``wgpuBufferMapAsync``) and :func:`copy_out` (get the mapped range, copy out, unmap) keep the
GIL: they are short.  (Submits and uploads keeping the GIL made no measurable difference to the threads bench, so
they release it as before.)
"""

from libc.stdint cimport uint32_t, uint64_t, uintptr_t
from libc.string cimport memcpy
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

cdef extern from *:
    """
    static inline int ortgpu_load_flag(const int *flag) { return __atomic_load_n(flag, __ATOMIC_ACQUIRE); }
    """
    int ortgpu_load_flag(const int *flag) nogil

# The layout of WGPUBufferMapCallbackInfo (webgpu.h): checked against cffi's by the wgpu backend's tests.
ctypedef struct MapCallbackInfo:
    void* nextInChain
    uint32_t mode
    void* callback
    void* userdata1
    void* userdata2

ctypedef struct Future:
    uint64_t id

# WGPUBool wgpuDevicePoll(WGPUDevice device, WGPUBool wait, WGPUSubmissionIndex const * submissionIndex)
ctypedef uint32_t (*device_poll_fn)(void*, uint32_t, const void*) noexcept nogil
# WGPUFuture wgpuBufferMapAsync(WGPUBuffer, WGPUMapMode, size_t offset, size_t size, WGPUBufferMapCallbackInfo)
ctypedef Future (*map_async_fn)(void*, uint64_t, size_t, size_t, MapCallbackInfo) noexcept
# void const * wgpuBufferGetConstMappedRange(WGPUBuffer buffer, size_t offset, size_t size)
ctypedef const void* (*mapped_range_fn)(void*, size_t, size_t) noexcept
# void wgpuBufferUnmap(WGPUBuffer buffer)
ctypedef void (*unmap_fn)(void*) noexcept

MAP_CALLBACK_INFO_SIZE = sizeof(MapCallbackInfo)


cdef inline double _monotonic_seconds() noexcept nogil:
    cdef timespec now
    clock_gettime(CLOCK_MONOTONIC, &now)
    return now.tv_sec + now.tv_nsec * 1e-9


def spin_poll(uintptr_t device_poll, uintptr_t device, uintptr_t flag, double seconds):
    """Poll ``device`` without blocking (``device_poll``: the address of wgpuDevicePoll), with the GIL released,
    until the int at ``flag`` is nonzero or ``seconds`` have passed; returns the number of polls made (at least
    one).  The caller keeps the device and the flag alive meanwhile."""
    cdef const int* fired = <const int*>flag
    cdef device_poll_fn poll = <device_poll_fn>device_poll
    cdef long polls = 0
    cdef double deadline
    if device_poll == 0 or device == 0 or flag == 0:
        raise ValueError("spin_poll: a null address")
    with nogil:
        deadline = _monotonic_seconds() + seconds
        while True:
            poll(<void*>device, 0, NULL)
            polls += 1
            if ortgpu_load_flag(fired) != 0 or _monotonic_seconds() >= deadline:
                break
    return polls


def map_read(uintptr_t map_async, uintptr_t buffer, uint64_t mode, size_t size, uint32_t callback_mode,
             uintptr_t callback, uintptr_t token):
    """``wgpuBufferMapAsync(buffer, mode, 0, size, {callback_mode, callback, userdata1=token})``, keeping the GIL."""
    cdef MapCallbackInfo info
    info.nextInChain = NULL
    info.mode = callback_mode
    info.callback = <void*>callback
    info.userdata1 = <void*>token
    info.userdata2 = NULL
    if map_async == 0 or buffer == 0 or callback == 0:
        raise ValueError("map_read: a null address")
    (<map_async_fn>map_async)(<void*>buffer, mode, 0, size, info)


def copy_out(uintptr_t mapped_range, uintptr_t unmap, uintptr_t buffer, size_t size, list regions):
    """Get the first ``size`` bytes of the mapped ``buffer``, copy each ``(destination address, bytes, offset in
    the mapping)`` of ``regions`` out, and unmap, keeping the GIL.  Returns False (after unmapping) when the mapped
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
                memcpy(<void*>destination, mapped + offset, count)
        return True
    finally:
        (<unmap_fn>unmap)(<void*>buffer)

