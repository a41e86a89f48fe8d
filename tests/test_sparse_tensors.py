"""Sparse tensors (``ortgpu_core._sparse``): ``SparseTensor`` in COO and CSR(C) formats, ``OrtSparseFormat``, and the
OrtValue that holds one, each compared with onnxruntime's own for the same inputs, bad ones included.

Where onnxruntime refuses an input, ortgpu refuses it with a typed error; where onnxruntime accepts an input that a
consumer would read out of bounds (an index outside the dense shape, a malformed CSR outer index) or silently
changes it (float indices truncated), ortgpu refuses it too, and the test says so by checking both sides.
"""

from __future__ import annotations

import copy
import gc
import pickle
from typing import Any, Callable

import ml_dtypes
import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime
import pytest

import ortgpu
from ortgpu import (
    ArgumentTypeError,
    DtypeError,
    Env,
    InvalidArgumentError,
    OrtSparseFormat,
    OrtValue,
    ShapeError,
    SparseTensor,
    SparseTensorError,
)

SHAPE = [9, 9]
VALUES = np.array([1.0, 2.0, 3.0], dtype=np.float32)
LINEAR = np.array([3, 5, 15], dtype=np.int64)
PAIRS = np.array([[0, 3], [0, 5], [1, 6]], dtype=np.int64)
INNER = np.array([1, 1, 1], dtype=np.int64)
OUTER = np.array([0, 1, 2, 3, 3, 3, 3, 3, 3, 3], dtype=np.int64)


def ours_cpu() -> ortgpu.OrtDevice:
    return ortgpu.OrtDevice.make("cpu", 0)


def theirs_cpu() -> Any:
    return onnxruntime.OrtDevice.make("cpu", 0)


def coo(module: Any, shape: Any, values: Any, indices: Any, device: Any = None) -> Any:
    device = device if device is not None else (ours_cpu() if module is ortgpu else theirs_cpu())
    return module.SparseTensor.sparse_coo_from_numpy(shape, values, indices, device)


def csr(module: Any, shape: Any, values: Any, inner: Any, outer: Any) -> Any:
    device = ours_cpu() if module is ortgpu else theirs_cpu()
    return module.SparseTensor.sparse_csr_from_numpy(shape, values, inner, outer, device)


def test_formats_have_onnxruntimes_numbers() -> None:
    for name in ("ORT_SPARSE_UNDEFINED", "ORT_SPARSE_COO", "ORT_SPARSE_CSRC", "ORT_SPARSE_BLOCK_SPARSE"):
        assert int(getattr(OrtSparseFormat, name)) == int(getattr(onnxruntime.OrtSparseFormat, name)), name
    assert [f.name for f in OrtSparseFormat] == list(onnxruntime.OrtSparseFormat.__members__)


@pytest.mark.parametrize("indices", [LINEAR, PAIRS], ids=["linear", "pairs"])
def test_coo_matches_onnxruntime_and_its_views_outlive_the_tensor(indices: np.ndarray) -> None:
    ours, theirs = coo(ortgpu, SHAPE, VALUES, indices), coo(onnxruntime, SHAPE, VALUES, indices)
    assert ours.format() == OrtSparseFormat.ORT_SPARSE_COO and int(ours.format()) == int(theirs.format())
    assert ours.dense_shape() == theirs.dense_shape() == SHAPE
    assert ours.data_type() == theirs.data_type() == "sparse_tensor(float)"
    assert ours.device_name() == theirs.device_name() == "cpu"
    values, got = ours.values(), ours.as_coo_view().indices()
    assert not values.flags.writeable and not got.flags.writeable
    with pytest.raises(ValueError):
        values.flags.writeable = True  # a view of read-only data cannot be made writable again
    np.testing.assert_array_equal(got, theirs.as_coo_view().indices())
    assert got.dtype == np.int64 and got.shape == indices.shape
    del ours
    gc.collect()
    np.testing.assert_array_equal(values, theirs.values())
    np.testing.assert_array_equal(got, indices)


def test_csr_matches_onnxruntime() -> None:
    ours, theirs = csr(ortgpu, SHAPE, VALUES, INNER, OUTER), csr(onnxruntime, SHAPE, VALUES, INNER, OUTER)
    assert int(ours.format()) == int(theirs.format()) == int(OrtSparseFormat.ORT_SPARSE_CSRC)
    assert ours.dense_shape() == theirs.dense_shape() and ours.data_type() == theirs.data_type()
    view = ours.as_csrc_view()
    inner, outer = view.inner(), view.outer()
    del ours, view
    gc.collect()
    assert not inner.flags.writeable and not outer.flags.writeable
    np.testing.assert_array_equal(inner, theirs.as_csrc_view().inner())
    np.testing.assert_array_equal(outer, theirs.as_csrc_view().outer())
    # Both allow a tensor with no values and no indices at all.
    empty = csr(ortgpu, SHAPE, VALUES[:0], INNER[:0], OUTER[:0])
    csr(onnxruntime, SHAPE, VALUES[:0], INNER[:0], OUTER[:0])
    assert empty.as_csrc_view().outer().shape == (0,)


@pytest.mark.parametrize("dtype", [np.float64, np.int8, np.int32, np.int64, np.uint8, np.uint64])
def test_numeric_values_of_every_width_match_onnxruntime(dtype: Any) -> None:
    values = VALUES.astype(dtype)
    ours, theirs = coo(ortgpu, SHAPE, values, LINEAR), coo(onnxruntime, SHAPE, values, LINEAR)
    assert ours.data_type() == theirs.data_type()
    assert ours.values().dtype == theirs.values().dtype == values.dtype
    np.testing.assert_array_equal(ours.values(), theirs.values())


@pytest.mark.parametrize("dtype", [np.bool_, np.float16])
def test_values_onnxruntime_cannot_read_back_are_read_back(dtype: Any) -> None:
    values = VALUES.astype(dtype)
    ours, theirs = coo(ortgpu, SHAPE, values, LINEAR), coo(onnxruntime, SHAPE, values, LINEAR)
    assert ours.data_type() == theirs.data_type()
    with pytest.raises(RuntimeError):
        theirs.values()  # onnxruntime 1.32 has no numpy type for these in values()
    np.testing.assert_array_equal(ours.values(), values)
    # bfloat16 (ml_dtypes), which onnxruntime refuses, is an ortgpu dtype.
    assert coo(ortgpu, SHAPE, VALUES.astype(ml_dtypes.bfloat16), LINEAR).data_type() == "sparse_tensor(bfloat16)"


def test_string_values_match_onnxruntime_in_both_formats() -> None:
    strings = np.array(["xyz", "yxz", "zyx"], dtype=str)
    for ours, theirs in (
        (coo(ortgpu, SHAPE, strings, LINEAR), coo(onnxruntime, SHAPE, strings, LINEAR)),
        (csr(ortgpu, SHAPE, strings, INNER, OUTER), csr(onnxruntime, SHAPE, strings, INNER, OUTER)),
    ):
        assert ours.data_type() == theirs.data_type() == "sparse_tensor(string)"
        assert ours.values().dtype == theirs.values().dtype == object
        assert ours.values().tolist() == theirs.values().tolist() == strings.tolist()
        assert not ours.values().flags.writeable
    # bytes are UTF-8 strings; object arrays of str (what values() returns) are taken back.
    assert coo(ortgpu, SHAPE, np.array([b"ab", b"c", b"d"]), LINEAR).values().tolist() == ["ab", "c", "d"]
    again = coo(ortgpu, SHAPE, coo(ortgpu, SHAPE, strings, LINEAR).values(), LINEAR)
    assert again.values().tolist() == strings.tolist()


def test_indices_narrower_than_int64_and_lists_are_widened_as_onnxruntime_does() -> None:
    for indices in (LINEAR.astype(np.int32), LINEAR.astype(np.uint16), LINEAR.tolist(), LINEAR[::-1].copy()):
        ours, theirs = coo(ortgpu, SHAPE, VALUES, indices), coo(onnxruntime, SHAPE, VALUES, indices)
        np.testing.assert_array_equal(ours.as_coo_view().indices(), theirs.as_coo_view().indices())
        assert ours.as_coo_view().indices().dtype == np.int64
    ours = csr(ortgpu, SHAPE, VALUES, INNER.astype(np.int32), OUTER.astype(np.int32))
    assert ours.as_csrc_view().outer().dtype == np.int64


def test_the_tensor_keeps_its_own_copies() -> None:
    values, indices = VALUES.copy(), LINEAR.copy()
    ours = coo(ortgpu, SHAPE, values, indices)
    values[0], indices[0] = 100.0, 80
    np.testing.assert_array_equal(ours.values(), VALUES)
    np.testing.assert_array_equal(ours.as_coo_view().indices(), LINEAR)
    # Non-contiguous values, which onnxruntime refuses, are copied contiguous.
    strided = np.array([1.0, 0.0, 2.0, 0.0, 3.0], dtype=np.float32)[::2]
    with pytest.raises(RuntimeError, match="contiguous"):
        coo(onnxruntime, SHAPE, strided, LINEAR)
    np.testing.assert_array_equal(coo(ortgpu, SHAPE, strided, LINEAR).values(), VALUES)


def test_a_tensor_is_immutable_copies_are_itself_and_pickles_revalidate() -> None:
    ours = coo(ortgpu, SHAPE, VALUES, PAIRS)
    assert copy.copy(ours) is ours and copy.deepcopy(ours) is ours
    for tensor in (ours, csr(ortgpu, SHAPE, VALUES, INNER, OUTER)):
        back = pickle.loads(pickle.dumps(tensor))
        assert back.format() == tensor.format() and back.dense_shape() == tensor.dense_shape()
        np.testing.assert_array_equal(back.values(), tensor.values())
        assert not back.values().flags.writeable
    with pytest.raises(AttributeError, match="immutable"):
        ours._values = VALUES  # what the factory checked stays true
    with pytest.raises(AttributeError, match="immutable"):
        ours.as_coo_view()._indices = LINEAR


def test_objects_are_made_only_by_the_factories() -> None:
    from ortgpu.capi.onnxruntime_pybind11_state import SparseCooView, SparseCsrView

    for cls in (SparseTensor, SparseCooView, SparseCsrView):
        with pytest.raises(ArgumentTypeError, match="cannot be constructed directly"):
            cls()


def test_views_of_another_format_and_to_cuda_refuse_as_onnxruntime() -> None:
    cuda = ortgpu.OrtDevice.make("cuda", 0)
    assert "CUDAExecutionProvider" not in ortgpu.get_available_providers()
    for module in (ortgpu, onnxruntime):
        as_coo, as_csr = coo(module, SHAPE, VALUES, LINEAR), csr(module, SHAPE, VALUES, INNER, OUTER)
        errors = (SparseTensorError,) if module is ortgpu else (RuntimeError,)
        for call in (as_coo.as_csrc_view, as_coo.as_blocksparse_view, as_csr.as_coo_view, as_csr.as_blocksparse_view):
            with pytest.raises(errors, match="format"):
                call()
        device = cuda if module is ortgpu else onnxruntime.OrtDevice.make("cuda", 0)
        with pytest.raises(RuntimeError):
            as_coo.to_cuda(device)
    with pytest.raises(SparseTensorError, match="no CUDA"):
        coo(ortgpu, SHAPE, VALUES, LINEAR).to_cuda(cuda)
    with pytest.raises(ArgumentTypeError):
        coo(ortgpu, SHAPE, VALUES, LINEAR).to_cuda("cuda")


def test_ort_device_make_matches_onnxruntime() -> None:
    for name in ("cpu", "gpu", "webgpu", "cuda", "dml", "cann", "npu"):
        ours, theirs = ortgpu.OrtDevice.make(name, 1), onnxruntime.OrtDevice.make(name, 1)
        assert ours.device_type() == theirs.device_type(), name
        assert ours.device_vendor_id() == theirs.device_vendor_id(), name
        assert ours.device_id() == theirs.device_id() == 1 and ours.device_mem_type() == theirs.device_mem_type()
    assert ortgpu.OrtDevice.make("gpu", 0, 0x8086).device_vendor_id() == 0x8086
    with pytest.raises(Exception, match="Unsupported device type"):
        onnxruntime.OrtDevice.make("tpu", 0)
    with pytest.raises(InvalidArgumentError, match="Unsupported device type"):
        ortgpu.OrtDevice.make("tpu", 0)


# -- bad inputs ----------------------------------------------------------------------------------------------
def _raises(call: Callable[[], object], error: type[BaseException], match: str | None = None) -> None:
    with pytest.raises(error, match=match):
        call()


#: (what, factory arguments, ortgpu's error): refused by onnxruntime (``RuntimeError`` or ``TypeError``) and ortgpu.
BOTH_REFUSE: list[tuple[str, Callable[[Any], object], type[BaseException]]] = [
    ("fewer linear indices than values", lambda m: coo(m, SHAPE, VALUES, LINEAR[:2]), ShapeError),
    ("too few coordinate pairs", lambda m: coo(m, SHAPE, VALUES, PAIRS[:2]), ShapeError),
    ("triples for a 2-D shape", lambda m: coo(m, SHAPE, VALUES, np.ones((3, 3), np.int64)), ShapeError),
    ("2-D values", lambda m: coo(m, SHAPE, VALUES.reshape(3, 1), LINEAR), ShapeError),
    ("values as a list", lambda m: coo(m, SHAPE, VALUES.tolist(), LINEAR), ArgumentTypeError),
    ("complex values", lambda m: coo(m, SHAPE, VALUES.astype(np.complex64), LINEAR), DtypeError),
    ("objects that are not str", lambda m: coo(m, SHAPE, np.array([1, "a", 2.0], dtype=object), LINEAR), DtypeError),
    ("a non-integer dense dim", lambda m: coo(m, [9.0, 9.0], VALUES, LINEAR), ArgumentTypeError),
    ("csr outer of rows entries", lambda m: csr(m, SHAPE, VALUES, INNER, OUTER[:-1]), ShapeError),
    ("csr inner count", lambda m: csr(m, SHAPE, VALUES, INNER[:2], OUTER), ShapeError),
    ("csr on a 3-D shape", lambda m: csr(m, [9, 9, 1], VALUES, INNER, OUTER), ShapeError),
    ("csr on a 1-D shape", lambda m: csr(m, [81], VALUES, INNER, OUTER), ShapeError),
    ("csr 2-D inner", lambda m: csr(m, SHAPE, VALUES, INNER.reshape(3, 1), OUTER), ShapeError),
]


@pytest.mark.parametrize("case", BOTH_REFUSE, ids=[c[0] for c in BOTH_REFUSE])
def test_what_onnxruntime_refuses_ortgpu_refuses_with_a_typed_error(
    case: tuple[str, Callable[[Any], object], type[BaseException]],
) -> None:
    _, make, error = case
    _raises(lambda: make(onnxruntime), (RuntimeError, TypeError))  # type: ignore[arg-type]
    values, indices = VALUES.copy(), LINEAR.copy()
    _raises(lambda: make(ortgpu), error)
    np.testing.assert_array_equal(values, VALUES)  # nothing the caller gave was changed
    np.testing.assert_array_equal(indices, LINEAR)


def test_a_device_other_than_the_cpu_is_refused_as_onnxruntime() -> None:
    _raises(lambda: coo(onnxruntime, SHAPE, VALUES, LINEAR, onnxruntime.OrtDevice.make("webgpu", 0)), RuntimeError)
    for device in (ortgpu.OrtDevice.make("webgpu", 0), ortgpu.OrtDevice.make("cuda", 0)):
        refused = SparseTensorError
        _raises(lambda device=device: coo(ortgpu, SHAPE, VALUES, LINEAR, device), refused, "CPU")  # type: ignore[misc]
    _raises(lambda: coo(ortgpu, SHAPE, VALUES, LINEAR, "cpu"), ArgumentTypeError)


#: Inputs onnxruntime accepts but that name elements outside the dense shape, or a CSR structure a reader would walk
#: out of bounds, or indices it truncates: ortgpu refuses each.
STRICTER: list[tuple[str, Callable[[Any], object], type[BaseException], str]] = [
    ("linear index past the end", lambda m: coo(m, SHAPE, VALUES, np.array([3, 5, 81])), ShapeError, "out of range"),
    ("negative linear index", lambda m: coo(m, SHAPE, VALUES, np.array([-1, 5, 15])), ShapeError, "out of range"),
    ("row past the end", lambda m: coo(m, SHAPE, VALUES, np.array([[0, 3], [0, 5], [9, 0]])), ShapeError, "row"),
    ("column past the end", lambda m: coo(m, SHAPE, VALUES, np.array([[0, 3], [0, 9], [1, 0]])), ShapeError, "col"),
    ("3-D indices", lambda m: coo(m, SHAPE, VALUES, np.zeros((3, 2, 1), np.int64)), ShapeError, "1-D"),
    ("pairs for a 3-D shape", lambda m: coo(m, [3, 3, 9], VALUES, PAIRS), ShapeError, "linear indices"),
    ("float indices", lambda m: coo(m, SHAPE, VALUES, np.array([3.5, 5.0, 15.0])), DtypeError, "integers"),
    ("bool indices", lambda m: coo(m, SHAPE, VALUES, np.array([True, False, True])), DtypeError, "integers"),
    ("negative dense dim", lambda m: coo(m, [-1, 9], VALUES, LINEAR), ShapeError, "negative"),
    ("csr column past the end", lambda m: csr(m, SHAPE, VALUES, np.array([1, 1, 9]), OUTER), ShapeError, "column"),
    ("csr negative column", lambda m: csr(m, SHAPE, VALUES, np.array([1, -1, 1]), OUTER), ShapeError, "column"),
    ("csr outer from 1", lambda m: csr(m, SHAPE, VALUES, INNER, np.r_[1, OUTER[1:]]), ShapeError, "start at 0"),
    ("csr outer decreasing", lambda m: csr(m, SHAPE, VALUES, INNER, np.r_[0, 2, 1, OUTER[3:]]), ShapeError, "decr"),
    ("csr outer end", lambda m: csr(m, SHAPE, VALUES, INNER, np.r_[OUTER[:-1], 4]), ShapeError, "end at"),
]


@pytest.mark.parametrize("case", STRICTER, ids=[c[0] for c in STRICTER])
def test_what_onnxruntime_leaves_unchecked_ortgpu_refuses(
    case: tuple[str, Callable[[Any], object], type[BaseException], str],
) -> None:
    _, make, error, match = case
    make(onnxruntime)  # accepted there
    _raises(lambda: make(ortgpu), error, match)


def test_an_empty_matrix_with_a_full_outer_index_is_taken() -> None:
    # onnxruntime wants both index arrays empty when there are no values; rows + 1 zeros is the same matrix.
    zeros = np.zeros(10, np.int64)
    _raises(lambda: csr(onnxruntime, SHAPE, VALUES[:0], INNER[:0], zeros), RuntimeError)
    assert csr(ortgpu, SHAPE, VALUES[:0], INNER[:0], zeros).as_csrc_view().outer().tolist() == [0] * 10


# -- OrtValue holding a sparse tensor -------------------------------------------------------------------------
def test_ortvalue_holding_a_sparse_tensor_matches_onnxruntime() -> None:
    ours = OrtValue.ort_value_from_sparse_tensor(coo(ortgpu, SHAPE, VALUES, LINEAR))
    theirs = onnxruntime.OrtValue.ort_value_from_sparse_tensor(coo(onnxruntime, SHAPE, VALUES, LINEAR))
    assert ours.is_sparse_tensor() and theirs.is_sparse_tensor()
    assert not ours.is_tensor() and not theirs.is_tensor()
    assert not ours.is_tensor_sequence() and not theirs.is_tensor_sequence()
    assert ours.shape() == theirs.shape() == SHAPE
    assert ours.data_type() == theirs.data_type() == "sparse_tensor(float)"
    assert ours.element_type() == theirs.element_type() == 1
    assert ours.device_name() == theirs.device_name() == "cpu" and ours.has_value() == theirs.has_value()
    back = ours.as_sparse_tensor()
    values = back.values()
    del ours, back
    gc.collect()
    np.testing.assert_array_equal(values, VALUES)
    strings = OrtValue.ort_value_from_sparse_tensor(coo(ortgpu, SHAPE, np.array(["a", "b", "c"]), LINEAR))
    theirs_strings = onnxruntime.OrtValue.ort_value_from_sparse_tensor(
        coo(onnxruntime, SHAPE, np.array(["a", "b", "c"]), LINEAR)
    )
    assert strings.data_type() == theirs_strings.data_type() and strings.element_type() == 8
    assert not OrtValue.ortvalue_from_numpy(VALUES).is_sparse_tensor()


def test_dense_only_calls_refuse_a_sparse_value_as_onnxruntime() -> None:
    ours = OrtValue.ort_value_from_sparse_tensor(coo(ortgpu, SHAPE, VALUES, LINEAR))
    theirs = onnxruntime.OrtValue.ort_value_from_sparse_tensor(coo(onnxruntime, SHAPE, VALUES, LINEAR))
    for name in ("numpy", "data_ptr", "tensor_size_in_bytes"):
        _raises(lambda name=name: getattr(theirs, name)(), RuntimeError)  # type: ignore[misc]
        _raises(lambda name=name: getattr(ours, name)(), SparseTensorError, "holds a sparse tensor")  # type: ignore[misc]
    for call in (
        ours.to_numpy,
        lambda: np.asarray(ours),
        lambda: ours.__dlpack__(),
        lambda: ours.__dlpack_device__(),
        lambda: ours.update_inplace(np.zeros(SHAPE, np.float32)),
        lambda: copy.copy(ours),
        lambda: pickle.dumps(ours),
        lambda: OrtValue.ortvalue_from_numpy(np.zeros(SHAPE, np.float32)).copy_from(ours),
    ):
        _raises(call, SparseTensorError, "as_sparse_tensor")
    np.testing.assert_array_equal(ours.as_sparse_tensor().values(), VALUES)  # still usable as a sparse value


def test_as_sparse_tensor_and_its_factory_refuse_the_wrong_objects() -> None:
    dense, theirs = OrtValue.ortvalue_from_numpy(VALUES), onnxruntime.OrtValue.ortvalue_from_numpy(VALUES)
    _raises(theirs.as_sparse_tensor, RuntimeError)
    _raises(dense.as_sparse_tensor, SparseTensorError, r"dense tensor\(float\)")
    not_sparse: Any = VALUES
    _raises(lambda: OrtValue.ort_value_from_sparse_tensor(not_sparse), ArgumentTypeError, "needs a SparseTensor")
    _raises(lambda: onnxruntime.OrtValue.ort_value_from_sparse_tensor(VALUES), AttributeError)
    released = OrtValue.ort_value_from_sparse_tensor(coo(ortgpu, SHAPE, VALUES, LINEAR))
    released.release()
    _raises(released.as_sparse_tensor, ortgpu.ReleasedValueError)


def _identity_model() -> bytes:
    graph = oh.make_graph(
        [oh.make_node("Identity", ["X"], ["Y"])],
        "identity",
        [oh.make_tensor_value_info("X", onnx.TensorProto.FLOAT, SHAPE)],
        [oh.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, SHAPE)],
    )
    return bytes(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]).SerializeToString())


def test_a_sparse_value_is_refused_as_a_run_input_as_onnxruntime(env: Env) -> None:
    model = _identity_model()
    theirs = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    their_value = onnxruntime.OrtValue.ort_value_from_sparse_tensor(coo(onnxruntime, SHAPE, VALUES, LINEAR))
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

    _raises(lambda: theirs.run(None, {"X": their_value}), InvalidArgument, "sparse tensor")
    sess = ortgpu.InferenceSession(model, env=env)
    ours = OrtValue.ort_value_from_sparse_tensor(coo(ortgpu, SHAPE, VALUES, LINEAR))
    _raises(lambda: sess.run(None, {"X": ours}), InvalidArgumentError, "holds a sparse tensor")
    binding = sess.io_binding()
    _raises(lambda: binding.bind_ortvalue_input("X", ours), SparseTensorError, "input 'X'")
    # A device value is not touched by a refused copy from a sparse one.
    target = env.shared_allocator(env.default_device).from_numpy(np.ones(SHAPE, np.float32))
    _raises(lambda: target.copy_from(ours), SparseTensorError)
    np.testing.assert_array_equal(target.to_numpy(), np.ones(SHAPE, np.float32))
    # The session still runs dense inputs afterwards.
    dense = np.arange(81, dtype=np.float32).reshape(SHAPE)
    np.testing.assert_array_equal(sess.run(None, {"X": dense})[0], dense)
    target.release()
    sess.close()


def test_capi_and_inference_collection_name_the_classes() -> None:
    from ortgpu.capi import onnxruntime_inference_collection as collection
    from ortgpu.capi import onnxruntime_pybind11_state as state

    assert state.SparseTensor is collection.SparseTensor is SparseTensor
    assert state.OrtSparseFormat is OrtSparseFormat
    assert issubclass(SparseTensorError, RuntimeError) and issubclass(SparseTensorError, state.InvalidArgument)
