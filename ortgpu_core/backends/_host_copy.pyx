# cython: language_level=3, boundscheck=False, wraparound=False
"""Large host copies split across threads: the copy between a mapped staging buffer and a user's array.

A read's last step, and a staged upload's first, is one ``memcpy`` between host memory the GPU's copy engine
reaches (a staging buffer) and the caller's array.  One core copies about 10-15 GB/s, slower than the bus on a
discrete GPU, so for a 16 MB tensor the host copy, not the transfer, sets the pace.  :func:`host_copy` splits a
copy of at least ``2 * MIN_SLICE`` bytes into slices of at least :data:`MIN_SLICE` bytes, one per thread (at most
:func:`copy_threads`), the calling thread taking the first; the helpers are plain pthreads started for the call
and joined before it returns (starting one costs tens of microseconds, a small part of copying a slice).  A thread
that cannot be started leaves its slice to the caller.  The threads take no GIL and no lock: the caller owns both
ranges until the call returns.

The thread count defaults to half the machine's cores, at most 4 (:func:`default_copy_threads`): more cores than
that add little to one socket's memory bandwidth, and on a 2-core machine running a software GPU driver the
driver's own threads need the other core.
"""

import os

from libc.stddef cimport size_t
from libc.string cimport memcpy

cdef extern from "<pthread.h>" nogil:
    ctypedef unsigned long pthread_t
    ctypedef struct pthread_attr_t:
        pass
    int pthread_create(pthread_t* thread, const pthread_attr_t* attr, void* (*start)(void*) noexcept nogil,
                       void* arg)
    int pthread_join(pthread_t thread, void** result)

# No copy is split below this many bytes per slice (each extra thread must have at least this much to copy).
cdef size_t _MIN_SLICE = 1 << 20
MIN_SLICE = _MIN_SLICE
# Slices start on this boundary (a cache line) so no two threads write the same line.
cdef size_t _ALIGN = 64
cdef int _MAX_THREADS = 16

cdef struct _Slice:
    char* destination
    const char* source
    size_t size

cdef int _threads = 1


def default_copy_threads(cores=None):
    """Half of ``cores`` (the machine's, by default), between 1 and 4."""
    count = os.cpu_count() if cores is None else cores
    return max(1, min(4, int(count or 1) // 2))


def copy_threads():
    """The most threads one :func:`host_copy` uses."""
    return _threads


def set_copy_threads(count):
    """Use at most ``count`` threads (1..16) per large host copy; returns the previous count."""
    global _threads
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= _MAX_THREADS:
        raise ValueError(f"set_copy_threads takes an int from 1 to {_MAX_THREADS}, not {count!r}")
    previous = _threads
    _threads = count
    return previous


cdef void* _copy_slice(void* argument) noexcept nogil:
    cdef _Slice* piece = <_Slice*>argument
    memcpy(piece.destination, piece.source, piece.size)
    return NULL


cdef void host_copy(void* destination, const void* source, size_t size) noexcept nogil:
    """``memcpy(destination, source, size)``, split across threads when it is large (see the module)."""
    cdef size_t min_slice = _MIN_SLICE
    cdef int count = _threads
    cdef size_t per, start, end
    cdef int index
    cdef _Slice pieces[16]
    cdef pthread_t helpers[16]
    cdef int started[16]
    if count > <int>(size // min_slice):
        count = <int>(size // min_slice)
    if count <= 1:
        memcpy(destination, source, size)
        return
    per = (size // <size_t>count + _ALIGN - 1) // _ALIGN * _ALIGN
    for index in range(count):
        start = per * <size_t>index
        end = start + per if index < count - 1 else size
        if end > size:
            end = size
        if start > end:
            start = end
        pieces[index].destination = <char*>destination + start
        pieces[index].source = <const char*>source + start
        pieces[index].size = end - start
        started[index] = 0
    for index in range(1, count):
        started[index] = pthread_create(&helpers[index], NULL, _copy_slice, &pieces[index]) == 0
    _copy_slice(&pieces[0])
    for index in range(1, count):
        if started[index]:
            pthread_join(helpers[index], NULL)
        else:
            _copy_slice(&pieces[index])


def copy_bytes(destination, source):
    """Copy the bytes of ``source`` (any C-contiguous buffer) into ``destination`` (a writable one of the same
    size) through :func:`host_copy`, without the GIL: the bench's and the tests' way to reach it."""
    cdef const unsigned char[::1] src = memoryview(source).cast("B")
    cdef unsigned char[::1] dst = memoryview(destination).cast("B")
    cdef size_t size = src.shape[0]
    if dst.shape[0] != src.shape[0]:
        raise ValueError(f"copy_bytes: {dst.shape[0]} destination bytes for {src.shape[0]} source bytes")
    if size:
        with nogil:
            host_copy(&dst[0], &src[0], size)


_threads = default_copy_threads()
