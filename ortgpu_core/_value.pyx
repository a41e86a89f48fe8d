# cython: language_level=3
"""OrtValue, its Provenance, and the device buffer behind a device value.

A :class:`DeviceBuffer` is one native buffer on one :class:`Device`.  It is
zero-filled at creation, its size is padded to a multiple of 4 bytes, and it
carries a *generation*: a process-wide counter, so two buffers are never the
same buffer even if the native allocator reuses an address.  Captured graphs
*pin* the buffers they were recorded with: a pinned buffer cannot be released,
and the graph's reference keeps it alive after its OrtValue is dropped.

An :class:`OrtValue` is either a CPU value (a numpy array, or a sparse tensor
of :mod:`ortgpu_core._sparse`) or a device value (a region of a DeviceBuffer,
with a shape and dtype).  Every value has a :class:`Provenance`.  Device values
never expose their memory: no pointer, no DLPack, no ``__array__``; reading is
the explicit, synchronous ``to_numpy()``.
"""

import gc
import itertools
import types
import warnings

cimport cython

import numpy as np

from ._env cimport Device
from ._errors import (
    ArgumentTypeError,
    CaptureStateError,
    DeviceLostError,
    DtypeError,
    NotCopyable,
    ReleasedValueError,
    ShapeError,
    UnsafeAccessError,
    refuse_copy,
)
from ._dtypes import as_dtype, dtype_from_onnx, onnx_type_name
from ._dtypes import onnx_element_type as _onnx_element_type_of
from ._dlpack import host_array, is_dlpack_producer
from ._layout import check_out_array, check_shape, host_zeros, padded_payload, read_new_array
from ._sparse import checked_sparse_tensor, dense_only_error, not_sparse_error

# The transfer route table (ortgpu_core._routes) routes between values, so it sits above this module; the
# package wires its functions here when it is imported (ortgpu_core/__init__.py), and values never import it.
_route_table = {}


def _connect(run_transfer, endpoint):
    """Give values the route table's ``run_transfer`` and ``endpoint`` (the package does this once)."""
    _route_table["run_transfer"] = run_transfer
    _route_table["endpoint"] = endpoint


_generations = itertools.count(1)


class CPU:
    """Placement marker: a value in host memory (``OrtValue[CPU]``)."""


class WebGPU:
    """Placement marker: a value in a WebGPU device buffer (``OrtValue[WebGPU]``)."""


# no_gc_clear: when a buffer is reached only from a garbage reference cycle (a value kept in an exception's
# traceback, an object that refers to itself), the collector must not clear ``device`` before __dealloc__ runs,
# or the native buffer could not be freed.  A DeviceBuffer refers to nothing that refers back to it.
@cython.no_gc_clear
cdef class DeviceBuffer:
    """A native buffer and its lifetime state.  Created by allocators; internal.

    Not copyable: a copy would free the native buffer a second time when it died.
    """

    _copy_hint = "Copy the data instead: value.to_numpy(), or allocator.empty(...) and dst.copy_from(value)."
    __copy__ = NotCopyable.__copy__
    __deepcopy__ = NotCopyable.__deepcopy__
    __reduce_ex__ = NotCopyable.__reduce_ex__

    def __init__(self, *args, **kwargs):
        raise ArgumentTypeError("DeviceBuffer is internal: allocate values with an allocator's empty() or from_numpy()")

    @staticmethod
    def _create(Device device, object handle, Py_ssize_t nbytes, object owner_description):
        cdef DeviceBuffer buffer = DeviceBuffer.__new__(DeviceBuffer)
        buffer.device = device
        buffer.handle = handle
        buffer.nbytes = nbytes
        buffer.generation = next(_generations)
        buffer.owner_description = owner_description
        buffer._pins = []
        buffer._released = False
        buffer._release_reason = ""
        return buffer

    @property
    def released(self):
        """True once the buffer's memory was freed (``release()``, or its allocator closed)."""
        return self._released

    @property
    def pins(self):
        """Labels of the captured graphs that pin this buffer."""
        return tuple(self._pins)

    @property
    def identity(self):
        """The buffer's generation: unique in the process (never reused, unlike a native address)."""
        return self.generation

    def write(self, data):
        """Queue a write of ``data`` (an array, written in C order, or bytes) at the start of the buffer, zero-padded
        to a multiple of 4 bytes; ordered after work submitted before it.  Internal: the one place ortgpu writes a
        buffer from the host."""
        self.check_alive("write the buffer")
        self.device._backend_device.write_buffer(self.handle, 0, padded_payload(data))

    def read_into(self, out):
        """Copy the buffer's first ``len(out)`` bytes into the writable uint8 buffer ``out`` (synchronous: waits
        for submitted work that writes it).  Internal: the one place ortgpu reads a buffer to the host."""
        self.check_alive("read the buffer")
        self.device._backend_device.read_buffer_into(self.handle, 0, out)

    def read(self, shape, dtype):
        """A new host array of ``shape`` and ``dtype`` from the buffer's first bytes (:func:`._layout.read_new_array`:
        from ``MAPPED_READ_MIN`` bytes, no host copy on wgpu)."""
        self.check_alive("read the buffer")
        return read_new_array(self.device._backend_device, self.handle, tuple(shape), dtype)

    cdef int check_alive(self, str what) except -1:
        if self._released:
            raise ReleasedValueError(f"cannot {what}: the buffer was released ({self._release_reason})")
        if self.device._closed:
            raise ReleasedValueError(f"cannot {what}: its device {self.device!r} was closed with its Env")
        return 0

    cdef int pin(self, object label) except -1:
        # Under the GIL the check and the append are one step for every other thread: no Python code runs
        # between them, so a concurrent release() sees either no pin (and frees first: this raises) or the pin.
        self.check_alive("pin the buffer")
        self._pins.append(label)
        return 0

    cdef void unpin(self, object label):
        # Tolerant: unpinning twice (a release racing a finalizer) is not an error.
        try:
            self._pins.remove(label)
        except ValueError:
            pass

    cpdef release(self, str reason="released by its owner"):
        """Free the native buffer now.  Raises ``CaptureStateError`` while pinned; idempotent otherwise."""
        if self._released:
            return
        if self._pins:
            # A graph that nobody can reach any more (its session dropped without close()) still pins until the
            # collector finalizes it: collect once, so whether this succeeds does not depend on GC timing.
            gc.collect()
        if self._pins:
            raise CaptureStateError(
                f"cannot release a buffer bound to captured graph {self._pins[0]}: release the graph first "
                f"(graph.release() or session.release_captured_graph(graph_id))"
            )
        self._released = True
        self._release_reason = reason
        _destroy_native(self.device, self.handle)

    cdef void force_release(self, str reason):
        """Free the buffer whatever pins it (its device is closing: no graph can replay any more)."""
        del self._pins[:]
        self.release(reason)

    def __dealloc__(self):
        # Never raises: a failure to free becomes a ResourceWarning (the device frees everything it still owns when
        # it is destroyed, so nothing is lost for good).
        if self._released or self.device is None:
            return
        self._released = True
        try:
            _destroy_native(self.device, self.handle)
        except BaseException as error:
            _warn_in_finalizer(f"freeing {self!r} when it was collected failed: {error}")

    def __repr__(self):
        state = f" released ({self._release_reason})" if self._released else ""
        return f"<DeviceBuffer {self.nbytes} bytes gen={self.generation} of {self.owner_description}{state}>"


def _warn_in_finalizer(message):
    """A ResourceWarning from a finalizer; silent only at interpreter shutdown, when warnings can no longer be made."""
    try:
        warnings.warn(message, ResourceWarning, stacklevel=2)
    except BaseException:
        pass


cdef void _destroy_native(Device device, object handle) except *:
    """Free a native buffer; nothing to do once its device is closed or lost (the device frees all it had)."""
    backend_device = device._backend_device
    if device._closed or backend_device is None:
        return
    try:
        backend_device.destroy_buffer(handle)
    except (DeviceLostError, ReleasedValueError):
        pass


cdef class Provenance:
    """Where a value lives and who owns it; immutable.

    ``placement`` ("cpu" or "webgpu"), ``vendor_id``, ``device_id``,
    ``device`` (the :class:`Device`, None for CPU values), ``allocator_kind``
    ("shared", "session" or "cpu"), ``session_id`` (the owning session's id,
    or None), ``env_id`` (None for CPU values).
    """

    def __init__(self, *args, **kwargs):
        raise ArgumentTypeError("Provenance is attached by ortgpu to every value it creates; read value.provenance")

    # Immutable: a copy is the object itself.  Not picklable: it names a live Device of this process.
    _copy_hint = "A provenance names a device of this process; compare or describe it instead."
    __reduce_ex__ = NotCopyable.__reduce_ex__

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    @staticmethod
    def _create(str placement, object device, str allocator_kind, object session_id, object env_id):
        cdef Provenance provenance = Provenance.__new__(Provenance)
        provenance.placement = placement
        provenance.device = device
        provenance.vendor_id = (<Device>device).vendor_id if device is not None else 0
        provenance.device_id = (<Device>device).device_id if device is not None else 0
        provenance.allocator_kind = allocator_kind
        provenance.session_id = session_id
        provenance.env_id = env_id
        return provenance

    def __eq__(self, other):
        if not isinstance(other, Provenance):
            return NotImplemented
        cdef Provenance o = <Provenance>other
        return (
            self.placement == o.placement and self.device is o.device and self.allocator_kind == o.allocator_kind
            and self.session_id == o.session_id and self.env_id == o.env_id
        )

    def __hash__(self):
        return hash((self.placement, id(self.device), self.allocator_kind, self.session_id, self.env_id))

    def describe(self):
        """A short phrase for error messages."""
        if self.placement == "cpu":
            return "a CPU value"
        owner = f"session {self.session_id}" if self.session_id is not None else "the Env-shared allocator"
        return (
            f"a {self.allocator_kind} webgpu value of {owner} on device {self.device.index} "
            f"({self.device.name}, vendor_id=0x{self.vendor_id:04x}, device_id=0x{self.device_id:04x}) "
            f"in Env {self.env_id}"
        )

    def __repr__(self):
        if self.placement == "cpu":
            return "Provenance(placement='cpu', allocator_kind='cpu')"
        return (
            f"Provenance(placement='webgpu', vendor_id=0x{self.vendor_id:04x}, device_id=0x{self.device_id:04x}, "
            f"device={self.device.index} {self.device.name!r} ({self.device.backend_type}), "
            f"allocator_kind={self.allocator_kind!r}, session_id={self.session_id!r}, env_id={self.env_id!r})"
        )


cdef Provenance _CPU_PROVENANCE = Provenance._create("cpu", None, "cpu", None, None)


cdef OrtValue make_device_value(DeviceBuffer buffer, tuple shape, object dtype, Provenance provenance):
    cdef OrtValue value = OrtValue.__new__(OrtValue)
    value.provenance = provenance
    value._buffer = buffer
    value._array = None
    value._shape = shape
    value._dtype = dtype
    value._nbytes = dtype.itemsize * _element_count(shape)
    value._released = False
    return value


cdef OrtValue make_cpu_value(object array):
    cdef OrtValue value = OrtValue.__new__(OrtValue)
    value.provenance = _CPU_PROVENANCE
    value._buffer = None
    value._array = array
    value._shape = tuple(array.shape)
    value._dtype = array.dtype
    value._nbytes = array.nbytes
    value._released = False
    return value


def make_cpu_value_from(array):
    """A CPU value holding ``array`` (what unpickling a CPU OrtValue calls)."""
    return make_cpu_value(np.ascontiguousarray(array))


cdef Py_ssize_t _element_count(tuple shape):
    cdef Py_ssize_t count = 1
    for dim in shape:
        count *= dim
    return count


def _unsafe(str what, str instead):
    return UnsafeAccessError(
        f"{what} is not available for device values: ortgpu never exposes device memory "
        f"(a raw pointer would bypass capture safety and provenance). Use {instead} instead."
    )


cdef class OrtValue:
    """A tensor on the CPU or on a WebGPU device, with its :class:`Provenance`.

    CPU values: ``numpy()``, ``data_ptr()``, ``__array__``, ``__dlpack__``.
    Device values: ``update_inplace(array)`` (host to device, dtype and shape
    checked, never cast), ``copy_from(value)``, ``to_numpy()`` (an explicit
    synchronous copy), ``release()``.  Both: ``shape()``, ``dtype``,
    ``element_type()``, ``data_type()``, ``device_name()``, ``provenance``.

    Create CPU values with :meth:`ortvalue_from_numpy`; device values with an
    allocator (``env.shared_allocator(device).empty(...)``,
    ``session.allocator.empty(...)``) or ``ortvalue_from_numpy(array, "webgpu")``.
    """

    def __init__(self, *args, **kwargs):
        raise ArgumentTypeError(
            "OrtValue cannot be constructed directly: use OrtValue.ortvalue_from_numpy(array[, 'webgpu']), "
            "OrtValue.ortvalue_from_shape_and_type(...), or an allocator's empty()/from_numpy()"
        )

    @classmethod
    def __class_getitem__(cls, item):
        return types.GenericAlias(cls, item)

    # -- copying: a CPU value copies its data; a device value refuses (see refuse_copy) -------------
    def __copy__(self):
        return self._host_copy("copy")

    def __deepcopy__(self, memo):
        return self._host_copy("copy")

    def __reduce_ex__(self, protocol):
        return (make_cpu_value_from, (self._host_copy("pickle").numpy(),))

    cdef OrtValue _host_copy(self, str what):
        if self._buffer is not None:
            raise refuse_copy(
                self,
                f"To {what} a device value's data, read it with value.to_numpy() and make a new value from the array "
                f"(allocator.from_numpy(array)), or allocate one and copy device to device with dst.copy_from(value).",
            )
        self._check_usable(f"{what} the value")
        return make_cpu_value(self._array.copy())

    # -- factories (onnxruntime's names) ----------------------------------
    @staticmethod
    def ortvalue_from_numpy(array, device_type="cpu", int device_id=0):
        """A value holding ``array``: on the CPU (a reference to the array, as
        onnxruntime does), or uploaded to ``env.devices[device_id]`` of the
        default Env through its shared allocator (``device_type="webgpu"``)."""
        if not isinstance(array, np.ndarray):
            if not is_dlpack_producer(array):
                raise ArgumentTypeError(
                    f"ortvalue_from_numpy needs a numpy array or a DLPack tensor, got {type(array).__name__}; "
                    f"wrap it with np.asarray(...)"
                )
            array = host_array(array, "ortvalue_from_numpy")
        if device_type == "cpu":
            as_dtype(array.dtype)
            return make_cpu_value(np.ascontiguousarray(array))
        return _default_allocator(device_type, device_id).from_numpy(array)

    @staticmethod
    def ortvalue_from_numpy_with_onnx_type(array, int onnx_element_type):
        """A CPU value holding ``array``'s bytes as ONNX element type ``onnx_element_type`` (onnxruntime's
        spelling; e.g. 1 = float).  The array is viewed as that type's numpy dtype, which must have the array's
        item size (raw uint16 as 16, bfloat16, gives an ml_dtypes bfloat16 array); types ortgpu cannot
        hold (float8, int4, strings) are a ``DtypeError``."""
        if not isinstance(array, np.ndarray):
            raise ArgumentTypeError(
                f"ortvalue_from_numpy_with_onnx_type needs a numpy array, got {type(array).__name__}"
            )
        dtype = dtype_from_onnx(onnx_element_type)
        if dtype.itemsize != array.dtype.itemsize:
            raise DtypeError(
                f"ONNX element type {onnx_element_type} ({dtype}) has {dtype.itemsize}-byte items; the array's "
                f"{array.dtype} has {array.dtype.itemsize}: pass an array of matching item size"
            )
        contiguous = np.ascontiguousarray(array)
        return make_cpu_value(contiguous.view(dtype) if contiguous.dtype != dtype else contiguous)

    @staticmethod
    def from_dlpack(tensor, device_type="cpu", int device_id=0):
        """A value from a DLPack tensor (PyTorch, CuPy, JAX, numpy...) or a numpy array, as
        :meth:`ortvalue_from_numpy` makes one: host tensors are shared without a copy where the layout allows
        (``device_type="cpu"``); tensors in another runtime's device memory are copied to the host by their
        producer (DLPack 1.0 ``dl_device``/``copy``), never read through their pointer; if the producer cannot,
        ``TransferRoutingError`` says how to move them (e.g. ``tensor.cpu()``)."""
        return OrtValue.ortvalue_from_numpy(host_array(tensor, "OrtValue.from_dlpack"), device_type, device_id)

    @staticmethod
    def ortvalue_from_shape_and_type(shape, element_type, device_type="cpu", int device_id=0):
        """A zero-filled value of ``shape`` and ``element_type`` (numpy dtype or name)."""
        dtype = as_dtype(element_type)
        if device_type == "cpu":
            return make_cpu_value(host_zeros(check_shape(shape), dtype))
        return _default_allocator(device_type, device_id).empty(shape, dtype)

    @staticmethod
    def ort_value_from_sparse_tensor(sparse_tensor):
        """A CPU value holding a ``SparseTensor``: ``shape()`` is its dense shape, and every call that needs dense
        data (``numpy()``, copies, a run input) raises ``SparseTensorError``."""
        cdef OrtValue value = make_cpu_value(checked_sparse_tensor(sparse_tensor).values())
        value._array, value._sparse, value._shape = None, sparse_tensor, tuple(sparse_tensor.dense_shape())
        return value

    def as_sparse_tensor(self):
        """The ``SparseTensor`` this value holds (``SparseTensorError`` for a dense value)."""
        if self._released:
            raise ReleasedValueError("cannot read the sparse tensor: this value was released")
        if self._sparse is None:
            raise not_sparse_error(self.data_type())
        return self._sparse

    def is_sparse_tensor(self):
        """True for a value made by :meth:`ort_value_from_sparse_tensor`."""
        return self._sparse is not None

    # -- common ------------------------------------------------------------
    cdef int _check_usable(self, str what) except -1:
        if self._released:
            raise ReleasedValueError(f"cannot {what}: this value ({self.provenance.describe()}) was released")
        if self._buffer is not None:
            self._buffer.check_alive(what)
        if self._sparse is not None:
            raise dense_only_error(self._sparse, what)
        return 0

    def _require_usable(self, what):
        """Raise ``ReleasedValueError`` unless the value (and its buffer and device) can be used.  Internal."""
        self._check_usable(what)

    cdef DeviceBuffer device_buffer(self):
        return self._buffer

    @property
    def _device_buffer(self):
        """The :class:`DeviceBuffer` of a device value (None for CPU values).  Internal: code above the core
        passes it to the executor; users never need it (device memory is not exposed)."""
        return self._buffer

    def shape(self):
        """The shape as a list of ints (onnxruntime's spelling)."""
        return list(self._shape)

    @property
    def dtype(self):
        """The numpy dtype of the elements."""
        return self._dtype

    @property
    def nbytes(self):
        """The size of the value's data in bytes (elements times the dtype's size)."""
        return self._nbytes

    def element_type(self):
        """The ONNX element type number (1 = float, 7 = int64, ...)."""
        return self._sparse.element_type() if self._sparse is not None else _onnx_element_type_of(self._dtype)

    def data_type(self):
        """onnxruntime's type string, e.g. ``'tensor(float)'`` (``'sparse_tensor(float)'`` for a sparse value)."""
        return self._sparse.data_type() if self._sparse is not None else onnx_type_name(self._dtype)

    def device_name(self):
        """``'cpu'`` or ``'webgpu'``."""
        return self.provenance.placement

    def is_tensor(self):
        return self._sparse is None

    def is_tensor_sequence(self):
        """False: an OrtValue holds one tensor (sequences are lists of arrays in ortgpu's API)."""
        return False

    def tensor_size_in_bytes(self):
        """The tensor's data size in bytes (elements x item size; device buffers may be padded beyond it)."""
        cdef Py_ssize_t count = 1
        if self._sparse is not None:
            raise dense_only_error(self._sparse, "take its tensor_size_in_bytes()")
        for dim in self._shape:
            count *= dim
        return count * self._dtype.itemsize

    def has_value(self):
        return not self._released

    @property
    def released(self):
        """True once the value or its device buffer was released: it can no longer be read, written or bound."""
        return self._released or (self._buffer is not None and self._buffer._released)

    # -- CPU-only access ------------------------------------------------------
    def numpy(self):
        """The array of a CPU value (shares its memory).  Device values: use ``to_numpy()``."""
        if self._buffer is not None:
            raise _unsafe("numpy()", "value.to_numpy() (an explicit copy to the host)")
        self._check_usable("read the value")
        return self._array

    @property
    def data_ptr(self):
        """``value.data_ptr()``: the host address of a CPU value's data."""
        if self._buffer is not None:
            raise _unsafe("data_ptr()", "value.to_numpy() to read, value.update_inplace(array) to write")
        self._check_usable("take the value's address")
        array = self._array
        return lambda: int(array.ctypes.data)

    @property
    def __dlpack__(self):
        if self._buffer is not None:
            raise _unsafe("__dlpack__", "value.to_numpy() (an explicit copy to the host)")
        self._check_usable("export the value")
        return self._array.__dlpack__

    @property
    def __dlpack_device__(self):
        if self._buffer is not None:
            raise _unsafe("__dlpack_device__", "value.to_numpy() (an explicit copy to the host)")
        self._check_usable("export the value")
        return self._array.__dlpack_device__

    def __array__(self, dtype=None, copy=None):
        if self._buffer is not None:
            raise _unsafe("np.asarray(value) / __array__", "value.to_numpy() (an explicit copy to the host)")
        self._check_usable("read the value")
        if dtype is not None and np.dtype(dtype) != self._dtype:
            return self._array.astype(dtype)
        if copy:
            return self._array.copy()
        return self._array

    # -- transfers ------------------------------------------------------------
    def update_inplace(self, array):
        """Copy ``array`` into this value (host to device for device values).

        ``array`` must have exactly this value's dtype and shape: ortgpu never
        casts silently.  For device values the write is queued in order: it
        lands after previously submitted work and before later work.
        """
        self._check_usable("update the value")
        if not isinstance(array, np.ndarray):
            if not is_dlpack_producer(array) and not isinstance(array, OrtValue):
                try:
                    _route_table["endpoint"](array)  # a registered foreign kind routes; anything else is refused here
                except ArgumentTypeError:
                    raise ArgumentTypeError(
                        f"update_inplace needs a numpy array (or a DLPack tensor) of dtype {self._dtype} and shape "
                        f"{list(self._shape)}, got {type(array).__name__}"
                    ) from None
            _route_table["run_transfer"](array, self, False, "update_inplace")
            return
        if array.dtype != self._dtype:
            raise DtypeError(
                f"update_inplace got dtype {array.dtype} for {self.provenance.describe()} of dtype {self._dtype}; "
                f"ortgpu never casts silently: pass array.astype({str(self._dtype)!r})"
            )
        if array.shape != self._shape:
            raise ShapeError(
                f"update_inplace got shape {list(array.shape)} for {self.provenance.describe()} of shape "
                f"{list(self._shape)}; pass an array of that shape"
            )
        if self._buffer is None:
            np.copyto(self._array, array)
            return
        if self._nbytes == 0:
            return
        self._buffer.write(array)

    def to_numpy(self, out=None):
        """The value's data on the host (synchronous: waits for submitted work that writes it).

        Without ``out``, from 8 MiB the array is the staging memory the device copied into (no host copy), yours
        until it and its views are collected: no later run or read changes it.

        ``out``: a writable, C-contiguous numpy array of exactly this value's dtype and shape to copy into (and
        return) instead of a new array: a loop reading the same output every step then allocates nothing and
        touches no fresh pages.  A wrong ``out`` is refused before anything is read.
        """
        self._check_usable("read the value")
        if out is None:
            if self._buffer is None:
                return self._array.copy()
            return self._buffer.read(self._shape, self._dtype)
        check_out_array(out, self._shape, self._dtype, self.provenance.describe())
        if self._buffer is None:
            np.copyto(out, self._array)
        elif out.nbytes:
            self._buffer.read_into(out.reshape(-1).view(np.uint8))
        return out

    def copy_from(self, source, allow_cross_device=False):
        """Copy ``source`` (same dtype and shape) into this value, routed by the route table of
        :mod:`ortgpu_core._routes` (kind, device identity, Env).  ``source`` may be an OrtValue, a numpy array, a
        DLPack tensor or a tensor of a registered foreign kind.  A copy from another WebGPU device (or another
        Env) is staged through the host, only when asked: ``allow_cross_device=True``; otherwise it raises
        ``TransferRoutingError``."""
        _route_table["run_transfer"](source, self, bool(allow_cross_device), "copy_from")

    def release(self):
        """Free a device value's buffer now (CPU values drop their array).

        Raises ``CaptureStateError`` while the value is bound to a captured
        graph.  Idempotent.
        """
        if self._released:
            return
        if self._buffer is not None:
            self._buffer.release("value.release() was called")
        self._array = None
        self._released = True

    def __repr__(self):
        state = " released" if self.released else ""
        held = f"shape={list(self._shape)} dtype={self._dtype}"
        held = f"holding {self._sparse!r}" if self._sparse is not None else held
        return f"<OrtValue {held} {self.provenance!r}{state}>"


def _default_allocator(device_type, int device_id):
    if device_type != "webgpu":
        raise ValueError(f"device_type must be 'cpu' or 'webgpu', got {device_type!r}")
    from ._env import get_env
    env = get_env()
    devices = env.devices
    if not 0 <= device_id < len(devices):
        raise ValueError(f"device_id {device_id} is out of range: the default Env has {len(devices)} device(s)")
    return env.shared_allocator(devices[device_id])
