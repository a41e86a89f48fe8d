"""A fake "other GPU": tensors of another runtime, for testing transfer routing (as onnxruntime's tests fake a
plugin execution provider).

A :class:`FakeForeignDevice` holds :class:`FakeForeignTensor` objects in its own (numpy) memory, reports its own
vendor and device ids, and logs every transfer its runtime performs (``device.log``).  Its kind,
:data:`FAKE_OTHER_GPU_KIND`, is offered by the fake backend (``FakeBackend.foreign_kinds()``) and registered in the
core's route table when a fake Env is created (or with ``ortgpu_core.register_foreign_kind``).  The tensors speak
no DLPack and have no buffer handle: the only ways in or out are the kind's own ``read``/``write``/``copy``.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Final

import numpy as np

from .._errors import ArgumentTypeError, DtypeError, ShapeError
from .protocol import ForeignKind, ForeignTensorInfo

__all__ = ["FAKE_OTHER_VENDOR_ID", "FAKE_OTHER_GPU_KIND", "FakeForeignDevice", "FakeForeignTensor"]

#: Vendor id of the default fake other GPU (no real vendor uses it).
FAKE_OTHER_VENDOR_ID: Final = 0x0F0E

_tensor_ids = itertools.count(1)


class FakeForeignDevice:
    """One device of the fake other runtime; ``log`` lists ``(operation, tensor id)`` of every transfer it ran."""

    def __init__(self, name: str = "Fake other GPU", vendor_id: int = FAKE_OTHER_VENDOR_ID, device_id: int = 1):
        self.name = name
        self.vendor_id = vendor_id
        self.device_id = device_id
        self.log: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def tensor(self, array: np.ndarray[Any, Any]) -> FakeForeignTensor:
        """A tensor on this device holding a copy of ``array``."""
        return FakeForeignTensor(self, np.array(array, copy=True))

    def empty(self, shape: tuple[int, ...], dtype: Any) -> FakeForeignTensor:
        """A zero-filled tensor on this device."""
        return FakeForeignTensor(self, np.zeros(shape, dtype))

    def _record(self, operation: str, tensor: FakeForeignTensor) -> None:
        with self._lock:
            self.log.append((operation, tensor.id))

    def __repr__(self) -> str:
        return f"<FakeForeignDevice {self.name!r} vendor_id=0x{self.vendor_id:04x} device_id=0x{self.device_id:04x}>"


class FakeForeignTensor:
    """A tensor in the fake other GPU's memory.  No ``__dlpack__``, no ``__array__``: its runtime moves it."""

    def __init__(self, device: FakeForeignDevice, memory: np.ndarray[Any, Any]) -> None:
        self.device = device
        self.id = next(_tensor_ids)
        self._memory = memory

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._memory.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        dtype: np.dtype[Any] = self._memory.dtype
        return dtype

    def numpy(self) -> np.ndarray[Any, Any]:
        """A copy of the tensor's data without a logged transfer (what tests compare with)."""
        return self._memory.copy()

    def __repr__(self) -> str:
        return f"<FakeForeignTensor {self.id} shape={list(self.shape)} dtype={self.dtype} on {self.device!r}>"


def _check(tensor: object) -> FakeForeignTensor:
    if not isinstance(tensor, FakeForeignTensor):
        raise ArgumentTypeError(f"expected a FakeForeignTensor, got {type(tensor).__name__}")
    return tensor


def _info(tensor: Any) -> ForeignTensorInfo:
    t = _check(tensor)
    return ForeignTensorInfo(
        vendor_id=t.device.vendor_id,
        device_id=t.device.device_id,
        device=t.device,
        owner=f"fake foreign tensor {t.id} on {t.device!r}",
        shape=t.shape,
        dtype=t.dtype,
    )


def _read(tensor: Any) -> np.ndarray[Any, Any]:
    t = _check(tensor)
    t.device._record("read", t)
    return t._memory.copy()


def _write(tensor: Any, array: np.ndarray[Any, Any]) -> None:
    t = _check(tensor)
    if array.dtype != t.dtype:
        raise DtypeError(f"cannot write dtype {array.dtype} into {t!r}")
    if array.shape != t.shape:
        raise ShapeError(f"cannot write shape {list(array.shape)} into {t!r}")
    t.device._record("write", t)
    np.copyto(t._memory, array)


def _copy(source: Any, destination: Any) -> None:
    src, dst = _check(source), _check(destination)
    if src.device is not dst.device:  # the route table never asks this; the runtime checks anyway
        raise ArgumentTypeError(f"{src!r} and {dst!r} are on different fake devices")
    dst.device._record("copy", dst)
    np.copyto(dst._memory, src._memory)


#: The fake other GPU's kind and its runtime's transfers.
FAKE_OTHER_GPU_KIND: Final = ForeignKind(
    kind="fake-other-gpu",
    owns=lambda obj: isinstance(obj, FakeForeignTensor),
    info=_info,
    read=_read,
    write=_write,
    copy=_copy,
)
