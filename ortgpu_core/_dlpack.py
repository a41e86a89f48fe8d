"""Host data from DLPack producers: the one function every API that takes host data calls.

:func:`host_array` turns a numpy array or any object with ``__dlpack__`` / ``__dlpack_device__`` (a PyTorch,
CuPy or JAX array, ...) into a numpy array, with no dependency on those frameworks:

* numpy arrays are returned as they are;
* producers in host memory (``kDLCPU``) are imported with :func:`numpy.from_dlpack`, which shares their memory
  (no copy where the layout allows);
* producers in device memory (CUDA, ROCm, Metal, Vulkan, oneAPI, WebGPU, ...) are asked for a *host copy*
  through DLPack 1.0's ``dl_device`` / ``copy`` arguments, the way ``numpy.from_dlpack(x, device="cpu")`` asks.
  Their device pointer is never read: if the producer cannot make a host copy, :class:`TransferRoutingError`
  says how to move the tensor to the host first (``tensor.cpu()``, ...).

The capsule's header (device, dtype, shape: host metadata, never the data) is read before numpy imports it, so a
producer that ignores the request and exports device memory anyway is refused, and dtypes ortgpu cannot hold
(bfloat16, float8, complex, ...) are refused by name.
"""

from __future__ import annotations

import ctypes
from typing import Any, Protocol

import numpy as np

from ._dtypes import as_dtype
from ._errors import ArgumentTypeError, DtypeError, TransferRoutingError

__all__ = [
    "SupportsDLPack",
    "DLPACK_DEVICE_KINDS",
    "KDL_CPU",
    "dlpack_device",
    "dlpack_kind",
    "is_dlpack_producer",
    "host_array",
]


class SupportsDLPack(Protocol):
    """A DLPack producer: numpy, PyTorch, CuPy and JAX arrays, ... (what :func:`host_array` takes)."""

    def __dlpack__(self, /, *, stream: Any = None) -> Any: ...

    def __dlpack_device__(self, /) -> tuple[int, int]: ...


#: DLPack's ``DLDeviceType`` numbers and the kind names ortgpu's route table uses for them.
KDL_CPU = 1
DLPACK_DEVICE_KINDS: dict[int, str] = {
    1: "dlpack:cpu",
    2: "dlpack:cuda",
    3: "dlpack:cuda-host",
    4: "dlpack:opencl",
    7: "dlpack:vulkan",
    8: "dlpack:metal",
    9: "dlpack:vpi",
    10: "dlpack:rocm",
    11: "dlpack:rocm-host",
    12: "dlpack:ext-dev",
    13: "dlpack:cuda-managed",
    14: "dlpack:oneapi",
    15: "dlpack:webgpu",
    16: "dlpack:hexagon",
    17: "dlpack:maia",
}

# How to bring a tensor of each framework to the host, for the error when a producer cannot copy itself there.
_MOVE_HINT = (
    "move it to the host first and pass that: tensor.cpu() (PyTorch), cupy.asnumpy(x) (CuPy), "
    "np.asarray(jax.device_get(x)) (JAX), or the producer's own host copy"
)

# DLDataType codes (dlpack.h) and what ortgpu says about each.
_DTYPE_CODES = {0: "int", 1: "uint", 2: "float", 3: "opaque handle", 4: "bfloat", 5: "complex", 6: "bool"}
_FLOAT8_CODES = {
    7: "float8_e3m4",
    8: "float8_e4m3",
    9: "float8_e4m3b11fnuz",
    10: "float8_e4m3fn",
    11: "float8_e4m3fnuz",
    12: "float8_e5m2",
    13: "float8_e5m2fnuz",
    14: "float8_e8m0fnu",
    15: "float6_e2m3fn",
    16: "float6_e3m2fn",
    17: "float4_e2m1fn",
}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", _DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


_capsule_get_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_get_name.restype = ctypes.c_char_p
_capsule_get_name.argtypes = [ctypes.py_object]
_capsule_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get_pointer.restype = ctypes.c_void_p
_capsule_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.restype = ctypes.c_int
_capsule_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def is_dlpack_producer(obj: object) -> bool:
    """Whether ``obj`` speaks DLPack (has ``__dlpack__`` and ``__dlpack_device__``)."""
    return hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__")


def dlpack_device(obj: Any) -> tuple[int, int]:
    """``obj.__dlpack_device__()`` as ``(device_type, device_id)``, checked."""
    try:
        device = obj.__dlpack_device__()
        device_type, device_id = (int(part) for part in device)
    except Exception as error:
        raise ArgumentTypeError(
            f"{type(obj).__name__}.__dlpack_device__() did not return (device_type, device_id): {error}"
        ) from error
    return device_type, device_id


def dlpack_kind(device_type: int) -> str:
    """The route-table kind of a DLPack device type (``"dlpack:cuda"``...; unknown types ``"dlpack:type<N>"``)."""
    return DLPACK_DEVICE_KINDS.get(device_type, f"dlpack:type{device_type}")


class _Header:
    """What a capsule's DLTensor says about itself (host metadata only; its data pointer is never read)."""

    __slots__ = ("device_type", "device_id", "code", "bits", "lanes", "shape")

    def __init__(self, tensor: _DLTensor) -> None:
        self.device_type = int(tensor.device.device_type)
        self.device_id = int(tensor.device.device_id)
        self.code = int(tensor.dtype.code)
        self.bits = int(tensor.dtype.bits)
        self.lanes = int(tensor.dtype.lanes)
        self.shape = tuple(int(tensor.shape[i]) for i in range(int(tensor.ndim)))

    def dtype_name(self) -> str:
        if self.code in _FLOAT8_CODES:
            return _FLOAT8_CODES[self.code]
        base = _DTYPE_CODES.get(self.code, f"dtype code {self.code}")
        name = "bool" if self.code == 6 else f"{base}{self.bits}"
        return name if self.lanes == 1 else f"{name}x{self.lanes}"


def _read_header(capsule: object, what: str) -> _Header:
    """The DLTensor header of an unconsumed DLPack capsule."""
    for name, struct in ((b"dltensor_versioned", _DLManagedTensorVersioned), (b"dltensor", _DLManagedTensor)):
        if _capsule_is_valid(capsule, name):
            pointer = _capsule_get_pointer(capsule, name)
            managed = ctypes.cast(pointer, ctypes.POINTER(struct)).contents
            return _Header(managed.dl_tensor)
    raise ArgumentTypeError(f"{what}: __dlpack__() returned {type(capsule).__name__}, not an unconsumed DLPack capsule")


def _check_header(header: _Header, what: str, producer: str) -> None:
    if header.device_type != KDL_CPU:
        raise TransferRoutingError(
            f"{what}: the {producer} exported memory on {dlpack_kind(header.device_type)} device "
            f"{header.device_id} although host memory was requested; ortgpu never reads device memory of "
            f"another runtime: {_MOVE_HINT}"
        )
    name = header.dtype_name()
    if header.lanes != 1 or header.code not in (0, 1, 2, 6) or (header.code == 2 and header.bits not in (16, 32, 64)):
        raise DtypeError(
            f"{what}: the {producer} holds {name}, which ortgpu cannot hold (it has no bfloat16, float8, complex "
            f"or vector types); cast it in the producer first, e.g. tensor.float() (PyTorch) or x.astype('float32')"
        )


class _CapsuleHolder:
    """Hands one capsule to :func:`numpy.from_dlpack` (whatever arguments numpy's request carries)."""

    def __init__(self, capsule: object) -> None:
        self._capsule = capsule

    def __dlpack__(self, *, stream: Any = None, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDL_CPU, 0)


def _host_capsule(obj: Any, device: tuple[int, int], what: str, producer: str) -> object:
    """A capsule of ``obj`` in host memory: its own for kDLCPU producers, a host copy requested otherwise."""
    if device[0] == KDL_CPU:
        try:
            return obj.__dlpack__(max_version=(1, 0))
        except TypeError:  # a pre-1.0 producer: no keyword arguments
            return obj.__dlpack__()
    try:
        return obj.__dlpack__(max_version=(1, 0), dl_device=(KDL_CPU, 0), copy=True)
    except (TypeError, BufferError, NotImplementedError, ValueError, RuntimeError) as error:
        raise TransferRoutingError(
            f"{what}: the {producer} lives on {dlpack_kind(device[0])} device {device[1]} and cannot give a host "
            f"copy through DLPack 1.0 (__dlpack__(dl_device=(1, 0), copy=True) failed: {error}); ortgpu never "
            f"reads device memory of another runtime: {_MOVE_HINT}"
        ) from error


def host_array(obj: object, what: str) -> np.ndarray[Any, Any]:
    """``obj`` (a numpy array or a DLPack producer) as a numpy array in host memory.

    Parameters
    ----------
    obj
        A numpy array (returned as is), or an object with ``__dlpack__`` and ``__dlpack_device__``.
    what
        The operation, for error messages (``"update_inplace"``, ``"run feed 'X'"``...).

    Returns
    -------
    numpy.ndarray
        For host producers, an array sharing their memory where the layout allows; for device producers, the
        host copy the producer made.  Its dtype is one ortgpu holds (the caller checks it against the target).

    Raises
    ------
    ArgumentTypeError
        ``obj`` is neither a numpy array nor a DLPack producer.
    TransferRoutingError
        A device producer cannot give a host copy (the message says how to move it).
    DtypeError
        The tensor's dtype is one ortgpu cannot hold (bfloat16, float8, complex...), named.
    """
    if isinstance(obj, np.ndarray):
        as_dtype(obj.dtype)
        return obj
    if not is_dlpack_producer(obj):
        raise ArgumentTypeError(
            f"{what} needs a numpy array or a DLPack tensor (an object with __dlpack__ and __dlpack_device__), "
            f"got {type(obj).__name__}; wrap it with np.asarray(...)"
        )
    device = dlpack_device(obj)
    producer = f"{type(obj).__name__} tensor"
    capsule = _host_capsule(obj, device, what, producer)
    header = _read_header(capsule, what)
    _check_header(header, what, producer)
    try:
        array: np.ndarray[Any, Any] = np.from_dlpack(_CapsuleHolder(capsule))
    except (BufferError, TypeError, ValueError, RuntimeError) as error:
        raise DtypeError(f"{what}: numpy could not import the {producer} ({header.dtype_name()}): {error}") from error
    as_dtype(array.dtype)
    return array
