# cython: language_level=3
"""Allocators of device values: Env-shared and session-owned.

:class:`SharedAllocator` (``env.shared_allocator(device)``) belongs to the Env:
its values may be bound by every session on the same device, outlive
sessions, and its uploads are queue writes submitted at once (an independent
recording, not any session's).  :class:`SessionAllocator` belongs to one
session: its values may be bound only by that session and are released when
the session closes.

Both check shapes and dtypes against the device *before* allocating, so an
absurd shape changes nothing.  Buffers are zero-filled.  The allocator keeps
weak references to its buffers (to release them at ``close()``); each buffer's
value keeps it alive.
"""

import threading
import weakref

import numpy as np

from ._env cimport Device, Env
from ._value cimport DeviceBuffer, Provenance, make_device_value
from ._layout import check_shape, padded_size
from ._dtypes import as_dtype, check_device_dtype
from ._dlpack import host_array, is_dlpack_producer
from ._errors import ArgumentTypeError, NotCopyable, ReleasedValueError, ShapeError

_CREATE = object()


cdef class DeviceAllocator:
    """Common base of :class:`SharedAllocator` and :class:`SessionAllocator`."""

    def __init__(self, *args, **kwargs):
        raise ArgumentTypeError("use env.shared_allocator(device), or SessionAllocator(env, device, session_id)")

    _copy_hint = "Use env.shared_allocator(device) or session.allocator itself."
    __copy__ = NotCopyable.__copy__
    __deepcopy__ = NotCopyable.__deepcopy__
    __reduce_ex__ = NotCopyable.__reduce_ex__

    cdef void _setup(self, Env env, Device device, str kind, object session_id):
        env.check_device(device)
        self.device = device
        self.kind = kind
        self.session_id = session_id
        self.env_id = env.id
        self._env_ref = weakref.ref(env)
        self._buffers = weakref.WeakSet()
        self._lock = threading.Lock()
        self._closed = False
        self._closed_reason = ""
        self._provenance = Provenance._create("webgpu", device, kind, session_id, env.id)

    cpdef check_open(self):
        if self._closed:
            raise ReleasedValueError(
                f"{self!r} is closed ({self._closed_reason}); values can no longer be allocated from it"
            )
        if self.device._closed:
            raise ReleasedValueError(f"{self!r} cannot allocate: its device was closed with its Env")

    @property
    def provenance(self):
        """The :class:`Provenance` every value of this allocator carries."""
        return self._provenance

    @property
    def closed(self):
        """True once the allocator was closed (its session or Env closed): it makes no more values."""
        return self._closed

    def _describe_owner(self):
        if self.kind == "shared":
            return f"the shared allocator of device {self.device.index} in Env {self.env_id}"
        return f"session {self.session_id}"

    def empty(self, shape, dtype="float32"):
        """A zero-filled device value of ``shape`` and ``dtype`` (numpy dtype or name)."""
        self.check_open()
        dims = check_shape(shape)
        dtype = as_dtype(dtype)
        backend_device = self.device._native_device()
        check_device_dtype(dtype, backend_device.features, self.device.name)
        count = 1
        for dim in dims:
            count *= dim
        nbytes = count * dtype.itemsize
        limits = backend_device.limits
        if nbytes > limits.max_buffer_size:
            raise ShapeError(
                f"shape {list(dims)} of {dtype} needs {nbytes} bytes, more than device {self.device.index} "
                f"({self.device.name}) allows in one buffer (max_buffer_size={limits.max_buffer_size}); "
                f"use a smaller shape or split the tensor"
            )
        buffer = self._allocate(padded_size(nbytes))
        return make_device_value(buffer, dims, dtype, self._provenance)

    def from_numpy(self, array):
        """A device value holding a copy of ``array`` (its dtype and shape kept exactly)."""
        if not isinstance(array, np.ndarray):
            if not is_dlpack_producer(array):
                raise ArgumentTypeError(
                    f"from_numpy needs a numpy array or a DLPack tensor, got {type(array).__name__}; "
                    f"wrap it with np.asarray(...)"
                )
            array = host_array(array, "from_numpy")
        value = self.empty(array.shape, array.dtype)
        try:
            value.update_inplace(array)
        except BaseException:
            value.release()
            raise
        return value

    def zeros(self, shape, dtype="float32"):
        """Same as :meth:`empty`: device buffers are always zero-filled."""
        return self.empty(shape, dtype)

    def _allocate(self, Py_ssize_t nbytes):
        """A new :class:`DeviceBuffer` of ``nbytes`` (already padded).  Internal: used by sessions too."""
        self.check_open()
        backend_device = self.device._native_device()
        handle = backend_device.create_buffer(nbytes, label=self.kind)
        buffer = DeviceBuffer._create(self.device, handle, nbytes, self._describe_owner())
        with self._lock:
            self._buffers.add(buffer)
        return buffer

    def live_buffers(self):
        """How many of this allocator's buffers are alive (not released)."""
        with self._lock:
            return sum(1 for b in self._buffers if not (<DeviceBuffer>b)._released)

    def close(self, reason=None):
        """Release every buffer of this allocator (pinned ones raise ``CaptureStateError``). Idempotent."""
        with self._lock:
            if self._closed:
                return
            buffers = list(self._buffers)
        for buffer in buffers:
            if (<DeviceBuffer>buffer)._pins:
                (<DeviceBuffer>buffer).release()  # raises CaptureStateError naming the graph
        self._close_buffers(buffers, reason, False)

    def _close_for_env(self, reason):
        """Close when the Env closes: every session is closed by then, so no graph can replay and pins left by
        a graph nobody released do not hold.  Never raises."""
        with self._lock:
            if self._closed:
                return
            buffers = list(self._buffers)
        self._close_buffers(buffers, reason, True)

    cdef _close_buffers(self, list buffers, object reason, bint force):
        with self._lock:
            self._closed = True
            self._closed_reason = reason or "closed"
        why = f"{self._describe_owner()} was closed ({self._closed_reason})"
        for buffer in buffers:
            if force:
                (<DeviceBuffer>buffer).force_release(why)
            else:
                (<DeviceBuffer>buffer).release(why)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


cdef class SharedAllocator(DeviceAllocator):
    """Env-shared device buffers: bindable by every session on the same device, usable before any session."""

    @staticmethod
    def _create(Env env, Device device):
        cdef SharedAllocator allocator = SharedAllocator.__new__(SharedAllocator)
        allocator._setup(env, device, "shared", None)
        return allocator

    def __init__(self, *args, **kwargs):
        raise ArgumentTypeError("SharedAllocator is created by its Env: use env.shared_allocator(device)")

    def __repr__(self):
        return f"<SharedAllocator device={self.device.index} ({self.device.name}) env={self.env_id}>"


cdef class SessionAllocator(DeviceAllocator):
    """Session-owned device buffers: bindable only by session ``session_id``, released when it closes.

    Sessions create their own (``sess.allocator``); constructing one directly
    (``SessionAllocator(env, device, session_id)``) is for tests and tools.
    """

    def __init__(self, Env env, Device device, session_id):
        if isinstance(session_id, bool) or not isinstance(session_id, int):
            raise ArgumentTypeError(f"session_id must be an int, got {session_id!r}")
        self._setup(env, device, "session", session_id)

    def __repr__(self):
        state = " closed" if self._closed else ""
        return (
            f"<SessionAllocator session={self.session_id} device={self.device.index} ({self.device.name}) "
            f"env={self.env_id}{state}>"
        )
