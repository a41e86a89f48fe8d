"""Sparse tensors on the host: onnxruntime's ``SparseTensor`` (COO and CSR(C) formats) and ``OrtSparseFormat``.

A :class:`SparseTensor` is immutable.  Its factories validate their arguments and keep read-only copies of them:
a tensor whose indices were checked against its dense shape stays valid, however the caller's arrays change
afterwards (onnxruntime maps numeric arrays instead, so a later write to them shows through; nothing here relies
on that).  ``values()`` and the views' index arrays are new read-only numpy views of those copies: each keeps its
data alive on its own, after the tensor itself is collected.

It lives in the core, beside :class:`~ortgpu_core.OrtValue`, because an OrtValue can hold one
(``OrtValue.ort_value_from_sparse_tensor``) and the core never imports :mod:`ortgpu`.  Sparse tensors stay on the
CPU: ortgpu's kernels and runs take dense tensors, and it has no CUDA (``to_cuda`` refuses, as onnxruntime does in
a build without CUDA).

Validation follows onnxruntime's refusals (values 1-D, index counts that agree with the values, a CSR outer index
of rows + 1 entries on a 2-D dense shape) and adds what onnxruntime leaves unchecked but a consumer would read out
of bounds: every index within the dense shape, a non-negative dense shape, integer indices (onnxruntime casts
float indices silently), and a CSR outer index that starts at 0, never decreases and ends at the value count.
Integer indices of any width are widened to int64 without loss, as onnxruntime accepts them.
"""

from __future__ import annotations

import enum
from typing import Any, Protocol, final

import numpy as np
import numpy.typing as npt

from ._dtypes import ONNX_DTYPES, onnx_element_type, onnx_type_name
from ._errors import ArgumentTypeError, DtypeError, ShapeError, SparseTensorError

__all__ = [
    "OrtSparseFormat",
    "SparseTensor",
    "SparseCooView",
    "SparseCsrView",
    "SupportsDeviceType",
    "checked_sparse_tensor",
    "dense_only_error",
    "not_sparse_error",
]

_ONNX_STRING = 8  # TensorProto.STRING
_INT64_MAX = np.iinfo(np.int64).max


class OrtSparseFormat(enum.IntEnum):
    """onnxruntime's sparse formats, with its numbers (a bit mask in its C API, hence 4 for block sparse)."""

    ORT_SPARSE_UNDEFINED = 0
    ORT_SPARSE_COO = 1
    ORT_SPARSE_CSRC = 2
    ORT_SPARSE_BLOCK_SPARSE = 4


class SupportsDeviceType(Protocol):
    """What the factories read from their ``ort_device`` (``ortgpu.OrtDevice``; the core does not import it)."""

    def device_type(self) -> int: ...


def _read_only(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    array.setflags(write=False)
    return array


class _Frozen:
    """No attribute can be set or deleted after creation (the factories set them through ``object.__setattr__``):
    what the factories checked stays true."""

    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: make a new one with the factories")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")


@final
class SparseCooView(_Frozen):
    """The COO indices of a sparse tensor: ``indices()`` is ``(nnz,)`` linear indices or ``(nnz, 2)`` coordinates."""

    __slots__ = ("_indices",)
    _indices: npt.NDArray[np.int64]

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise ArgumentTypeError("SparseCooView cannot be constructed directly: use sparse_tensor.as_coo_view()")

    def indices(self) -> npt.NDArray[np.int64]:
        """A read-only int64 view of the indices (it keeps them alive on its own)."""
        result: npt.NDArray[np.int64] = self._indices.view()
        return result


@final
class SparseCsrView(_Frozen):
    """The CSR(C) indices of a 2-D sparse tensor: ``inner()`` (the column of each value), ``outer()`` (where each
    row's values start, rows + 1 entries)."""

    __slots__ = ("_inner", "_outer")
    _inner: npt.NDArray[np.int64]
    _outer: npt.NDArray[np.int64]

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise ArgumentTypeError("SparseCsrView cannot be constructed directly: use sparse_tensor.as_csrc_view()")

    def inner(self) -> npt.NDArray[np.int64]:
        """A read-only int64 view of the inner (column) indices."""
        result: npt.NDArray[np.int64] = self._inner.view()
        return result

    def outer(self) -> npt.NDArray[np.int64]:
        """A read-only int64 view of the outer (row start) indices."""
        result: npt.NDArray[np.int64] = self._outer.view()
        return result


@final
class SparseTensor(_Frozen):
    """A sparse tensor on the CPU, in COO or CSR(C) format (onnxruntime's ``SparseTensor``).

    Made by :meth:`sparse_coo_from_numpy` or :meth:`sparse_csr_from_numpy`; immutable (a copy is the tensor
    itself; pickling re-validates through the factory).  Strings are held as an object array of ``str``, as
    onnxruntime returns them.
    """

    __slots__ = ("_format", "_dense_shape", "_values", "_indices")
    _format: OrtSparseFormat
    _dense_shape: tuple[int, ...]
    _values: npt.NDArray[Any]
    _indices: tuple[npt.NDArray[np.int64], ...]

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise ArgumentTypeError(
            "SparseTensor cannot be constructed directly: use SparseTensor.sparse_coo_from_numpy(...) or "
            "SparseTensor.sparse_csr_from_numpy(...)"
        )

    # -- factories (onnxruntime's names and arguments) ---------------------------------------------------------
    @classmethod
    def sparse_coo_from_numpy(
        cls,
        dense_shape: npt.ArrayLike,
        values: npt.NDArray[Any],
        coo_indices: npt.ArrayLike,
        ort_device: SupportsDeviceType,
    ) -> SparseTensor:
        """A COO sparse tensor.

        Parameters
        ----------
        dense_shape : the dense tensor's shape (a list or 1-D integer array of non-negative dims).
        values : a 1-D numpy array of the non-zero values (numeric, bool, or strings).
        coo_indices : integer indices, ``(nnz,)`` linear indices into the dense shape (row-major), or, for a 2-D
            dense shape, ``(nnz, 2)`` (row, column) pairs.  Unsorted and repeated indices are kept as given.
        ort_device : ``OrtDevice.make("cpu", 0)``: sparse tensors live on the CPU.

        Raises
        ------
        ShapeError : a negative dense dim, values not 1-D, an index count or layout that does not match the
            values, an index outside the dense shape.
        DtypeError : non-integer indices; values of a type ortgpu cannot hold (complex, objects other than str).
        ArgumentTypeError : values not a numpy array, a dense shape or indices that are not integers.
        SparseTensorError : a device other than the CPU.
        """
        shape = _dense_shape(dense_shape)
        _check_cpu(ort_device)
        held = _values(values)
        nnz = held.shape[0]
        indices = _index_array(coo_indices, "coo_indices")
        if indices.ndim == 1:
            if indices.shape[0] != nnz:
                raise ShapeError(
                    f"sparse_coo_from_numpy: {indices.shape[0]} linear indices for {nnz} values; give one index per "
                    f"value (or an (nnz, 2) array of (row, column) pairs)"
                )
            _check_range(indices, int(np.prod(shape, dtype=object)), f"linear index into dense shape {list(shape)}")
        elif indices.ndim == 2:
            if len(shape) != 2:
                raise ShapeError(
                    f"sparse_coo_from_numpy: 2-D coo_indices are (row, column) pairs of a 2-D dense shape, but the "
                    f"dense shape is {list(shape)}; give (nnz,) linear indices for it instead"
                )
            if indices.shape != (nnz, 2):
                raise ShapeError(
                    f"sparse_coo_from_numpy: 2-D coo_indices must have shape ({nnz}, 2) for {nnz} values, got "
                    f"{list(indices.shape)}"
                )
            _check_range(indices[:, 0], shape[0], f"row index of dense shape {list(shape)}")
            _check_range(indices[:, 1], shape[1], f"column index of dense shape {list(shape)}")
        else:
            raise ShapeError(
                f"sparse_coo_from_numpy: coo_indices must be 1-D (linear) or 2-D ((row, column) pairs), got shape "
                f"{list(indices.shape)}"
            )
        return cls._make(OrtSparseFormat.ORT_SPARSE_COO, shape, held, (indices,))

    @classmethod
    def sparse_csr_from_numpy(
        cls,
        dense_shape: npt.ArrayLike,
        values: npt.NDArray[Any],
        inner_indices: npt.ArrayLike,
        outer_indices: npt.ArrayLike,
        ort_device: SupportsDeviceType,
    ) -> SparseTensor:
        """A CSR(C) sparse tensor of a 2-D dense shape.

        Parameters
        ----------
        dense_shape : ``[rows, cols]``.
        values : a 1-D numpy array of the non-zero values, row by row.
        inner_indices : 1-D integers, the column of each value (``nnz`` of them, each below ``cols``).
        outer_indices : 1-D integers, ``rows + 1`` of them: row ``r``'s values are ``values[outer[r]:outer[r+1]]``
            (starts at 0, never decreases, ends at ``nnz``).  Both index arrays may be empty when there are no
            values, as onnxruntime allows.
        ort_device : ``OrtDevice.make("cpu", 0)``.

        Raises
        ------
        ShapeError, DtypeError, ArgumentTypeError, SparseTensorError : as :meth:`sparse_coo_from_numpy`.
        """
        shape = _dense_shape(dense_shape)
        _check_cpu(ort_device)
        if len(shape) != 2:
            raise ShapeError(f"sparse_csr_from_numpy: the dense shape must be 2-D (rows, cols), got {list(shape)}")
        held = _values(values)
        nnz = held.shape[0]
        inner = _index_array(inner_indices, "inner_indices")
        outer = _index_array(outer_indices, "outer_indices")
        if inner.ndim != 1 or outer.ndim != 1:
            raise ShapeError(
                f"sparse_csr_from_numpy: inner and outer indices must be 1-D, got shapes {list(inner.shape)} and "
                f"{list(outer.shape)}"
            )
        if inner.shape[0] != nnz:
            raise ShapeError(f"sparse_csr_from_numpy: {inner.shape[0]} inner indices for {nnz} values; give one each")
        rows, cols = shape
        if outer.shape[0] != rows + 1 and not (outer.shape[0] == 0 and nnz == 0):
            raise ShapeError(
                f"sparse_csr_from_numpy: outer indices must have rows + 1 = {rows + 1} entries, got {outer.shape[0]}"
            )
        if outer.shape[0]:
            if outer[0] != 0 or outer[-1] != nnz or np.any(np.diff(outer) < 0):
                raise ShapeError(
                    f"sparse_csr_from_numpy: outer indices must start at 0, never decrease and end at the value "
                    f"count {nnz}, got {outer.tolist()[:8]}{'...' if outer.shape[0] > 8 else ''}"
                )
        _check_range(inner, cols, f"inner (column) index of dense shape {list(shape)}")
        return cls._make(OrtSparseFormat.ORT_SPARSE_CSRC, shape, held, (inner, outer))

    @classmethod
    def _make(
        cls,
        sparse_format: OrtSparseFormat,
        shape: tuple[int, ...],
        values: npt.NDArray[Any],
        indices: tuple[npt.NDArray[np.int64], ...],
    ) -> SparseTensor:
        tensor = object.__new__(cls)
        for name, value in (("_format", sparse_format), ("_dense_shape", shape), ("_values", values)):
            object.__setattr__(tensor, name, value)
        object.__setattr__(tensor, "_indices", indices)
        return tensor

    # -- immutable: copies are the tensor itself; pickling goes through the factories -----------------------
    def __copy__(self) -> SparseTensor:
        return self

    def __deepcopy__(self, memo: object) -> SparseTensor:
        return self

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        if self._format == OrtSparseFormat.ORT_SPARSE_COO:
            return (_restore_coo, (list(self._dense_shape), self._values, self._indices[0]))
        return (_restore_csr, (list(self._dense_shape), self._values, self._indices[0], self._indices[1]))

    # -- queries -------------------------------------------------------------------------------------------
    def format(self) -> OrtSparseFormat:
        """``OrtSparseFormat.ORT_SPARSE_COO`` or ``ORT_SPARSE_CSRC``."""
        return self._format

    def dense_shape(self) -> list[int]:
        """The dense tensor's shape."""
        return list(self._dense_shape)

    def data_type(self) -> str:
        """onnxruntime's type string: ``'sparse_tensor(float)'``, ``'sparse_tensor(string)'``..."""
        if self._values.dtype == object:
            return "sparse_tensor(string)"
        return "sparse_" + onnx_type_name(self._values.dtype)

    def element_type(self) -> int:
        """The ONNX element type number of the values (1 = float, 8 = string...)."""
        if self._values.dtype == object:
            return _ONNX_STRING
        return onnx_element_type(self._values.dtype)

    def device_name(self) -> str:
        """``'cpu'``: ortgpu keeps sparse tensors on the host."""
        return "cpu"

    def values(self) -> npt.NDArray[Any]:
        """A read-only view of the values (an object array of ``str`` for strings)."""
        result: npt.NDArray[Any] = self._values.view()
        return result

    def as_coo_view(self) -> SparseCooView:
        """The COO indices (``SparseTensorError`` for a tensor in another format)."""
        self._require_format(OrtSparseFormat.ORT_SPARSE_COO, "as_coo_view", "COO")
        view = object.__new__(SparseCooView)
        object.__setattr__(view, "_indices", self._indices[0])
        return view

    def as_csrc_view(self) -> SparseCsrView:
        """The CSR(C) indices (``SparseTensorError`` for a tensor in another format)."""
        self._require_format(OrtSparseFormat.ORT_SPARSE_CSRC, "as_csrc_view", "CSR(C)")
        view = object.__new__(SparseCsrView)
        object.__setattr__(view, "_inner", self._indices[0])
        object.__setattr__(view, "_outer", self._indices[1])
        return view

    def as_blocksparse_view(self) -> SparseCooView:
        """Block-sparse indices: ortgpu makes no block-sparse tensors, so this always raises ``SparseTensorError``
        (as onnxruntime does for a tensor of another format)."""
        self._require_format(OrtSparseFormat.ORT_SPARSE_BLOCK_SPARSE, "as_blocksparse_view", "BlockSparse")
        raise AssertionError("unreachable: no factory makes block-sparse tensors")

    def to_cuda(self, ort_device: SupportsDeviceType) -> SparseTensor:
        """A copy on a CUDA device: ortgpu has no CUDA (``CUDAExecutionProvider`` is not among its providers), so
        this raises ``SparseTensorError``, a ``RuntimeError`` as onnxruntime raises in a build without CUDA."""
        _device_type(ort_device)
        raise SparseTensorError(
            f"to_cuda: ortgpu has no CUDA device ('CUDAExecutionProvider' is not available), so this "
            f"{self.data_type()} stays on the CPU; use it there (values(), as_coo_view(), as_csrc_view())"
        )

    def _require_format(self, wanted: OrtSparseFormat, call: str, name: str) -> None:
        if self._format != wanted:
            raise SparseTensorError(
                f"{call}(): this sparse tensor is in {self._format.name} format, not {name}; check format() first"
            )

    def __repr__(self) -> str:
        return (
            f"<SparseTensor {self._format.name} {self.data_type()} dense_shape={list(self._dense_shape)} "
            f"nnz={self._values.shape[0]}>"
        )


def _restore_coo(shape: list[int], values: Any, indices: Any) -> SparseTensor:
    return SparseTensor.sparse_coo_from_numpy(shape, values, indices, _HOST)


def _restore_csr(shape: list[int], values: Any, inner: Any, outer: Any) -> SparseTensor:
    return SparseTensor.sparse_csr_from_numpy(shape, values, inner, outer, _HOST)


class _Host:
    """The CPU as a device argument of the factories (for unpickling)."""

    def device_type(self) -> int:
        return 0


_HOST = _Host()


# -- what OrtValue (ortgpu_core._value) asks of sparse tensors ---------------------------------------------------
def checked_sparse_tensor(obj: object) -> SparseTensor:
    """``obj`` if it is a :class:`SparseTensor`, else ``ArgumentTypeError`` (``ort_value_from_sparse_tensor``)."""
    if not isinstance(obj, SparseTensor):
        raise ArgumentTypeError(
            f"ort_value_from_sparse_tensor needs a SparseTensor (SparseTensor.sparse_coo_from_numpy(...) or "
            f"sparse_csr_from_numpy(...)), got {type(obj).__name__}"
        )
    return obj


def dense_only_error(sparse_tensor: SparseTensor, what: str) -> SparseTensorError:
    """The refusal of a call that needs dense data (``what``: the refused use) on an OrtValue holding
    ``sparse_tensor``."""
    return SparseTensorError(
        f"cannot {what}: this OrtValue holds a sparse tensor ({sparse_tensor.data_type()}, "
        f"{sparse_tensor.format().name}, dense shape {sparse_tensor.dense_shape()}), not a dense one; read it with "
        f"value.as_sparse_tensor() (values() and its index views) and give ortgpu a dense array for anything else"
    )


def not_sparse_error(data_type: str) -> SparseTensorError:
    """The refusal of ``as_sparse_tensor()`` on a dense OrtValue of type ``data_type``."""
    return SparseTensorError(
        f"as_sparse_tensor(): this OrtValue holds a dense {data_type}, not a sparse tensor; check "
        f"is_sparse_tensor() first, and read dense values with numpy() or to_numpy()"
    )


# -- argument checks -----------------------------------------------------------------------------------------
def _device_type(ort_device: object) -> int:
    device_type = getattr(ort_device, "device_type", None)
    if not callable(device_type):
        raise ArgumentTypeError(
            f"ort_device must be an OrtDevice (e.g. OrtDevice.make('cpu', 0)), got {type(ort_device).__name__}"
        )
    return int(device_type())


def _check_cpu(ort_device: object) -> None:
    if _device_type(ort_device) != 0:
        raise SparseTensorError(
            f"sparse tensors live on the CPU in ortgpu, got {ort_device!r}; pass OrtDevice.make('cpu', 0) (a run "
            f"takes dense inputs: densify the tensor and upload that, e.g. OrtValue.ortvalue_from_numpy(dense, "
            f"'webgpu'))"
        )


def _dense_shape(dense_shape: object) -> tuple[int, ...]:
    dims = np.asarray(dense_shape) if isinstance(dense_shape, (list, tuple, np.ndarray)) else None
    if dims is None or dims.ndim != 1 or (dims.size and dims.dtype.kind not in "iu"):
        raise ArgumentTypeError(f"dense_shape must be a list or 1-D array of integers, got {dense_shape!r}")
    shape = tuple(int(d) for d in dims)
    if any(d < 0 for d in shape):
        raise ShapeError(f"dense_shape {list(shape)} has a negative dimension; dims must be >= 0")
    return shape


def _values(values: object) -> npt.NDArray[Any]:
    if not isinstance(values, np.ndarray):
        raise ArgumentTypeError(
            f"values must be a 1-D numpy array, got {type(values).__name__}; wrap it: np.array(...)"
        )
    if values.ndim != 1:
        raise ShapeError(f"values must be a 1-D numpy array (the non-zero values), got shape {list(values.shape)}")
    kind = values.dtype.kind
    if kind in "USO":
        return _read_only(np.array([_as_str(item) for item in values.tolist()], dtype=object))
    if values.dtype not in ONNX_DTYPES:
        raise DtypeError(
            f"sparse tensor values of dtype {values.dtype} are not supported: use strings or one of "
            + ", ".join(sorted(str(d) for d in ONNX_DTYPES))
        )
    return _read_only(np.array(values, copy=True, order="C"))


def _as_str(item: object) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, bytes):
        try:
            return item.decode("utf-8")
        except UnicodeDecodeError:
            raise DtypeError(f"string values must be UTF-8, got {item!r}") from None
    raise DtypeError(f"object values must all be str (sparse string tensors), got {type(item).__name__} {item!r}")


def _index_array(indices: object, what: str) -> npt.NDArray[np.int64]:
    if not isinstance(indices, (np.ndarray, list, tuple)):
        raise ArgumentTypeError(f"{what} must be a numpy array of int64 indices, got {type(indices).__name__}")
    try:
        array = np.asarray(indices)
    except ValueError as error:  # a ragged list
        raise ArgumentTypeError(f"{what} must be a rectangular array of integers: {error}") from None
    if array.size == 0 and array.dtype.kind in "fiub":
        return _read_only(np.zeros(array.shape, dtype=np.int64))  # an empty list is float64 to numpy
    if array.dtype.kind not in "iu":
        raise DtypeError(
            f"{what} must hold integers (int64; narrower integers are widened), got {array.dtype}; ortgpu never "
            f"truncates indices: pass np.asarray(indices, dtype=np.int64) if they are whole numbers"
        )
    if array.dtype == np.uint64 and array.size and int(array.max()) > _INT64_MAX:
        raise ShapeError(f"{what} holds {int(array.max())}, beyond int64")
    return _read_only(np.array(array, dtype=np.int64, copy=True, order="C"))


def _check_range(indices: npt.NDArray[np.int64], limit: int, what: str) -> None:
    if not indices.size:
        return
    low, high = int(indices.min()), int(indices.max())
    if low < 0 or high >= limit:
        bad = low if low < 0 else high
        raise ShapeError(f"index {bad} is out of range: each {what} must be in [0, {limit})")
