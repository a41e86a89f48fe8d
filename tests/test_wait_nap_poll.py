"""A wait for the GPU never makes a blocking poll before its spin and its nap window are over (issue 15).

wgpu-native 29's blocking poll (``wgpuDevicePoll(wait=true)``) holds the device's fence lock until the GPU has
finished everything submitted before it, and ``wgpuQueueSubmit`` needs that lock: every other thread's submission
waits behind such a poll and the GPU runs dry meanwhile (on the H200 with 8 threads replaying, the cause of steps
taking over 3 ms; bench/RESULTS.md, threads).  So a wait, after its spin, polls without blocking and sleeps
between polls for ``nap_poll_s`` (1 s by default), and only then blocks in the driver (a device lost without its
callback is still found then).

These tests count the blocking polls (``WgpuDevice.blocking_polls``) of waits on work that outlasts the spin (a
kernel that loops, on lavapipe): none within the nap window for each kind of wait (a read in C, a read ahead, a
``wait_idle`` in Python, several threads waiting at once), and the results are right; with the nap window set to 0
the same waits do block (the counter sees them: the tests would fail if the nap phase were removed).
"""

from __future__ import annotations

import threading
from typing import Callable, Iterator

import numpy as np
import pytest
from helpers import FrozenKernel

from ortgpu_core._errors import InvalidArgumentError
from ortgpu_core.backends.wgpu_native import WgpuBackend, WgpuDevice

pytestmark = pytest.mark.wgpu_only

N = 1024
NBYTES = N * 4

#: Each invocation adds 1.0 ``x[0]`` times (a count read at run time, so the loop is not folded): y[i] = x[0] + i.
LOOP_KERNEL = """
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < arrayLength(&y)) {
        var acc = f32(i);
        let count = u32(x[0]);
        for (var k = 0u; k < count; k = k + 1u) {
            acc = acc + 1.0;
        }
        y[i] = acc;
    }
}
"""

#: Additions per invocation: with N invocations, tens of milliseconds of work on lavapipe, far past any spin
#: (lavapipe spins 0).  (llvmpipe ends a loop after 65535 iterations.)
COUNT = 60_000


@pytest.fixture
def device(waiting_backend: WgpuBackend) -> Iterator[WgpuDevice]:
    opened = waiting_backend.open_device(waiting_backend.default_adapter_index())
    opened.set_nap_poll(60.0)  # the tests' work always ends inside it, however slow the machine
    yield opened
    opened.destroy()


class Loop(FrozenKernel):
    """y[i] = count + i, computed by ``count`` additions per invocation."""

    def __init__(self, device: WgpuDevice) -> None:
        super().__init__(device, LOOP_KERNEL, N, "loop")

    def submit(self, count: int, read_ahead: bool = False) -> None:  # type: ignore[override]
        super().submit(np.full(N, count, np.float32), read_ahead)

    @staticmethod
    def expected(count: int) -> np.ndarray:
        return np.arange(N, dtype=np.float32) + count


def _read(loop: Loop) -> np.ndarray:
    loop.submit(COUNT)
    return loop.read()  # a copy submitted and mapped in C, then waited for in C


def _read_ahead(loop: Loop) -> np.ndarray:
    loop.submit(COUNT, read_ahead=True)
    return loop.read()  # the copy rode in the submission: map and wait in one C call


def _wait_idle(loop: Loop) -> np.ndarray:
    loop.submit(COUNT)
    loop.device.wait_idle()  # waited for in Python (work-done callback)
    return loop.read()


WAITS: dict[str, Callable[[Loop], np.ndarray]] = {"read": _read, "read_ahead": _read_ahead, "wait_idle": _wait_idle}


@pytest.mark.parametrize("kind", sorted(WAITS))
def test_a_wait_makes_no_blocking_poll_inside_its_nap_window(device: WgpuDevice, kind: str) -> None:
    loop = Loop(device)
    try:
        WAITS[kind](loop)  # the first submit validates and warms up
        before = device.blocking_polls
        for _ in range(2):
            np.testing.assert_array_equal(WAITS[kind](loop), Loop.expected(COUNT))
        assert device.blocking_polls == before, f"{kind}: a wait blocked in the driver inside its nap window"
    finally:
        loop.release()
    assert device.live_handles() == 0


@pytest.mark.parametrize("kind", ["read_ahead", "wait_idle"])
def test_without_a_nap_window_the_same_wait_blocks(device: WgpuDevice, kind: str) -> None:
    """The counter sees blocking polls: with ``nap_poll_s`` 0 (and no spin) a wait blocks in the driver.
    (Not the plain read: on lavapipe the read's own copy submission returns only once the work before it is done,
    so its wait may end inside a spin.)"""
    loop = Loop(device)
    try:
        WAITS[kind](loop)
        device.set_nap_poll(0)
        device.spin_wait_us = 0.0  # (a GPU finishes this work inside its default spin)
        before = device.blocking_polls
        np.testing.assert_array_equal(WAITS[kind](loop), Loop.expected(COUNT))
        assert device.blocking_polls > before
    finally:
        loop.release()


def test_threads_waiting_at_once_make_no_blocking_poll(device: WgpuDevice) -> None:
    """Four threads, each submitting its own looping work and reading it (all three kinds of wait), at once: the
    poller hands over between them, nobody blocks in the driver, and each gets its own result."""
    loops = [Loop(device) for _ in range(4)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(loops))

    def work(index: int) -> None:
        loop, count = loops[index], COUNT + 1000 * index - 3000
        try:
            start.wait(30)
            for step in range(3):
                kind = sorted(WAITS)[(index + step) % len(WAITS)]
                loop.submit(count, read_ahead=kind == "read_ahead")
                if kind == "wait_idle":
                    device.wait_idle()
                np.testing.assert_array_equal(loop.read(), Loop.expected(count))
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    try:
        _read(loops[0])
        before = device.blocking_polls
        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(loops))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads), "a waiting thread hung"
        assert not errors, errors
        assert device.blocking_polls == before
    finally:
        for loop in loops:
            loop.release()


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan"), True, "1"])
def test_set_nap_poll_refuses_what_is_not_a_finite_number_of_seconds(device: WgpuDevice, bad: object) -> None:
    before = device.nap_poll_s
    with pytest.raises(InvalidArgumentError, match="set_nap_poll takes a finite number of seconds"):
        device.set_nap_poll(bad)  # type: ignore[arg-type]
    assert device.nap_poll_s == before
