"""Waiting for the GPU holds no lock another thread needs (issue 15, concurrent mode), on wgpu-native (lavapipe).

A read (``read_buffer``, ``read_buffer_into``, ``submit_and_read``) or ``wait_idle`` submits and requests under
the device's lock, waits for its request without it, and copies out under it again.  The tests stop a thread
*inside* its wait (``_wait_until``, and ``_wait_map`` for ``read_buffer_into``'s wait in C, are wrapped for that
thread only) and show that meanwhile another thread takes
the device's lock, and creates, uploads, submits and reads to completion; that the stopped wait then finishes
with the right data; that a device destroyed or lost during a wait gives that waiter a typed error (no hang, no
crash); and that many threads reading at once through the staging pool all get their own data.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterator

import numpy as np
import pytest
from helpers import SCALE_KERNEL

from ortgpu_core._errors import DeviceError, DeviceLostError, ReleasedValueError
from ortgpu_core.backends._commands import CommandList
from ortgpu_core.backends.protocol import BindingEntry
from ortgpu_core.backends.wgpu_native import WgpuBackend, WgpuDevice, load_native

pytestmark = pytest.mark.wgpu_only


@pytest.fixture
def device(waiting_backend: WgpuBackend) -> Iterator[WgpuDevice]:
    opened = waiting_backend.open_device(waiting_backend.default_adapter_index())
    yield opened
    opened.destroy()


class PausedWait:
    """Stops ``thread``'s next wait on ``device`` at its start until :meth:`resume` (other threads' waits run)."""

    def __init__(self, device: WgpuDevice) -> None:
        self.device = device
        self.entered = threading.Event()
        self.resumed = threading.Event()
        self.thread: threading.Thread | None = None
        original = device._wait_until
        original_map = device._wait_map

        def wait_until(done: Callable[[], bool], action: str) -> None:
            self._pause()
            original(done, action)

        def wait_map(wait: Any, action: str, blocked: bool = False) -> int:  # read_buffer_into's wait, in C
            self._pause()
            return original_map(wait, action, blocked)

        device._wait_until = wait_until  # type: ignore[method-assign]
        device._wait_map = wait_map  # type: ignore[method-assign]

    def _pause(self) -> None:
        if threading.current_thread() is self.thread and not self.entered.is_set():
            self.entered.set()
            assert self.resumed.wait(30), "the test never resumed the paused wait"

    def start(self, work: Callable[[], Any]) -> dict[str, Any]:
        result: dict[str, Any] = {}

        def run() -> None:
            try:
                result["value"] = work()
            except BaseException as error:  # noqa: BLE001 - handed to the test
                result["error"] = error

        self.thread = threading.Thread(target=run, name="paused-waiter")
        self.thread.start()
        assert self.entered.wait(30), "the waiter never reached its wait"
        return result

    def resume(self) -> None:
        self.resumed.set()
        assert self.thread is not None
        self.thread.join(60)
        assert not self.thread.is_alive(), "the paused waiter hung after it was resumed"


def _lock_is_free(device: WgpuDevice) -> bool:
    lock = device._lock._lock
    if lock.acquire(blocking=False):
        lock.release()
        return True
    return False


def _other_thread_round_trip(device: WgpuDevice) -> None:
    """What another session does meanwhile: create, upload, run a kernel, read back, release."""
    data = np.arange(128, dtype=np.float32)
    pipeline = device.create_compute_pipeline(SCALE_KERNEL, label="scale")
    x = device.create_buffer(data.nbytes)
    y = device.create_buffer(data.nbytes)
    group = device.create_bind_group(pipeline, [BindingEntry(0, x, 0, data.nbytes), BindingEntry(1, y, 0, data.nbytes)])
    try:
        device.write_buffer(x, 0, data.tobytes())
        commands = CommandList()
        commands.add_dispatch(pipeline, group, 2)
        out = np.empty_like(data)
        device.submit_and_read(commands, [(y, 0, out)])
        np.testing.assert_array_equal(out, data * 2 + 1)
        device.wait_idle()
        assert device.read_buffer(y, 0, 8) == (data[:2] * 2 + 1).tobytes()
    finally:
        device.release_bind_group(group)
        device.destroy_buffer(x)
        device.destroy_buffer(y)
        device.release_pipeline(pipeline)


@pytest.mark.parametrize("how", ["read_buffer", "read_buffer_into", "submit_and_read", "wait_idle"])
def test_a_waiting_thread_holds_no_lock_and_others_finish_meanwhile(device: WgpuDevice, how: str) -> None:
    values = np.arange(1000, dtype=np.float32) - 7.5
    buffer = device.create_buffer(values.nbytes)
    device.write_buffer(buffer, 0, values.tobytes())
    out = np.zeros_like(values)
    work: dict[str, Callable[[], Any]] = {
        "read_buffer": lambda: device.read_buffer(buffer, 0, values.nbytes),
        "read_buffer_into": lambda: device.read_buffer_into(buffer, 0, out),
        "submit_and_read": lambda: device.submit_and_read(CommandList(), [(buffer, 0, out)]),
        "wait_idle": device.wait_idle,
    }
    paused = PausedWait(device)
    result = paused.start(work[how])
    try:
        assert _lock_is_free(device), f"{how} holds the device's lock while it waits for the GPU"
        _other_thread_round_trip(device)  # a whole round trip of another thread, while this one waits
    finally:
        paused.resume()
    assert "error" not in result, result.get("error")
    if how == "read_buffer":
        np.testing.assert_array_equal(np.frombuffer(result["value"], np.float32), values)
    elif how != "wait_idle":
        np.testing.assert_array_equal(out, values)
    device.destroy_buffer(buffer)
    assert device.live_handles() == 0


def _reader(device: WgpuDevice, buffer: int, how: str) -> Callable[[], Any]:
    """A read of 4096 bytes of ``buffer`` by ``how``: read_buffer (Python wait) or read_buffer_into (C wait)."""
    if how == "read_buffer":
        return lambda: device.read_buffer(buffer, 0, 4096)
    return lambda: device.read_buffer_into(buffer, 0, np.empty(4096, np.uint8))


READS = pytest.mark.parametrize("how", ["read_buffer", "read_buffer_into"])


@READS
def test_destroying_the_device_during_a_wait_gives_the_waiter_a_typed_error(device: WgpuDevice, how: str) -> None:
    buffer = device.create_buffer(4096)
    paused = PausedWait(device)
    result = paused.start(_reader(device, buffer, how))
    device.destroy()  # takes the device's lock: the waiter does not hold it
    paused.resume()
    assert isinstance(result.get("error"), ReleasedValueError), result
    assert device.live_handles() == 0


@READS
def test_losing_the_device_during_a_wait_gives_the_waiter_device_lost(device: WgpuDevice, how: str) -> None:
    """The device is lost while a thread waits, and another thread's call finds out: the waiter gets
    DeviceLostError (it never touches the staging buffer of a lost device), and so does every later call."""
    buffer = device.create_buffer(4096)
    paused = PausedWait(device)
    result = paused.start(_reader(device, buffer, how))
    _, lib = load_native()
    with device._lock.exclusive():
        lib.wgpuDeviceDestroy(device._device)  # what a driver reset looks like from here
    with pytest.raises(DeviceLostError, match="lost"):
        device.create_buffer(64)  # another thread's call learns of the loss
    paused.resume()
    assert isinstance(result.get("error"), DeviceLostError), result
    for call in (lambda: device.read_buffer(buffer, 0, 4), device.wait_idle):
        with pytest.raises(DeviceLostError):
            call()


def test_many_threads_reading_at_once_each_get_their_own_data(device: WgpuDevice) -> None:
    """Eight threads, each with its own kernel and a frozen list it replays and reads (encode-ahead with a tail
    into its staging buffer), interleaved with plain reads of growing size (the pool replaces buffers) and
    wait_idle: every result is that thread's own, and nothing is left behind."""
    threads, rounds = 8, 25
    pipeline = device.create_compute_pipeline(SCALE_KERNEL, label="scale")
    failures: list[BaseException] = []
    start = threading.Barrier(threads)

    def worker(index: int) -> None:
        count = 64 * (index + 1)
        x = device.create_buffer(4 * count)
        y = device.create_buffer(4 * count)
        group = device.create_bind_group(pipeline, [BindingEntry(0, x, 0, 4 * count), BindingEntry(1, y, 0, 4 * count)])
        big = device.create_buffer(1 << (16 + index % 4))
        try:
            commands = CommandList()
            commands.add_dispatch(pipeline, group, (count + 63) // 64)
            commands.freeze()
            start.wait(30)
            for step in range(rounds):
                data = np.full(count, index * 1000 + step, np.float32)
                device.write_buffer(x, 0, data.tobytes())
                out = np.empty(count, np.float32)
                device.submit_and_read(commands, [(y, 0, out)])
                np.testing.assert_array_equal(out, data * 2 + 1)
                if step % 5 == index % 5:
                    marker = np.array([index, step], np.uint32)
                    device.write_buffer(big, device.buffer_size(big) - 8, marker.tobytes())
                    tail = device.read_buffer(big, 0, device.buffer_size(big))[-8:]
                    assert tail == marker.tobytes()
                if step % 7 == 0:
                    device.wait_idle()
        except BaseException as error:  # noqa: BLE001 - collected for the test
            failures.append(error)
        finally:
            del commands
            device.release_bind_group(group)
            for buffer in (x, y, big):
                device.destroy_buffer(buffer)

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(120)
    assert not any(thread.is_alive() for thread in pool), "a reader hung"
    assert not failures, failures[:3]
    device.release_pipeline(pipeline)
    assert device.live_handles() == 0
    assert len(device._staging_all) <= threads  # at most one staging buffer per thread reading at once
    assert len(device._staging_free) == len(device._staging_all)  # every one given back


@pytest.mark.parametrize("how", ["read_buffer", "submit_and_read"])
def test_a_failed_request_is_raised_to_its_caller_only(device: WgpuDevice, how: str) -> None:
    """A read whose map request fails gives that caller a DeviceError; its staging buffer is not reused, and
    the next read works."""
    buffer = device.create_buffer(256)
    device.write_buffer(buffer, 0, bytes(range(256)))
    original = device._copy_out_mapped
    failed: list[int] = []

    def failing(staging: Any, status: int, *rest: Any) -> None:
        failed.append(staging.address)
        original(staging, 3, *rest)  # WGPUMapAsyncStatus_Error, as wgpu-native would report it

    device._copy_out_mapped = failing  # type: ignore[method-assign]
    out = np.empty(256, np.uint8)
    read: Callable[[], object] = (
        (lambda: device.read_buffer(buffer, 0, 256))
        if how == "read_buffer"
        else (lambda: device.submit_and_read(CommandList(), [(buffer, 0, out)]))
    )
    with pytest.raises(DeviceError, match="mapping the staging buffer failed"):
        read()
    device._copy_out_mapped = original  # type: ignore[method-assign]
    assert failed and failed[0] not in device._staging_all  # freed, never reused
    assert device.read_buffer(buffer, 0, 256) == bytes(range(256))
    device.destroy_buffer(buffer)
    assert device.live_handles() == 0


def test_the_c_view_of_the_map_callback_descriptor_matches_webgpu_h() -> None:
    """_device_calls declares WGPUBufferMapCallbackInfo itself (it passes one by value): same size and layout
    as the installed header's, as cffi reads it."""
    from ortgpu_core.backends._device_calls import MAP_CALLBACK_INFO_SIZE

    ffi, _ = load_native()
    assert MAP_CALLBACK_INFO_SIZE == ffi.sizeof("WGPUBufferMapCallbackInfo") == 40
    assert [name for name, _ in ffi.typeof("WGPUBufferMapCallbackInfo").fields] == [
        "nextInChain",
        "mode",
        "callback",
        "userdata1",
        "userdata2",
    ]
    assert ffi.offsetof("WGPUBufferMapCallbackInfo", "callback") == 16
    # and WGPUQueueWorkDoneCallbackInfo, which request_work_done passes by value
    from ortgpu_core.backends._device_calls import WORK_DONE_CALLBACK_INFO_SIZE

    assert WORK_DONE_CALLBACK_INFO_SIZE == ffi.sizeof("WGPUQueueWorkDoneCallbackInfo") == 40
    assert [name for name, _ in ffi.typeof("WGPUQueueWorkDoneCallbackInfo").fields] == [
        "nextInChain",
        "mode",
        "callback",
        "userdata1",
        "userdata2",
    ]


@READS
def test_a_device_destroyed_behind_the_library_during_a_wait_is_device_lost(device: WgpuDevice, how: str) -> None:
    """wgpu-native 29 completes a pending map of a destroyed device as a success (and would abort the process on
    reading the mapping): the waiter sees DeviceLostError instead, with nothing else telling it first."""
    buffer = device.create_buffer(4096)
    paused = PausedWait(device)
    result = paused.start(_reader(device, buffer, how))
    _, lib = load_native()
    with device._lock.exclusive():
        lib.wgpuDeviceDestroy(device._device)
    paused.resume()
    assert isinstance(result.get("error"), DeviceLostError), result
    with pytest.raises(DeviceLostError):
        device.wait_idle()


def _read_held_in_c(device: WgpuDevice, buffer: int, out: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """Start ``read_buffer_into`` in a thread while the caller holds the device's poll lock: nobody polls, so the
    read's map request cannot complete and the thread stays inside its C wait.  Returns once it is there."""
    result: dict[str, Any] = {}

    def read() -> None:
        try:
            device.read_buffer_into(buffer, 0, out)
            result["done"] = True
        except BaseException as error:  # noqa: BLE001 - handed to the test
            result["error"] = error

    thread = threading.Thread(target=read, name="reader-in-c")
    thread.start()
    for _ in range(10_000):
        if device._unlocked.inflight == 1:
            break
        threading.Event().wait(0.001)
    assert device._unlocked.inflight == 1, "the read never entered its C part"
    return thread, result


def test_destroying_the_device_while_a_read_waits_in_c_ends_that_wait(device: WgpuDevice) -> None:
    """The device's destroy closes the reads' C gate: a read waiting in C returns at once (no hang), gets
    ReleasedValueError, and nothing is freed before it left C."""
    buffer = device.create_buffer(4096)
    out = np.empty(4096, np.uint8)
    poll_lock = device._requests.poll_lock
    poll_lock.acquire()
    try:
        reader, result = _read_held_in_c(device, buffer, out)
        destroyer = threading.Thread(target=device.destroy, name="destroyer")
        destroyer.start()
        for _ in range(10_000):
            if device._unlocked.closed and device._unlocked.inflight == 0:
                break
            threading.Event().wait(0.001)
        assert device._unlocked.inflight == 0, "the read did not leave its C wait when the device was destroyed"
    finally:
        poll_lock.release()  # the destroy waits for it (a poll in progress) once the gate is empty
    destroyer.join(30)
    reader.join(30)
    assert not destroyer.is_alive() and not reader.is_alive()
    assert isinstance(result.get("error"), ReleasedValueError), result
    assert device.live_handles() == 0


def test_a_buffer_released_while_a_read_copies_from_it_is_freed_when_the_read_ends(device: WgpuDevice) -> None:
    """wgpu-native 29 aborts on a submission that uses a destroyed buffer, and a read's copy is encoded and
    submitted outside the device's lock: a buffer released meanwhile leaves the handle table at once (the handle
    is refused from then on) but is freed only when the read is done with it; the read returns its data."""
    values = np.arange(1024, dtype=np.float32)
    buffer = device.create_buffer(values.nbytes)
    device.write_buffer(buffer, 0, values.tobytes())
    out = np.zeros_like(values)
    poll_lock = device._requests.poll_lock
    poll_lock.acquire()
    try:
        reader, result = _read_held_in_c(device, buffer, out.view(np.uint8))
        device.destroy_buffer(buffer)
        assert device.live_handles() == 1  # released, not freed: the read still uses it
        with pytest.raises(Exception, match="not a live buffer"):
            device.read_buffer(buffer, 0, 4)
    finally:
        poll_lock.release()
    reader.join(30)
    assert not reader.is_alive()
    assert result.get("done"), result
    np.testing.assert_array_equal(out, values)
    assert device.live_handles() == 0


@pytest.mark.parametrize("how", ["submit", "submit_and_read"])
def test_a_replay_submit_refused_by_a_closing_device_raises_and_leaks_nothing(device: WgpuDevice, how: str) -> None:
    """A captured graph's replay submits its command buffer encoded ahead outside the device's lock; the device's
    destroy first closes the gate of such calls (and waits for those inside).  A submit that finds it closed
    raises ReleasedValueError and releases that command buffer: nothing is submitted to a device being freed,
    nothing leaks."""
    assert device.encode_ahead
    data = np.arange(128, dtype=np.float32)
    pipeline = device.create_compute_pipeline(SCALE_KERNEL, label="scale")
    x = device.create_buffer(data.nbytes)
    y = device.create_buffer(data.nbytes)
    group = device.create_bind_group(pipeline, [BindingEntry(0, x, 0, data.nbytes), BindingEntry(1, y, 0, data.nbytes)])
    device.write_buffer(x, 0, data.tobytes())
    commands = CommandList()
    commands.add_dispatch(pipeline, group, 2)
    commands.freeze()
    out = np.zeros_like(data)

    def replay() -> None:
        if how == "submit":
            device.submit(commands)
        else:  # the copies into the staging buffer ride in the command buffer encoded ahead
            device.submit_and_read(commands, [(y, 0, out)])

    replay()  # validated and submitted; its next command buffer is encoded ahead
    replay()  # that one, submitted outside the lock
    assert device.read_buffer(y, 0, data.nbytes) == (data * 2 + 1).tobytes()
    assert len(device._ahead) == 1
    device._close_unlocked_calls()  # the first step of destroy()
    with pytest.raises(ReleasedValueError, match="destroyed while submitting"):
        replay()
    assert not device._ahead and not device._jobs  # the command buffer was released, no encoding ahead queued
    device.destroy()
    assert device.live_handles() == 0


def test_the_poll_lock_behaves_like_a_threading_lock() -> None:
    """The poll lock is shared by the Python waits (threading.Lock's interface) and the C waits (a try-lock)."""
    from ortgpu_core.backends._unlocked_calls import NativeLock

    lock = NativeLock()
    assert not lock.locked()
    assert lock.acquire(blocking=False)
    assert lock.locked()
    assert not lock.acquire(blocking=False)  # not re-entrant
    taken = threading.Event()

    def other() -> None:
        with lock:  # blocks (releasing the GIL) until the owner releases
            taken.set()

    thread = threading.Thread(target=other)
    thread.start()
    assert not taken.wait(0.05)
    lock.release()
    thread.join(10)
    assert taken.is_set() and not lock.locked()
    with pytest.raises(RuntimeError, match="not held"):
        lock.release()


def test_a_destroy_under_the_lock_does_not_wait_forever_for_a_submission_held_back_by_that_lock(
    device: WgpuDevice,
) -> None:
    """A read's submission made outside the lock waits while another thread holds the lock; when that thread is
    the destroy, which waits for every call outside the lock to leave, the held-back submission gives up (nothing
    submitted) instead of both waiting for each other."""
    from ortgpu_core.backends._unlocked_calls import CLOSING, MapWait

    buffer = device.create_buffer(4096)
    with device._lock:
        staging = device._take_staging(4096)
    holding, inside, closed = threading.Event(), threading.Event(), threading.Event()
    codes: list[int] = []

    def destroyer() -> None:  # holds the device's lock exclusively, then closes the gate as destroy() does first
        with device._lock.exclusive():
            holding.set()
            assert inside.wait(30)
            device._close_unlocked_calls()
            closed.set()

    def submitter() -> None:  # a read's C part, held back by the lock
        codes.append(device._unlocked.copy_and_map(buffer, 0, staging.address, 4096, MapWait()))

    threads = [threading.Thread(target=destroyer, daemon=True), threading.Thread(target=submitter, daemon=True)]
    threads[0].start()
    assert holding.wait(30)
    threads[1].start()
    for _ in range(10_000):
        if device._unlocked.inflight == 1:
            break
        threading.Event().wait(0.001)
    inside.set()
    for thread in threads:
        thread.join(30)
    assert closed.is_set() and not any(thread.is_alive() for thread in threads), (
        "the destroy and the submission deadlocked"
    )
    assert codes == [CLOSING]
    device.destroy()
    assert device.live_handles() == 0
