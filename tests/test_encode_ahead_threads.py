"""Encoding ahead outside the device's lock (issue 15), on wgpu-native (lavapipe).

After a frozen list's submit, its next command buffer is encoded with the device's lock released; a release of a
handle the list names (or of the buffer its read tail copies into or from) cancels that encoding, or waits for it
when another thread is running it, so wgpu-native never encodes with a freed object.  Here one thread keeps
submitting (and submit_and_read-ing) lists while another releases their bind groups and buffers under them: every
submit either computes the right result or is refused with a ValidationError naming the released handle; nothing
crashes, and nothing is left behind.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator

import numpy as np
import pytest
from helpers import SCALE_KERNEL

from ortgpu_core._errors import OrtGpuError, ValidationError
from ortgpu_core.backends._commands import CommandList
from ortgpu_core.backends.protocol import BindingEntry
from ortgpu_core.backends.wgpu_native import WgpuBackend, WgpuDevice

pytestmark = pytest.mark.wgpu_only

COUNT = 256
TRIPLE_KERNEL = SCALE_KERNEL.replace("x[i] * 2.0 + 1.0", "x[i] * 3.0")


@pytest.fixture(scope="module")
def device() -> Iterator[WgpuDevice]:
    backend = WgpuBackend()
    opened = backend.open_device(backend.default_adapter_index())
    yield opened
    opened.destroy()
    backend.close()


def test_releases_racing_encodes_ahead(device: WgpuDevice) -> None:
    pipeline = device.create_compute_pipeline(SCALE_KERNEL, label="scale")
    before = device.live_handles()
    handoff: list[tuple[int, int, int, CommandList] | None] = []
    started = threading.Event()  # the submitter's first submit of the current lists succeeded
    ready = threading.Condition()
    failures: list[BaseException] = []
    outcomes = {"computed": 0, "refused": 0}
    rounds = 40

    def submitter() -> None:
        try:
            for _ in range(rounds):
                with ready:
                    ready.wait_for(lambda: bool(handoff), timeout=30)
                    item = handoff.pop(0)
                if item is None:
                    return
                started.clear()
                x, y, _, commands = item
                data = np.arange(COUNT, dtype=np.float32)
                for step in range(6):
                    try:
                        if step % 2:
                            out = np.empty(COUNT, np.float32)
                            device.submit_and_read(commands, [(y, 0, out)])
                            np.testing.assert_array_equal(out, data * 2 + 1)
                        else:
                            device.submit(commands)
                        outcomes["computed"] += 1
                        started.set()
                    except ValidationError as error:  # released under it by the other thread: refused
                        assert "not a live" in str(error) or "released" in str(error), error
                        outcomes["refused"] += 1
        except BaseException as error:  # noqa: BLE001 - reported by the test
            failures.append(error)

    thread = threading.Thread(target=submitter)
    thread.start()
    try:
        for index in range(rounds):
            x = device.create_buffer(4 * COUNT)
            y = device.create_buffer(4 * COUNT)
            device.write_buffer(x, 0, np.arange(COUNT, dtype=np.float32).tobytes())
            group = device.create_bind_group(
                pipeline, [BindingEntry(0, x, 0, 4 * COUNT), BindingEntry(1, y, 0, 4 * COUNT)]
            )
            commands = CommandList()
            commands.add_dispatch(pipeline, group, COUNT // 64)
            commands.freeze()
            with ready:
                handoff.append((x, y, group, commands))
                ready.notify_all()
            # release under the submitter once it is replaying (its encodes ahead in flight): the bind group first,
            # or a buffer it binds first (every other round)
            if not started.wait(30):
                pytest.fail(f"the submitter made no submission of round {index}; its failures: {failures[:3]}")
            started.clear()
            if index % 2:
                device.release_bind_group(group)
                device.destroy_buffer(x)
                device.destroy_buffer(y)
            else:
                device.destroy_buffer(y)
                device.release_bind_group(group)
                device.destroy_buffer(x)
            del commands
    finally:
        with ready:
            handoff.append(None)
            ready.notify_all()
        thread.join(120)
    assert not thread.is_alive(), "the submitter hung"
    assert not failures, failures[:3]
    assert outcomes["computed"] >= rounds and outcomes["refused"] > 0, outcomes
    device.wait_idle()
    assert not device._jobs  # every encoding ahead finished or was cancelled
    device.release_pipeline(pipeline)
    assert device.live_handles() == before - 1


def test_a_buffer_encoded_for_a_dead_list_is_never_submitted_for_a_new_one(device: WgpuDevice) -> None:
    """Command buffers encoded ahead are found by list id, and ids are reused once a list dies: a buffer left
    under an id whose list is gone is released, not submitted for the new list (which encodes its own)."""
    pipeline = device.create_compute_pipeline(SCALE_KERNEL, label="scale")
    triple = device.create_compute_pipeline(TRIPLE_KERNEL, label="triple")
    x = device.create_buffer(4 * COUNT)
    y = device.create_buffer(4 * COUNT)
    entries = [BindingEntry(0, x, 0, 4 * COUNT), BindingEntry(1, y, 0, 4 * COUNT)]
    group = device.create_bind_group(pipeline, entries)
    triple_group = device.create_bind_group(triple, entries)
    try:
        data = np.arange(COUNT, dtype=np.float32)
        device.write_buffer(x, 0, data.tobytes())
        first = CommandList()
        first.add_dispatch(pipeline, group, COUNT // 64)
        first.freeze()
        device.submit(first)  # validated, its next command buffer encoded ahead
        (key,) = [k for k in device._ahead if k[0] == id(first)]
        second = CommandList()  # other work: y = 3x (the planted buffer would compute 2x + 1)
        second.add_dispatch(triple, triple_group, COUNT // 64)
        second.freeze()
        # make the entry look as if `second` had reused `first`'s id (the release that should have dropped it
        # missed): its owner is `first`, not `second`
        device._ahead[(id(second), key[1])] = device._ahead.pop(key)
        device._ahead_lists[(id(second), key[1])] = device._ahead_lists.pop(key)
        device._remember_validation(second)
        before = device.live_handles()
        out = np.empty(COUNT, np.float32)
        device.submit_and_read(second, [(y, 0, out)])  # a different tail: nothing popped yet
        np.testing.assert_array_equal(out, data * 3)
        device.write_buffer(y, 0, bytes(4 * COUNT))
        device.submit(second)  # pops the planted entry: released, not submitted; encoded afresh
        assert device.live_handles() == before + 1  # the planted one gone, the two keys of `second` encoded
        device.wait_idle()
        np.testing.assert_array_equal(np.frombuffer(device.read_buffer(y, 0, 4 * COUNT), np.float32), data * 3)
        del first, second
    finally:
        device.release_bind_group(group)
        device.release_bind_group(triple_group)
        device.destroy_buffer(x)
        device.destroy_buffer(y)
        device.release_pipeline(pipeline)
        device.release_pipeline(triple)


def test_a_list_read_from_two_threads_keeps_using_what_was_encoded_ahead(device: WgpuDevice) -> None:
    """submit_and_read's command buffer encoded ahead names the staging buffer its copies go to.  A list read by
    one thread, then another (a graph replayed from a pool of threads), takes the staging buffer of its last read
    when it is free, not the calling thread's own, so what was encoded ahead keeps matching: one entry for the
    list, never one per thread."""
    pipeline = device.create_compute_pipeline(SCALE_KERNEL, label="scale")
    x = device.create_buffer(4 * COUNT)
    y = device.create_buffer(4 * COUNT)
    group = device.create_bind_group(pipeline, [BindingEntry(0, x, 0, 4 * COUNT), BindingEntry(1, y, 0, 4 * COUNT)])
    data = np.arange(COUNT, dtype=np.float32)
    device.write_buffer(x, 0, data.tobytes())
    commands = CommandList()
    commands.add_dispatch(pipeline, group, COUNT // 64)
    commands.freeze()

    def take_and_give_back() -> None:  # a staging buffer of the pool owned by the calling thread
        with device._lock:
            device._give_back_staging(device._take_staging(4 * COUNT))

    def read() -> None:
        out = np.empty(COUNT, np.float32)
        device.submit_and_read(commands, [(y, 0, out)])
        np.testing.assert_array_equal(out, data * 2 + 1)

    def in_thread(work: Any) -> None:
        failures: list[BaseException] = []

        def run() -> None:
            try:
                work()
            except BaseException as error:  # noqa: BLE001 - reported below
                failures.append(error)

        thread = threading.Thread(target=run)
        thread.start()
        thread.join(60)
        assert not thread.is_alive() and not failures, failures

    try:
        with device._lock:  # two staging buffers in the pool: one this thread's, one another thread's
            mine = device._take_staging(4 * COUNT)
        in_thread(take_and_give_back)
        with device._lock:
            device._give_back_staging(mine)
        assert len(device._staging_free) >= 2
        for turn in range(8):
            if turn % 2:
                in_thread(read)
            else:
                read()
        device.wait_idle()
        keys = [key for key in device._ahead if key[0] == id(commands)]
        assert len(keys) == 1, keys  # one staging buffer for the list's reads, whichever thread made them
    finally:
        device.release_bind_group(group)
        device.destroy_buffer(x)
        device.destroy_buffer(y)
        device.release_pipeline(pipeline)


def test_encode_next_encodes_the_named_list_ahead_instead_of_the_submitted_one(device: WgpuDevice) -> None:
    """``submit(a, encode_next=b)``: the command buffer encoded ahead after the submit is ``b``'s (validated then,
    if it was not yet), not ``a``'s; each list still computes its own result, with or without a
    command buffer encoded ahead, and nothing is left behind."""
    pipeline = device.create_compute_pipeline(SCALE_KERNEL, label="scale")
    triple = device.create_compute_pipeline(TRIPLE_KERNEL, label="triple")
    x = device.create_buffer(4 * COUNT)
    y = device.create_buffer(4 * COUNT)
    entries = [BindingEntry(0, x, 0, 4 * COUNT), BindingEntry(1, y, 0, 4 * COUNT)]
    groups = [device.create_bind_group(pipeline, entries), device.create_bind_group(triple, entries)]
    before = device.live_handles()
    try:
        data = np.arange(COUNT, dtype=np.float32)
        device.write_buffer(x, 0, data.tobytes())
        scale, times3 = CommandList(), CommandList()
        scale.add_dispatch(pipeline, groups[0], COUNT // 64)
        times3.add_dispatch(triple, groups[1], COUNT // 64)
        scale.freeze()
        times3.freeze()
        out = np.empty(COUNT, np.float32)

        def ahead_for() -> set[int]:
            device.wait_idle()  # (no encoding ahead is running once the submits returned)
            return {list_id for list_id, _ in device._ahead}

        device.submit(times3, encode_next=scale)  # both validated now (scale by the hint), scale encoded ahead
        assert ahead_for() == {id(scale)}
        device.submit(scale, encode_next=times3)  # scale's buffer encoded ahead is used, times3's encoded next
        assert ahead_for() == {id(times3)}
        device.read_buffer_into(y, 0, out)
        np.testing.assert_array_equal(out, data * 2 + 1)
        device.submit(times3, encode_next=scale)  # times3's buffer encoded ahead is used; scale's is encoded next
        assert ahead_for() == {id(scale)}
        device.read_buffer_into(y, 0, out)
        np.testing.assert_array_equal(out, data * 3)
        device.submit(scale, encode_next=times3)
        assert ahead_for() == {id(times3)}
        device.read_buffer_into(y, 0, out)
        np.testing.assert_array_equal(out, data * 2 + 1)
        with pytest.raises(ValidationError, match="encode_next must be a CommandList or None"):
            device.submit(scale, encode_next="times3")  # type: ignore[arg-type]
        assert ahead_for() == {id(times3)}  # the refused submit changed nothing
        del scale, times3  # their buffers encoded ahead go with them
        assert device.live_handles() == before
    finally:
        for group in groups:
            device.release_bind_group(group)
        device.destroy_buffer(x)
        device.destroy_buffer(y)
        device.release_pipeline(pipeline)
        device.release_pipeline(triple)


def test_a_hinted_list_that_fails_validation_is_not_encoded_and_its_own_submit_raises(device: WgpuDevice) -> None:
    """``submit(a, encode_next=b)`` where ``b`` names a released bind group: ``a`` is submitted and computes its
    result (the hint is dropped: ``a``'s own next buffer is encoded ahead), and ``b``'s own submit raises the
    typed error, changing nothing."""
    pipeline = device.create_compute_pipeline(SCALE_KERNEL, label="scale")
    x = device.create_buffer(4 * COUNT)
    y = device.create_buffer(4 * COUNT)
    entries = [BindingEntry(0, x, 0, 4 * COUNT), BindingEntry(1, y, 0, 4 * COUNT)]
    group = device.create_bind_group(pipeline, entries)
    released = device.create_bind_group(pipeline, entries)
    before = device.live_handles()
    try:
        data = np.arange(COUNT, dtype=np.float32)
        device.write_buffer(x, 0, data.tobytes())
        good, bad = CommandList(), CommandList()
        good.add_dispatch(pipeline, group, COUNT // 64)
        bad.add_dispatch(pipeline, released, COUNT // 64)
        good.freeze()
        bad.freeze()
        device.release_bind_group(released)
        device.submit(good, encode_next=bad)
        device.wait_idle()
        assert {list_id for list_id, _ in device._ahead} == {id(good)}
        out = np.empty(COUNT, np.float32)
        device.read_buffer_into(y, 0, out)
        np.testing.assert_array_equal(out, data * 2 + 1)
        with pytest.raises(OrtGpuError, match="bind_group"):
            device.submit(bad)
        del good, bad
        assert device.live_handles() == before - 1  # (the released group)
    finally:
        device.release_bind_group(group)
        device.destroy_buffer(x)
        device.destroy_buffer(y)
        device.release_pipeline(pipeline)
