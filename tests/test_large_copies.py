"""Large copies on wgpu-native: uploads through mapped staging buffers, reads in chunks, host copies on threads.

A write of at least ``STAGED_WRITE_MIN`` bytes (with host copies on 2 threads or more) is copied chunk by chunk into
staging buffers the device keeps mapped, each chunk's copy submitted on its own (:mod:`ortgpu_core.backends._wgpu_staged_writes`); a read of at
least ``CHUNKED_READ_MIN`` bytes is copied out chunk by chunk (:mod:`ortgpu_core.backends._wgpu_chunked_reads`).
The hazards: a chunk landing at the wrong place or with a stale staging buffer's bytes, writes reordered against
the queue writes around them, pools that grow without bound, a failure half-way that leaks or reuses a staging
buffer whose map may still complete, and a destroy with map requests in flight.
"""

from __future__ import annotations

import threading
from typing import Iterator

import numpy as np
import pytest

from ortgpu_core._errors import DeviceError, ValidationError
from ortgpu_core.backends import _host_copy
from ortgpu_core.backends import _wgpu_staged_writes as staged_writes
from ortgpu_core.backends._unlocked_calls import NOT_SUBMITTED
from ortgpu_core.backends._wgpu_chunked_reads import CHUNKED_READ_MIN, READ_CHUNK
from ortgpu_core.backends._wgpu_staged_writes import CHUNK, POOL_CHUNKS, STAGED_WRITE_MIN
from ortgpu_core.backends.wgpu_native import WgpuBackend, WgpuDevice


@pytest.fixture
def device(wgpu_backend: WgpuBackend) -> Iterator[WgpuDevice]:
    """A device of its own, with host copies on two threads (large writes are staged only then)."""
    previous = _host_copy.set_copy_threads(2)
    opened = wgpu_backend.open_device(wgpu_backend.default_adapter_index())
    try:
        yield opened
    finally:
        opened.destroy()
        _host_copy.set_copy_threads(previous)


@pytest.mark.wgpu_only
def test_writes_are_staged_from_the_minimum_size_and_with_threads_only(device: WgpuDevice) -> None:
    buffer = device.create_buffer(STAGED_WRITE_MIN)
    data = _words(STAGED_WRITE_MIN // 4, 9)
    before = device.staged_writes
    device.write_buffer(buffer, 4, data[:-1])  # one word short of the minimum: written by the queue
    assert device.staged_writes == before
    _host_copy.set_copy_threads(1)  # one thread: staging would only add copies
    device.write_buffer(buffer, 0, data)
    assert device.staged_writes == before
    _host_copy.set_copy_threads(2)
    device.write_buffer(buffer, 0, data[::-1].copy())
    assert device.staged_writes == before + 1
    np.testing.assert_array_equal(_read(device, buffer, data.nbytes), data[::-1])
    device.destroy_buffer(buffer)


def _words(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**32, count, dtype=np.uint32)


def _read(device: WgpuDevice, buffer: int, nbytes: int) -> np.ndarray:
    out = np.empty(nbytes // 4, np.uint32)
    device.read_buffer_into(buffer, 0, out)
    return out


@pytest.mark.wgpu_only
def test_a_large_write_lands_whole_in_chunks(device: WgpuDevice) -> None:
    words = (2 * CHUNK + CHUNK // 2 + 12) // 4  # two whole chunks and a partial one
    data = _words(words, 1)
    buffer = device.create_buffer(data.nbytes)
    before = device.staged_writes
    device.write_buffer(buffer, 0, data)
    assert device.staged_writes - before == 3
    np.testing.assert_array_equal(_read(device, buffer, data.nbytes), data)
    device.destroy_buffer(buffer)


@pytest.mark.wgpu_only
def test_a_write_at_an_offset_leaves_the_rest_of_the_buffer(device: WgpuDevice) -> None:
    total = 3 * CHUNK
    base = _words(total // 4, 2)
    buffer = device.create_buffer(total)
    device.write_buffer(buffer, 0, base)
    patch = _words(STAGED_WRITE_MIN // 4 + 5, 3)
    offset = CHUNK - 256  # straddles a chunk boundary of the destination
    device.write_buffer(buffer, offset, patch)
    expected = base.copy()
    expected[offset // 4 : offset // 4 + patch.size] = patch
    np.testing.assert_array_equal(_read(device, buffer, total), expected)
    device.destroy_buffer(buffer)


@pytest.mark.wgpu_only
def test_staged_and_queued_writes_land_in_program_order(device: WgpuDevice) -> None:
    size = 2 * CHUNK
    buffer = device.create_buffer(size)
    small = np.full(1024, 5, np.uint32)  # a queue write (below the staging size)
    large = _words(size // 4, 4)
    device.write_buffer(buffer, 0, small)  # queued, pending until the next submission
    device.write_buffer(buffer, 0, large)  # staged: its submissions run the pending write first
    device.write_buffer(buffer, 4096, small)  # queued after the staged copies
    expected = large.copy()
    expected[1024:2048] = 5
    np.testing.assert_array_equal(_read(device, buffer, size), expected)
    device.destroy_buffer(buffer)


@pytest.mark.wgpu_only
def test_the_pool_is_bounded_and_reused(device: WgpuDevice) -> None:
    size = (POOL_CHUNKS + 2) * CHUNK  # more chunks than the pool holds, in one write
    buffer = device.create_buffer(size)
    for seed in range(3):
        data = _words(size // 4, 10 + seed)
        device.write_buffer(buffer, 0, data)
        assert len(device._upload_ready) + len(device._upload_pending) <= POOL_CHUNKS
        np.testing.assert_array_equal(_read(device, buffer, size), data)
    # after a read's wait every request has completed: the next write finds its staging buffers mapped
    device._collect_uploads()
    assert not device._upload_pending and 1 <= len(device._upload_ready) <= POOL_CHUNKS
    device.destroy_buffer(buffer)


@pytest.mark.wgpu_only
def test_chunks_that_find_no_staging_buffer_are_queued(device: WgpuDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(staged_writes, "POOL_CHUNKS", 0)  # the pool full from the start
    size = 2 * CHUNK + 64
    buffer = device.create_buffer(size)
    data = _words(size // 4, 8)
    before = device.staged_writes
    device.write_buffer(buffer, 0, data)
    assert device.staged_writes == before
    np.testing.assert_array_equal(_read(device, buffer, size), data)
    device.destroy_buffer(buffer)


@pytest.mark.wgpu_only
def test_a_bad_large_write_is_refused_and_writes_nothing(device: WgpuDevice) -> None:
    buffer = device.create_buffer(2 * CHUNK)
    zeros = np.zeros(2 * CHUNK // 4, np.uint32)
    with pytest.raises(ValidationError, match="past the buffer"):
        device.write_buffer(buffer, 8, np.ones(2 * CHUNK // 4, np.uint32))
    with pytest.raises(ValidationError):
        device.write_buffer(buffer, 2, np.ones(STAGED_WRITE_MIN // 4, np.uint32))
    np.testing.assert_array_equal(_read(device, buffer, 2 * CHUNK), zeros)
    device.destroy_buffer(buffer)


@pytest.mark.wgpu_only
def test_a_destroy_with_map_requests_in_flight_is_clean(wgpu_backend: WgpuBackend) -> None:
    device = wgpu_backend.open_device(wgpu_backend.default_adapter_index())
    buffer = device.create_buffer(2 * CHUNK)
    previous = _host_copy.set_copy_threads(2)
    try:
        device.write_buffer(buffer, 0, _words(2 * CHUNK // 4, 6))
    finally:
        _host_copy.set_copy_threads(previous)
    assert device._upload_pending  # nothing polled since: the requests are in flight
    device.destroy()
    assert device.destroyed
    with pytest.raises(Exception, match="destroyed|released|closed"):
        device.write_buffer(buffer, 0, _words(2 * CHUNK // 4, 7))


@pytest.mark.wgpu_only
def test_large_writes_from_several_threads_each_land(device: WgpuDevice) -> None:
    size = CHUNK + CHUNK // 2
    buffers = [device.create_buffer(size) for _ in range(4)]
    datas = [_words(size // 4, 20 + i) for i in range(4)]
    errors: list[BaseException] = []

    def write(index: int) -> None:
        try:
            for _ in range(3):
                device.write_buffer(buffers[index], 0, datas[index])
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for buffer, data in zip(buffers, datas):
        np.testing.assert_array_equal(_read(device, buffer, size), data)
        device.destroy_buffer(buffer)


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("threads", [1, 2, 3, 4])
@pytest.mark.parametrize("size", [0, 1, 4096, 2 * _host_copy.MIN_SLICE - 1, 5 * _host_copy.MIN_SLICE + 77])
def test_host_copy_copies_every_byte_whatever_the_split(threads: int, size: int, streaming: bool) -> None:
    source = np.random.default_rng(size).integers(0, 256, size + 3, dtype=np.uint8)[3:]  # not 16-byte aligned
    padded = np.zeros(size + 64 + 5, np.uint8)
    destination = padded[5 : 5 + size]  # nor this; the guard bytes on both sides must stay zero
    previous = _host_copy.set_copy_threads(threads)
    was_streaming = _host_copy.set_streaming_stores(streaming)
    try:
        _host_copy.copy_bytes(destination, source)
    finally:
        _host_copy.set_copy_threads(previous)
        _host_copy.set_streaming_stores(was_streaming)
    np.testing.assert_array_equal(destination, source)
    assert not padded[:5].any() and not padded[5 + size :].any()


@pytest.mark.parametrize("on", [1, 0, None, "yes"])
def test_set_streaming_stores_takes_a_bool(on: object) -> None:
    before = _host_copy.streaming_stores()
    with pytest.raises(ValueError, match="set_streaming_stores"):
        _host_copy.set_streaming_stores(on)  # type: ignore[arg-type]
    assert _host_copy.streaming_stores() == before


@pytest.mark.parametrize("count", [0, 17, -1, 2.0, True, None])
def test_set_copy_threads_refuses_what_is_not_a_thread_count(count: object) -> None:
    before = _host_copy.copy_threads()
    with pytest.raises(ValueError, match="set_copy_threads"):
        _host_copy.set_copy_threads(count)  # type: ignore[arg-type]
    assert _host_copy.copy_threads() == before


def test_copy_bytes_refuses_mismatched_sizes() -> None:
    with pytest.raises(ValueError, match="copy_bytes"):
        _host_copy.copy_bytes(bytearray(8), b"123")


@pytest.mark.parametrize("cores, expected", [(1, 1), (2, 1), (4, 2), (8, 4), (64, 4), (None, None)])
def test_default_copy_threads(cores: int | None, expected: int | None) -> None:
    value = _host_copy.default_copy_threads(cores)
    assert 1 <= value <= 4
    if expected is not None:
        assert value == expected


@pytest.mark.wgpu_only
@pytest.mark.parametrize("warm", [False, True])
def test_a_large_write_to_a_lost_device_raises_a_typed_error(wgpu_backend: WgpuBackend, warm: bool) -> None:
    from ortgpu_core.backends._wgpu_ffi import load_native

    device = wgpu_backend.open_device(wgpu_backend.default_adapter_index())
    try:
        buffer = device.create_buffer(2 * CHUNK)
        if warm:  # staging buffers exist and are mapped
            device.write_buffer(buffer, 0, _words(2 * CHUNK // 4, 30))
            _read(device, buffer, 2 * CHUNK)
        _, lib = load_native()
        with device._lock.exclusive():  # what a driver reset leaves, behind the library's back
            lib.wgpuDeviceDestroy(device._device)
        with pytest.raises(DeviceError):
            device.write_buffer(buffer, 0, _words(2 * CHUNK // 4, 31))
            _read(device, buffer, 2 * CHUNK)
    finally:
        device.destroy()


# -- reads in chunks ----------------------------------------------------------------------------------------------


@pytest.mark.wgpu_only
@pytest.mark.parametrize("tail", [0, 4, 6])  # whole words, and a read ending inside the last word
def test_a_large_read_in_chunks_returns_every_byte(device: WgpuDevice, tail: int) -> None:
    size = 2 * READ_CHUNK + READ_CHUNK // 2 + 8
    data = _words(size // 4, 40)
    buffer = device.create_buffer(size)
    device.write_buffer(buffer, 0, data)
    assert CHUNKED_READ_MIN <= size - 8 + tail
    out = bytearray(size - 8 + tail)
    device.read_buffer_into(buffer, 0, out)
    assert bytes(out) == data.tobytes()[: len(out)]
    at = np.empty((size - 256) // 4, np.uint32)  # at an offset
    device.read_buffer_into(buffer, 256, at)
    np.testing.assert_array_equal(at, data[64:])
    device.destroy_buffer(buffer)


@pytest.mark.wgpu_only
def test_chunked_reads_reuse_their_staging_buffers(device: WgpuDevice) -> None:
    size = 3 * READ_CHUNK
    buffer = device.create_buffer(size)
    data = _words(size // 4, 41)
    device.write_buffer(buffer, 0, data)
    for _ in range(4):
        np.testing.assert_array_equal(_read(device, buffer, size), data)
        assert len(device._staging_all) == len(device._staging_free) <= 3
    device.destroy_buffer(buffer)


class FailingGate:
    """Stands in for the device's unlocked calls: the ``fail_at``-th copy_and_map reports NOT_SUBMITTED."""

    def __init__(self, inner: object, fail_at: int) -> None:
        self.inner = inner
        self.calls = 0
        self.fail_at = fail_at

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def copy_and_map(self, *args: object) -> int:
        self.calls += 1
        if self.calls == self.fail_at:
            return NOT_SUBMITTED
        return int(self.inner.copy_and_map(*args))  # type: ignore[attr-defined]


@pytest.mark.wgpu_only
@pytest.mark.parametrize("fail_at", [1, 2, 3])
def test_a_chunk_that_fails_ends_the_read_with_a_typed_error_and_no_leak(device: WgpuDevice, fail_at: int) -> None:
    size = 3 * READ_CHUNK
    buffer = device.create_buffer(size)
    data = _words(size // 4, 42)
    device.write_buffer(buffer, 0, data)
    gate = FailingGate(device._unlocked, fail_at)
    device._unlocked = gate  # type: ignore[assignment]
    try:
        with pytest.raises(DeviceError, match="could not encode"):
            _read(device, buffer, size)
    finally:
        device._unlocked = gate.inner  # type: ignore[assignment]
    # every staging buffer is back in the pool or freed; the source is not held busy; the next read is right
    assert len(device._staging_all) == len(device._staging_free)
    np.testing.assert_array_equal(_read(device, buffer, size), data)
    device.destroy_buffer(buffer)
    assert device.live_handles() == 0


@pytest.mark.wgpu_only
def test_large_reads_from_several_threads_each_land(device: WgpuDevice) -> None:
    size = 2 * READ_CHUNK + 4096
    buffers = [device.create_buffer(size) for _ in range(3)]
    datas = [_words(size // 4, 50 + i) for i in range(3)]
    for buffer, data in zip(buffers, datas):
        device.write_buffer(buffer, 0, data)
    errors: list[BaseException] = []

    def read(index: int) -> None:
        try:
            for _ in range(3):
                np.testing.assert_array_equal(_read(device, buffers[index], size), datas[index])
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=read, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for buffer in buffers:
        device.destroy_buffer(buffer)
