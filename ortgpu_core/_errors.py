"""The error tree shared by the core, the backends and the public package.

Every error ortgpu raises derives from :class:`OrtGpuError`.  Where Python users
expect a builtin category (a bad dtype is a ``TypeError``, a bad shape a
``ValueError``, out of memory a ``MemoryError``) the ortgpu error derives from
that builtin too, so ``except ValueError`` keeps working.

Messages say what was wrong (naming the value by its provenance, or the session
by its id) and what to do instead.
"""

from __future__ import annotations

from typing import NoReturn, SupportsIndex

__all__ = [
    "OrtGpuError",
    "ProvenanceError",
    "CaptureStateError",
    "TransferRoutingError",
    "UnsafeAccessError",
    "ReleasedValueError",
    "DeviceError",
    "OutOfMemoryError",
    "ValidationError",
    "DeviceLostError",
    "ModelError",
    "UnsupportedOpError",
    "InvalidModelError",
    "InvalidArgumentError",
    "ArgumentTypeError",
    "ShapeError",
    "DtypeError",
    "Fail",
    "SparseTensorError",
]


class OrtGpuError(Exception):
    """Base of every error raised by ortgpu."""


class InvalidArgumentError(OrtGpuError, ValueError):
    """An argument has the right type but an unusable value."""


class ArgumentTypeError(OrtGpuError, TypeError):
    """An argument has the wrong type (a numpy array where an ``OrtValue`` is needed, a float graph id, an object
    constructed directly that ortgpu's factories make)."""


class ShapeError(InvalidArgumentError):
    """A shape is negative, too large for the device, or does not match."""


class DtypeError(InvalidArgumentError, TypeError):
    """A dtype is unsupported, or differs from the one required (never cast silently).  An invalid argument too, as
    onnxruntime reports a wrong input dtype (``except InvalidArgument`` catches it there and here)."""


class ProvenanceError(OrtGpuError, ValueError):
    """A value was used by a session, Env or device it does not belong to."""


class CaptureStateError(OrtGpuError, RuntimeError):
    """An operation is not allowed in the current capture state (e.g. rebinding a captured binding)."""


class TransferRoutingError(OrtGpuError, ValueError):
    """No transfer route exists between the two values' placements or devices."""


class UnsafeAccessError(OrtGpuError, TypeError):
    """Raw access to device memory (pointer, DLPack, ``__array__``) was requested."""


class ReleasedValueError(OrtGpuError, RuntimeError):
    """A value, allocator, session or graph was used after it was released or closed."""


class DeviceError(OrtGpuError, RuntimeError):
    """The device reported an error."""


class OutOfMemoryError(DeviceError, MemoryError):
    """The device could not allocate the requested memory."""


class ValidationError(DeviceError):
    """The device rejected a command as invalid (a bug in ortgpu or a device limit)."""


class DeviceLostError(DeviceError):
    """The device was lost; every value on it is gone and the Env must be recreated."""


class ModelError(OrtGpuError, ValueError):
    """The model cannot be loaded or run."""


class Fail(OrtGpuError, RuntimeError):
    """onnxruntime's generic failure (``onnxruntime.capi.onnxruntime_pybind11_state.Fail``): raised where
    onnxruntime raises it for a session option it cannot honour (an unknown config entry...), and the base of
    :class:`UnsupportedOpError`, as onnxruntime fails a model whose operator it has no kernel for."""


class SparseTensorError(InvalidArgumentError, RuntimeError):
    """A sparse tensor was used where a dense one is needed (an OrtValue holding one read as an array, copied to a
    device or passed as a run input), asked for a format or device it does not have (ortgpu keeps sparse tensors
    on the CPU and has no CUDA), or a dense value was asked for its sparse tensor.  onnxruntime raises
    ``RuntimeError`` for these and ``InvalidArgument`` for a sparse run input: both ``except`` clauses catch it."""


class UnsupportedOpError(ModelError, Fail):
    """The model uses an operator, attribute or dtype ortgpu does not implement."""


class InvalidModelError(ModelError):
    """The model file is malformed or fails ONNX's checker."""


def refuse_copy(obj: object, instead: str) -> UnsafeAccessError:
    """The error for ``copy.copy``, ``copy.deepcopy`` or ``pickle`` of an object that owns or locks native
    resources: a copy would share them (one copy's release would free or unlock what the other still uses)."""
    return UnsafeAccessError(
        f"{type(obj).__name__} objects cannot be copied or pickled: a copy would share the native resources, "
        f"pins and locks of the original, and releasing one would free them under the other. {instead}"
    )


class NotCopyable:
    """Mixin for Python classes that own native resources: ``copy``, ``deepcopy`` and ``pickle`` raise
    :class:`UnsafeAccessError` (see :func:`refuse_copy`)."""

    __slots__ = ()
    _copy_hint = "Create a new object instead."

    def __copy__(self) -> NoReturn:
        raise refuse_copy(self, self._copy_hint)

    def __deepcopy__(self, memo: object) -> NoReturn:
        raise refuse_copy(self, self._copy_hint)

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        raise refuse_copy(self, self._copy_hint)
