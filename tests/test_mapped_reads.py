"""Large reads handed over mapped (``read_buffer_mapped``): from ``MAPPED_READ_MIN`` bytes, ``to_numpy()`` and a run's
outputs are the staging memory the device copied into, with no host copy.

The hazards: an array that changes after it was returned (its staging buffer reused by a later read or run while the
array lives), memory freed under a live array (the device destroyed first, or only the original array dropped while
a view lives), staging buffers piling up after their arrays die, and a bad read that changes something.  Both
backends keep the contract (a writable array of its own that later work never changes); the wgpu backend's pool is
checked directly.
"""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper

import ortgpu
import ortgpu_core
from ortgpu_core._errors import ValidationError
from ortgpu_core.backends._wgpu_mapped_reads import POOLED_LARGE
from ortgpu_core.backends.protocol import MAPPED_READ_MIN
from ortgpu_core.backends.wgpu_native import WgpuBackend, WgpuDevice

LARGE = MAPPED_READ_MIN // 4  # float32 elements: exactly the threshold


def _pattern(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(count).astype(np.float32)


@pytest.mark.parametrize("count", [LARGE - 1, LARGE, LARGE + 3])
def test_to_numpy_is_right_writable_and_never_changes_after(env: ortgpu_core.Env, count: int) -> None:
    value = env.shared_allocator().empty((count,), "float32")
    first_data, second_data = _pattern(count, 1), _pattern(count, 2)
    value.update_inplace(first_data)
    first = value.to_numpy()
    value.update_inplace(second_data)
    second = value.to_numpy()  # a second read while the first array lives: another staging buffer
    mappings = getattr(env.default_device._native_device(), "_mappings", None)  # the wgpu backend's
    if mappings is not None:
        assert len(mappings.held) == (2 if count * 4 >= MAPPED_READ_MIN else 0)
    np.testing.assert_array_equal(first, first_data)
    np.testing.assert_array_equal(second, second_data)
    assert first.flags.writeable and second.flags.writeable
    first[:4] = 7.0  # the caller's own memory: writing it changes neither the value nor the other array
    np.testing.assert_array_equal(value.to_numpy()[:4], second_data[:4])
    np.testing.assert_array_equal(second[:4], second_data[:4])
    value.release()


def test_odd_byte_counts_and_shapes(env: ortgpu_core.Env) -> None:
    """A read that is not a multiple of 4 bytes, in a shape of several axes."""
    shape = (3, MAPPED_READ_MIN // 3 + 1)  # uint8: 3 rows, the total not a multiple of 4
    data = (np.arange(shape[0] * shape[1]) % 251).astype(np.uint8).reshape(shape)
    value = env.shared_allocator().empty(shape, "uint8")
    value.update_inplace(data)
    out = value.to_numpy()
    assert out.shape == shape and out.dtype == np.uint8
    np.testing.assert_array_equal(out, data)
    value.release()


def test_a_slice_keeps_the_mapping_alive(env: ortgpu_core.Env) -> None:
    value = env.shared_allocator().empty((LARGE,), "float32")
    data = _pattern(LARGE, 3)
    value.update_inplace(data)
    tail = value.to_numpy()[-16:]  # the full array is dropped at once; the slice holds its memory
    gc.collect()
    value.update_inplace(_pattern(LARGE, 4))
    value.to_numpy()  # a read that would reuse a returned buffer
    np.testing.assert_array_equal(tail, data[-16:])
    value.release()


def test_a_session_output_is_handed_over_and_stays(env: ortgpu_core.Env) -> None:
    """A run's large output (the path a decoder's logits take): right, and unchanged by the next run."""
    rows = LARGE // 64
    graph = helper.make_graph(
        [helper.make_node("Mul", ["X", "S"], ["Y"])],
        "scale",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [rows, 64])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [rows, 64])],
        [helper.make_tensor("S", TensorProto.FLOAT, [], [2.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x1, x2 = _pattern(rows * 64, 5).reshape(rows, 64), _pattern(rows * 64, 6).reshape(rows, 64)
    with ortgpu.InferenceSession(model.SerializeToString(), env=env) as session:
        (y1,) = session.run(None, {"X": x1})
        (y2,) = session.run(None, {"X": x2})
    np.testing.assert_array_equal(y1, x1 * 2)
    np.testing.assert_array_equal(y2, x2 * 2)


@pytest.mark.parametrize("backend_name", ["fake", "wgpu"])
def test_bad_reads_are_refused_and_change_nothing(backend_name: str) -> None:
    from test_ops_elementwise import open_device

    backend_device = open_device(backend_name)
    try:
        buffer = backend_device.create_buffer(64, label="src")
        backend_device.write_buffer(buffer, 0, np.arange(16, dtype=np.float32).tobytes())
        for offset, size in ((2, 8), (-4, 8), (0, 68), (60, 8), (0, -1)):
            with pytest.raises(ValidationError):
                backend_device.read_buffer_mapped(buffer, offset, size)
        with pytest.raises(ValidationError):
            backend_device.read_buffer_mapped(buffer + 999_999, 0, 4)
        held = backend_device.read_buffer_mapped(buffer, 8, 10)  # a size not a multiple of 4 is fine
        assert bytes(held) == np.arange(16, dtype=np.float32).tobytes()[8:18]
        assert len(backend_device.read_buffer_mapped(buffer, 0, 0)) == 0
        del held
        backend_device.destroy_buffer(buffer)
    finally:
        backend_device.destroy()


# -- the wgpu backend's pool ------------------------------------------------------------------------


def _large_buffer(device: WgpuDevice, seed: int) -> tuple[int, bytes]:
    data = _pattern(LARGE, seed).tobytes()
    buffer = device.create_buffer(len(data), label="large")
    device.write_buffer(buffer, 0, data)
    return buffer, data


def _held(device: WgpuDevice) -> int:
    return len(device._mappings.held)


def test_held_buffers_leave_the_pool_and_come_back_bounded(wgpu_device: WgpuDevice) -> None:
    buffer, data = _large_buffer(wgpu_device, 7)
    arrays = [np.frombuffer(wgpu_device.read_buffer_mapped(buffer, 0, len(data)), np.uint8) for _ in range(5)]
    assert _held(wgpu_device) == 5
    held_addresses = set(wgpu_device._mappings.held)
    assert not held_addresses & {s.address for s in wgpu_device._staging_free}  # never lent twice
    for array in arrays:
        assert array.tobytes() == data
    del arrays, array
    gc.collect()
    assert len(wgpu_device._mappings.returned) == 5  # queued by the finalizers, taken at the next read
    wgpu_device.read_buffer(buffer, 0, 4)
    assert _held(wgpu_device) == 0 and not wgpu_device._mappings.returned
    large_free = [s for s in wgpu_device._staging_free if s.size >= MAPPED_READ_MIN]
    assert len(large_free) <= POOLED_LARGE
    assert len(wgpu_device._staging_all) == len(wgpu_device._staging_free)  # the rest were freed, none lost
    wgpu_device.destroy_buffer(buffer)


def test_an_array_outlives_its_device(wgpu_backend: WgpuBackend) -> None:
    device = wgpu_backend.open_device(wgpu_backend.default_adapter_index())
    buffer, data = _large_buffer(device, 8)
    array = np.frombuffer(device.read_buffer_mapped(buffer, 0, len(data)), np.float32)
    device.destroy()
    assert device.destroyed
    np.testing.assert_array_equal(array, np.frombuffer(data, np.float32))  # still mapped: the device skipped it
    array[:3] = 1.0
    mappings = device._mappings
    assert mappings.held
    del device  # the Python device goes first: its error record must outlive the native device (the views keep it)
    gc.collect()
    np.testing.assert_array_equal(array[3:], np.frombuffer(data, np.float32)[3:])
    del array
    gc.collect()
    assert not mappings.held  # released by the finalizer itself


def test_a_held_read_takes_no_oversized_or_named_buffer(wgpu_device: WgpuDevice) -> None:
    """A read handed over keeps its buffer for the array's life: not a free one four times its size, nor the one a
    frozen list's reads name (that list would lose its command buffer encoded ahead)."""
    buffer, data = _large_buffer(wgpu_device, 10)
    with wgpu_device._lock:
        oversized = wgpu_device._take_staging(4 * len(data))
        named = wgpu_device._take_staging(len(data))
        wgpu_device._give_back_staging(oversized)
        wgpu_device._give_back_staging(named)
        wgpu_device._list_staging[12345] = named.address  # as submit_and_read of a frozen list records it
    try:
        held = wgpu_device.read_buffer_mapped(buffer, 0, len(data))
        (address,) = wgpu_device._mappings.held
        assert address not in (oversized.address, named.address)
        assert len(data) <= wgpu_device._staging_all[address].size <= 2 * len(data)
        assert {oversized.address, named.address} <= {s.address for s in wgpu_device._staging_free}  # none freed
        assert bytes(held) == data
        del held
    finally:
        wgpu_device._list_staging.pop(12345, None)
    wgpu_device.destroy_buffer(buffer)


def test_arrays_dropped_in_other_threads(wgpu_device: WgpuDevice) -> None:
    """Finalizers run in whichever thread drops the last view; the device takes the buffers back at its next read."""
    buffer, data = _large_buffer(wgpu_device, 9)
    arrays = [np.frombuffer(wgpu_device.read_buffer_mapped(buffer, 0, len(data)), np.uint8) for _ in range(4)]
    errors: list[BaseException] = []

    def drop(array: np.ndarray) -> None:
        try:
            assert array.tobytes() == data
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=drop, args=(arrays.pop(),)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    del threads
    gc.collect()
    assert not errors
    again = wgpu_device.read_buffer_mapped(buffer, 0, len(data))
    assert bytes(again) == data and _held(wgpu_device) == 1
    del again
    wgpu_device.destroy_buffer(buffer)
