"""A fake DLPack producer (a "CUDA tensor" of a runtime that is not installed), for tests of foreign input.

:class:`FakeDLPackTensor` answers ``__dlpack_device__`` with the device type it was given (CUDA by default) and
answers ``__dlpack__`` only as a real producer of that kind would:

* asked for host memory (``dl_device=(1, 0)``, DLPack 1.0) it exports a host copy of its data, if
  ``host_copy`` (else ``BufferError``, as a producer that cannot copy itself to the host);
* asked for its own memory (no ``dl_device``) it refuses with ``BufferError`` and counts the request in
  ``device_exports``: a consumer that asks has tried to read its device pointer;
* ``legacy=True`` makes it a pre-1.0 producer whose ``__dlpack__`` takes only ``stream``;
* ``lie=True`` makes it ignore the request and export a capsule that says its memory is on the device;
* ``dtype_code``/``bits`` make it export a header of another DLPack dtype (4/16: bfloat16).

Every call is logged in ``requests``.  The capsules it makes itself carry no data ortgpu may read (their data
pointer is null): only their header is meant to be looked at.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from .._dlpack import _DLManagedTensor

__all__ = ["KDL_CPU", "KDL_CUDA", "FakeDLPackTensor"]

KDL_CPU = 1
KDL_CUDA = 2

_CAPSULE_NAME = b"dltensor"  # must outlive every capsule made here: a module constant

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


# The DLPack structures, as the consumer side reads them (one definition).


class FakeDLPackTensor:
    """A DLPack producer on ``device_type`` (CUDA by default) holding ``array``; see the module docstring."""

    def __init__(
        self,
        array: np.ndarray[Any, Any],
        *,
        device_type: int = KDL_CUDA,
        device_id: int = 0,
        vendor_id: int = 0x10DE,
        host_copy: bool = True,
        legacy: bool = False,
        lie: bool = False,
        dtype_code: int | None = None,
        bits: int | None = None,
    ) -> None:
        self._data = np.array(array, copy=True)
        self.device_type = device_type
        self.device_id = device_id
        self.vendor_id = vendor_id  # what the producer's runtime would report; DLPack itself carries no vendor
        self.host_copy = host_copy
        self.legacy = legacy
        self.lie = lie
        self.dtype_code = dtype_code
        self.bits = bits
        self.requests: list[dict[str, Any]] = []
        self.device_exports = 0
        self._keep: list[Any] = []  # ctypes memory behind the capsules made here

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._data.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._data.dtype

    def numpy(self) -> np.ndarray[Any, Any]:
        """A copy of the data (what the test compares with)."""
        return self._data.copy()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self.device_type, self.device_id)

    def __dlpack__(self, *args: Any, **kwargs: Any) -> object:
        self.requests.append(dict(kwargs))
        if self.legacy and set(kwargs) - {"stream"}:
            raise TypeError("__dlpack__() got an unexpected keyword argument (a pre-1.0 producer)")
        dl_device = kwargs.get("dl_device")
        wants_host = dl_device is not None and tuple(dl_device)[0] == KDL_CPU
        if self.device_type == KDL_CPU:
            return self._export(KDL_CPU, kwargs.get("max_version"))
        if self.lie:
            return self._header_capsule(self.device_type)
        if not wants_host:
            self.device_exports += 1
            raise BufferError("FakeDLPackTensor: device memory cannot be exported to this consumer")
        if not self.host_copy:
            raise BufferError("FakeDLPackTensor: this producer cannot copy itself to the host")
        if kwargs.get("copy") is False:
            raise BufferError("FakeDLPackTensor: a host export needs a copy, and copy=False forbids one")
        return self._export(KDL_CPU, kwargs.get("max_version"))

    def _export(self, device_type: int, max_version: Any) -> object:
        if self.dtype_code is not None:
            return self._header_capsule(device_type)
        host = self._data.copy()
        return host.__dlpack__(max_version=max_version) if max_version is not None else host.__dlpack__()

    def _header_capsule(self, device_type: int) -> object:
        """A capsule whose header says ``device_type`` and (if set) the dtype code; its data pointer is null."""
        shape = (ctypes.c_int64 * max(self._data.ndim, 1))(*self._data.shape)
        managed = _DLManagedTensor()
        managed.dl_tensor.data = None
        managed.dl_tensor.device.device_type = device_type
        managed.dl_tensor.device.device_id = self.device_id
        managed.dl_tensor.ndim = self._data.ndim
        managed.dl_tensor.dtype.code = self.dtype_code if self.dtype_code is not None else 2
        managed.dl_tensor.dtype.bits = self.bits if self.bits is not None else self._data.dtype.itemsize * 8
        managed.dl_tensor.dtype.lanes = 1
        managed.dl_tensor.shape = shape
        managed.dl_tensor.strides = None
        managed.dl_tensor.byte_offset = 0
        managed.manager_ctx = None
        managed.deleter = None
        self._keep.append((managed, shape))
        return _capsule_new(ctypes.addressof(managed), _CAPSULE_NAME, None)

    def __repr__(self) -> str:
        return f"<FakeDLPackTensor device=({self.device_type}, {self.device_id}) shape={list(self.shape)}>"
