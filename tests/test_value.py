"""OrtValue: round trips per dtype, provenance, the CPU/device split, and bad input."""

from __future__ import annotations

import numpy as np
import pytest

import ortgpu_core as core
from ortgpu_core import OrtValue

ROUND_TRIP_DTYPES = ["float32", "float16", "int32", "int64", "bool", "uint8", "int8", "uint32", "int16"]


def random_array(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return np.asarray(rng.random(shape) > 0.5)
    if np.issubdtype(np.dtype(dtype), np.integer):
        info = np.iinfo(np.dtype(dtype))
        return rng.integers(info.min, info.max, size=shape, dtype=np.dtype(dtype), endpoint=True)
    return np.asarray(rng.standard_normal(shape)).astype(dtype)


@pytest.mark.parametrize("dtype", ROUND_TRIP_DTYPES)
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4), (1,), ()])
def test_round_trip_cpu_gpu_cpu(env: core.Env, dtype: str, shape: tuple[int, ...]) -> None:
    if dtype == "float16" and "shader-f16" not in env.default_device.features:
        with pytest.raises(core.DtypeError, match="shader-f16"):
            env.shared_allocator().empty(shape, dtype)
        return
    array = random_array(dtype, shape, seed=len(shape))
    value = env.shared_allocator().from_numpy(array)
    assert value.device_name() == "webgpu"
    assert value.shape() == list(shape)
    assert value.dtype == np.dtype(dtype)
    back = value.to_numpy()
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)
    # update_inplace then read again: the device holds the new contents, bit for bit.
    second = random_array(dtype, shape, seed=99)
    value.update_inplace(second)
    np.testing.assert_array_equal(value.to_numpy(), second)


@pytest.mark.parametrize("dtype", ["float32", "int8", "float16"])
def test_to_numpy_into_a_given_array(env: core.Env, dtype: str) -> None:
    if dtype == "float16" and "shader-f16" not in env.default_device.features:
        return  # float16 device values are refused there (test_round_trip_cpu_gpu_cpu checks how)
    array = random_array(dtype, (5, 7), seed=3)
    value = env.shared_allocator().from_numpy(array)
    out = np.full((5, 7), 1, dtype)
    assert value.to_numpy(out=out) is out
    np.testing.assert_array_equal(out, array)
    value.update_inplace(random_array(dtype, (5, 7), seed=4))
    value.to_numpy(out=out)  # the same array again: it now holds the new contents
    np.testing.assert_array_equal(out, value.to_numpy())
    host = core.OrtValue.ortvalue_from_numpy(array)
    other = np.zeros((5, 7), dtype)
    assert host.to_numpy(out=other) is other
    np.testing.assert_array_equal(other, array)


def test_to_numpy_refuses_a_wrong_out_and_leaves_it_alone(env: core.Env) -> None:
    value = env.shared_allocator().from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
    wide = np.full((3, 8), 7.0, np.float32)
    bad: list[tuple[np.ndarray, type[Exception], str]] = [
        (np.full((4, 3), 7.0, np.float32), core.ShapeError, "shape"),
        (np.full((3, 4), 7.0, np.float64), core.DtypeError, "dtype"),
        (wide[:, ::2], core.InvalidArgumentError, "C-contiguous"),
        (np.full((3, 4), 7.0, np.float32).T.copy().T, core.InvalidArgumentError, "C-contiguous"),
    ]
    for out, error, words in bad:
        with pytest.raises(error, match=words):
            value.to_numpy(out=out)
        assert np.all(out == 7.0)
    frozen = np.full((3, 4), 7.0, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(core.InvalidArgumentError, match="writable"):
        value.to_numpy(out=frozen)
    with pytest.raises(core.ArgumentTypeError, match="numpy array"):
        value.to_numpy(out=[[0.0] * 4] * 3)  # type: ignore[arg-type]
    assert np.all(frozen == 7.0) and np.all(wide == 7.0)


def test_empty_values_are_zero_filled(env: core.Env) -> None:
    value = env.shared_allocator().empty((4, 3), np.int32)
    np.testing.assert_array_equal(value.to_numpy(), np.zeros((4, 3), np.int32))


def test_zero_sized_value(env: core.Env) -> None:
    value = env.shared_allocator().empty((0, 3), "float32")
    assert value.to_numpy().shape == (0, 3)
    value.update_inplace(np.zeros((0, 3), np.float32))


def test_provenance_of_shared_value(env: core.Env) -> None:
    device = env.default_device
    value = env.shared_allocator(device).empty((2,), "float32")
    p = value.provenance
    assert (p.placement, p.allocator_kind, p.session_id, p.env_id) == ("webgpu", "shared", None, env.id)
    assert p.device is device
    assert (p.vendor_id, p.device_id) == (device.vendor_id, device.device_id)
    text = repr(value)
    assert "allocator_kind='shared'" in text and f"env_id={env.id}" in text and "placement='webgpu'" in text


def test_provenance_of_session_value(env: core.Env) -> None:
    allocator = core.SessionAllocator(env, env.default_device, 41)
    value = allocator.empty((2,), "int32")
    assert value.provenance.allocator_kind == "session"
    assert value.provenance.session_id == 41
    assert "session_id=41" in repr(value)
    allocator.close()


def test_provenance_is_immutable(env: core.Env) -> None:
    value = env.shared_allocator().empty((1,), "float32")
    with pytest.raises(AttributeError):
        value.provenance.session_id = 3  # type: ignore[misc]
    with pytest.raises(TypeError, match="attached by ortgpu"):
        core.Provenance()


def test_cpu_value_has_cpu_provenance_and_numpy() -> None:
    array = np.arange(6, dtype=np.float32)
    value = OrtValue.ortvalue_from_numpy(array)
    assert value.provenance.placement == "cpu" and value.provenance.allocator_kind == "cpu"
    assert value.provenance.device is None
    assert value.numpy() is not None and np.shares_memory(value.numpy(), array)
    assert value.data_ptr() == array.ctypes.data
    np.testing.assert_array_equal(np.asarray(value), array)
    np.testing.assert_array_equal(np.from_dlpack(value), array)
    assert value.element_type() == 1 and value.data_type() == "tensor(float)"


def test_device_value_refuses_raw_access(env: core.Env) -> None:
    value = env.shared_allocator().empty((3,), "float32")
    with pytest.raises(core.UnsafeAccessError, match=r"to_numpy\(\)"):
        np.asarray(value)
    with pytest.raises(core.UnsafeAccessError, match=r"to_numpy\(\)"):
        _ = value.__dlpack__
    with pytest.raises(core.UnsafeAccessError):
        np.from_dlpack(value)
    with pytest.raises(core.UnsafeAccessError, match="update_inplace"):
        value.data_ptr()  # type: ignore[misc]
    with pytest.raises(core.UnsafeAccessError, match=r"to_numpy\(\)"):
        value.numpy()  # type: ignore[misc]


def test_update_inplace_never_casts(env: core.Env) -> None:
    value = env.shared_allocator().from_numpy(np.ones((2, 2), np.float32))
    with pytest.raises(core.DtypeError, match=r"astype\('float32'\)"):
        value.update_inplace(np.zeros((2, 2), np.float64))
    with pytest.raises(core.ShapeError, match=r"\[2, 2\]"):
        value.update_inplace(np.zeros((4,), np.float32))
    with pytest.raises(TypeError, match="numpy array"):
        value.update_inplace([[1.0, 2.0], [3.0, 4.0]])  # type: ignore[arg-type]
    np.testing.assert_array_equal(value.to_numpy(), np.ones((2, 2), np.float32))  # nothing changed


def test_update_inplace_accepts_non_contiguous(env: core.Env) -> None:
    value = env.shared_allocator().empty((3, 2), "float32")
    source = np.arange(6, dtype=np.float32).reshape(2, 3).T
    value.update_inplace(source)
    np.testing.assert_array_equal(value.to_numpy(), source)


@pytest.mark.parametrize("shape", [(-1, 3), (2, -5), ("a", 2), (2.5,), (True,)])
def test_bad_shapes_are_rejected(env: core.Env, shape: tuple[object, ...]) -> None:
    with pytest.raises(core.ShapeError):
        env.shared_allocator().empty(shape, "float32")  # type: ignore[arg-type]


def test_absurd_shape_checked_against_device_limits(env: core.Env) -> None:
    before = env.live_handles()
    limit = env.default_device.limits.max_buffer_size
    with pytest.raises(core.ShapeError, match="max_buffer_size"):
        env.shared_allocator().empty((limit // 4 + 1,), "float32")
    with pytest.raises(core.ShapeError, match="max_buffer_size"):
        env.shared_allocator().empty((1 << 40, 1 << 40), "float32")
    assert env.live_handles() == before


def test_unsupported_device_dtypes(env: core.Env) -> None:
    with pytest.raises(core.DtypeError, match="64-bit floats"):
        env.shared_allocator().empty((2,), "float64")
    with pytest.raises(core.DtypeError, match="not a dtype|not supported"):
        env.shared_allocator().empty((2,), "complex64")
    with pytest.raises(core.DtypeError):
        env.shared_allocator().empty((2,), "no-such-type")


def test_released_value_raises(env: core.Env) -> None:
    value = env.shared_allocator().from_numpy(np.ones(3, np.float32))
    value.release()
    value.release()  # idempotent
    assert value.released
    for use in (value.to_numpy, lambda: value.update_inplace(np.ones(3, np.float32))):
        with pytest.raises(core.ReleasedValueError, match="released"):
            use()


def test_direct_construction_is_refused() -> None:
    with pytest.raises(TypeError, match="ortvalue_from_numpy"):
        OrtValue()
    with pytest.raises(TypeError):
        core.DeviceBuffer()


def test_dtype_names_and_numpy_dtypes_are_equivalent(env: core.Env) -> None:
    for spelling in ("float32", np.float32, np.dtype("float32"), "tensor(float)"):
        assert env.shared_allocator().empty((1,), spelling).dtype == np.float32


def test_ortvalue_from_numpy_webgpu_uses_default_env() -> None:
    value = OrtValue.ortvalue_from_numpy(np.arange(4, dtype=np.int32), "webgpu", 0)
    assert value.provenance.placement == "webgpu"
    assert value.provenance.env_id == core.get_env().id
    np.testing.assert_array_equal(value.to_numpy(), np.arange(4, dtype=np.int32))
    shaped = OrtValue.ortvalue_from_shape_and_type([2, 2], "float32", "webgpu", 0)
    assert shaped.shape() == [2, 2]
    with pytest.raises(ValueError, match="device_type"):
        OrtValue.ortvalue_from_numpy(np.zeros(2), "cuda")  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="out of range"):
        OrtValue.ortvalue_from_numpy(np.zeros(2, np.float32), "webgpu", 99)
    value.release()
    shaped.release()


def test_class_getitem_for_runtime_annotations() -> None:
    alias = OrtValue[core.WebGPU]
    assert alias.__origin__ is OrtValue
