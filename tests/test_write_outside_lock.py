"""Uploads made outside the device's lock (issue 15's K=8 tail), on wgpu-native (lavapipe).

``WgpuDevice.write_buffer`` enters the gate of the native calls made outside the lock (``UnlockedCalls``) instead
of taking the lock, and makes the queue write without the GIL: at 8 threads on the H200 an upload otherwise waited
0.6-0.7 ms for the lock and for the submissions other threads made outside it (bench/RESULTS.md, threads).

The hazards these tests hold down: a write landing inside what a holder of the lock does (a buffer's destroy, a
test's simulated loss, any call), a write into a buffer destroyed under it (a use after free in wgpu-native), and
an error or a wrong result for a write that races a destroy or a device's close.  Every one of them would be a crash
or a silent wrong result, so each has its own test.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

import numpy as np
import pytest

from ortgpu_core._errors import ReleasedValueError, ValidationError
from ortgpu_core.backends.wgpu_native import WgpuBackend, WgpuDevice

pytestmark = pytest.mark.wgpu_only

NBYTES = 4096


@pytest.fixture
def backend(wgpu_backend: WgpuBackend) -> WgpuBackend:
    return wgpu_backend


@pytest.fixture
def device(backend: WgpuBackend) -> Iterator[WgpuDevice]:
    opened = backend.open_device(backend.default_adapter_index())
    yield opened
    opened.destroy()


class CountingGate:
    """Stands in for the device's unlocked calls and counts the writes made through the gate."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.entered = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def write_entered(self, *args: Any) -> None:
        self.entered += 1
        self.inner.write_entered(*args)


def _fill(value: int) -> bytes:
    return np.full(NBYTES // 4, value, np.uint32).tobytes()


def _read(device: WgpuDevice, buffer: int) -> np.ndarray:
    return np.frombuffer(device.read_buffer(buffer, 0, NBYTES), np.uint32)


def test_a_write_nobody_contends_goes_through_the_gate_and_lands(device: WgpuDevice) -> None:
    buffer = device.create_buffer(NBYTES)
    gate = CountingGate(device._unlocked)
    device._unlocked = gate  # type: ignore[assignment]
    try:
        device.write_buffer(buffer, 0, _fill(7))
        device.write_buffer(buffer, 256, np.full(64, 9, np.uint32))  # any buffer-protocol object, at an offset
        assert gate.entered == 2
        expected = np.full(NBYTES // 4, 7, np.uint32)
        expected[64:128] = 9
        np.testing.assert_array_equal(_read(device, buffer), expected)
        assert gate.inflight == 0  # every entry left the gate
    finally:
        device._unlocked = gate.inner
        device.destroy_buffer(buffer)


def test_a_write_waits_for_a_holder_of_the_lock(device: WgpuDevice) -> None:
    """While another thread holds the device's lock, a write does not land: it waits for the lock like any call
    (the holder still reads the old contents after giving the writer time to land), then lands."""
    buffer = device.create_buffer(NBYTES)
    device.write_buffer(buffer, 0, _fill(1))
    started, written = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            started.set()
            device.write_buffer(buffer, 0, _fill(2))
            written.set()
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    thread = threading.Thread(target=writer)
    with device._lock:
        thread.start()
        assert started.wait(30)
        time.sleep(0.2)  # time for a write that ignored the lock to land
        assert not written.is_set(), "the write returned while another thread held the device's lock"
        np.testing.assert_array_equal(_read(device, buffer), 1)  # (the lock is re-entrant: this thread reads)
    thread.join(30)
    assert not thread.is_alive() and not errors, errors
    np.testing.assert_array_equal(_read(device, buffer), 2)
    device.destroy_buffer(buffer)


class DestroyFirst(CountingGate):
    """The gate, with the buffer destroyed just before the write's entry (after the write looked the buffer up):
    the window a destroy on another thread can land in."""

    def __init__(self, inner: Any, device: WgpuDevice, buffer: int) -> None:
        super().__init__(inner)
        self.device, self.buffer = device, buffer

    def try_enter_write(self) -> bool:
        self.device._unlocked = self.inner  # once
        self.device.destroy_buffer(self.buffer)
        return bool(self.inner.try_enter_write())


def test_a_buffer_destroyed_between_the_lookup_and_the_entry_is_not_written(device: WgpuDevice) -> None:
    """Entered, the write checks that its buffer is still the one it looked up: else it is refused as a released
    buffer's (a write into the destroyed buffer would be a use after free in wgpu-native)."""
    buffer = device.create_buffer(NBYTES)
    gate = DestroyFirst(device._unlocked, device, buffer)
    device._unlocked = gate  # type: ignore[assignment]
    try:
        with pytest.raises(ValidationError, match="not a live buffer"):
            device.write_buffer(buffer, 0, _fill(4))
    finally:
        device._unlocked = gate.inner
    assert gate.entered == 0 and gate.inner.inflight == 0
    assert device.live_handles() == 0


def test_writes_racing_destroys_of_their_buffers_raise_typed_errors_only(device: WgpuDevice) -> None:
    """Threads write while another destroys and recreates the buffers they write: each write lands or raises the
    typed error of a released buffer (never a crash, never another error), and nothing leaks."""
    buffers = [device.create_buffer(NBYTES) for _ in range(4)]
    stop = threading.Event()
    outcomes = {"written": 0, "refused": 0}
    errors: list[BaseException] = []
    guard = threading.Lock()

    def writer(index: int) -> None:
        data = _fill(index)
        while not stop.is_set():
            try:
                device.write_buffer(buffers[index % len(buffers)], 0, data)
                key = "written"
            except ValidationError as error:  # the buffer was released: "not a live buffer"
                key = "refused"
                if "not a live buffer" not in str(error):
                    errors.append(error)
            except BaseException as error:  # noqa: BLE001 - reported by the test
                errors.append(error)
                return
            with guard:
                outcomes[key] += 1

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 1.5
        turn = 0
        while time.monotonic() < deadline:
            slot = turn % len(buffers)
            old, buffers[slot] = buffers[slot], device.create_buffer(NBYTES)
            device.destroy_buffer(old)
            turn += 1
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert not any(thread.is_alive() for thread in threads)
    assert not errors, errors[:3]
    assert outcomes["written"] > 0 and turn > 10, (outcomes, turn)
    for buffer in buffers:
        device.destroy_buffer(buffer)
    assert device.live_handles() == 0


def test_a_write_after_the_device_is_destroyed_is_refused(backend: WgpuBackend) -> None:
    device = backend.open_device(backend.default_adapter_index())
    buffer = device.create_buffer(NBYTES)
    device.destroy()
    with pytest.raises(ReleasedValueError, match="destroyed"):
        device.write_buffer(buffer, 0, _fill(3))


@pytest.mark.parametrize(
    ("offset", "size", "match"),
    [(2, 256, "multiple of 4"), (0, 6, "multiple of 4"), (NBYTES - 256, 512, "past the buffer"), (-4, 4, "multiple")],
)
def test_a_bad_write_is_refused_as_before(device: WgpuDevice, offset: int, size: int, match: str) -> None:
    buffer = device.create_buffer(NBYTES)
    device.write_buffer(buffer, 0, _fill(5))
    with pytest.raises(ValidationError, match=match):
        device.write_buffer(buffer, offset, b"\x01" * size)
    np.testing.assert_array_equal(_read(device, buffer), 5)  # nothing written
    device.destroy_buffer(buffer)
