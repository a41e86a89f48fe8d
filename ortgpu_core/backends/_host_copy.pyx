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

Streaming stores (:func:`set_streaming_stores`, off by default): every copy through :func:`host_copy` (into an
upload's staging memory, out of a read's into the caller's array) is made with non-temporal 16-byte stores (SSE2, on
x86-64; ``memcpy`` elsewhere) instead of ``memcpy``.  An upload's staging memory is write-combined (host-visible, not
cached), where ordinary stores and ``rep movsb`` may run slower than stores that bypass the cache; a switch, so that
``python -m bench.transfers --streaming-stores`` can measure which is faster on a machine.
"""

import os

from libc.stddef cimport size_t
from libc.string cimport memcpy

cdef extern from *:
    """
    #include <string.h>
    #include <stdint.h>
    #if defined(__SSE2__) || defined(_M_X64)
    #include <emmintrin.h>
    static void ortgpu_stream_copy(char *destination, const char *source, size_t size) {
        size_t head = (16 - ((uintptr_t)destination & 15)) & 15, blocks, index;
        if (head > size) head = size;
        memcpy(destination, source, head);
        destination += head; source += head; size -= head;
        blocks = size / 64;
        for (index = 0; index < blocks; index++) {
            __m128i a = _mm_loadu_si128((const __m128i *)source);
            __m128i b = _mm_loadu_si128((const __m128i *)(source + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(source + 32));
            __m128i d = _mm_loadu_si128((const __m128i *)(source + 48));
            _mm_stream_si128((__m128i *)destination, a);
            _mm_stream_si128((__m128i *)(destination + 16), b);
            _mm_stream_si128((__m128i *)(destination + 32), c);
            _mm_stream_si128((__m128i *)(destination + 48), d);
            destination += 64; source += 64;
        }
        memcpy(destination, source, size - blocks * 64);
        _mm_sfence();
    }
    #define ORTGPU_STREAMING_STORES 1
    #else
    static void ortgpu_stream_copy(char *destination, const char *source, size_t size) {
        memcpy(destination, source, size);
    }
    #define ORTGPU_STREAMING_STORES 0
    #endif
    """
    void ortgpu_stream_copy(char* destination, const char* source, size_t size) nogil
    int ORTGPU_STREAMING_STORES

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
cdef int _streaming = 0


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


def streaming_stores_available():
    """Whether this build copies with non-temporal stores when asked (x86-64 with SSE2)."""
    return bool(ORTGPU_STREAMING_STORES)


def streaming_stores():
    """Whether large host copies use non-temporal stores (see the module)."""
    return bool(_streaming)


def set_streaming_stores(on):
    """Copy with non-temporal stores (``True``) or ``memcpy`` (``False``); returns the previous setting.  Where the
    build has none (:func:`streaming_stores_available`), ``True`` still copies with ``memcpy``."""
    global _streaming
    if not isinstance(on, bool):
        raise ValueError(f"set_streaming_stores takes True or False, not {on!r}")
    previous = bool(_streaming)
    _streaming = 1 if on else 0
    return previous


cdef void* _copy_slice(void* argument) noexcept nogil:
    cdef _Slice* piece = <_Slice*>argument
    if _streaming:
        ortgpu_stream_copy(piece.destination, piece.source, piece.size)
    else:
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
        pieces[0].destination = <char*>destination
        pieces[0].source = <const char*>source
        pieces[0].size = size
        _copy_slice(&pieces[0])
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
