"""Reads ahead (issue 15's throughput): a submission names the ranges a read may ask for next, the wgpu backend
copies them in that submission, and a read of them then submits nothing; but a read always returns the buffer's
current contents, whatever wrote it since.

The hazard these tests hold down: a read served from a copy made before a later write (a stale result).  Each
writer a device has (a queue write, another list's dispatch, a copy, a clear, ``submit_and_read``'s list, a
profiling ring's read) is made after a read ahead, then the read must return what the writer wrote; removing the
stale marking of any of them fails its test.  Also: reads of a fresh range make no submission (a spy on the
device's unlocked calls), replays nobody reads stop copying, a read that maps the copy while a replay is
submitted, releases and destroys during such a read, bad ranges refused on both backends, and the public path
(``replay()`` + ``to_numpy()``) with writes into a captured graph's output from other sessions.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pytest
from helpers import SCALE_KERNEL, FrozenKernel

import ortgpu
from ortgpu_core._errors import ReleasedValueError, ValidationError
from ortgpu_core.backends._commands import CommandList
from ortgpu_core.backends._wgpu_chunked_reads import CHUNKED_READ_MIN
from ortgpu_core.backends.protocol import BindingEntry
from ortgpu_core.backends.wgpu_native import WgpuBackend, WgpuDevice

N = 256
NBYTES = N * 4


@pytest.fixture
def backend(wgpu_backend: WgpuBackend) -> WgpuBackend:
    return wgpu_backend


@pytest.fixture
def device(backend: WgpuBackend) -> Iterator[WgpuDevice]:
    opened = backend.open_device(backend.default_adapter_index())
    yield opened
    opened.destroy()


class Spy:
    """Stands in for the device's unlocked calls and counts the ones that submit or map."""

    COUNTED = ("copy_and_map", "read_mapped", "submit_encoded", "submit_and_map")

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[str] = []
        self.hold: Callable[[str], None] = lambda name: None  # runs before each counted call

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if name not in self.COUNTED:
            return attribute

        def counted(*args: Any) -> Any:
            self.calls.append(name)
            self.hold(name)
            return attribute(*args)

        return counted

    def take(self) -> list[str]:
        calls, self.calls = self.calls, []
        return calls


class Scale(FrozenKernel):
    """y = 2x + 1 on the device, as a frozen (captured-like) list, with ``y`` read ahead."""

    def __init__(self, device: WgpuDevice) -> None:
        super().__init__(device, SCALE_KERNEL, N, "scale")
        self.spy = Spy(device._unlocked)
        device._unlocked = self.spy  # type: ignore[assignment]

    def replay(self, x: np.ndarray) -> None:
        self.submit(x)


def test_a_command_list_names_the_watched_buffers_it_may_write() -> None:
    """``CommandList.written_among``: the writable buffers of each dispatch's bind group, copy and resolve
    destinations and cleared buffers, limited to the watched ones; sources and read-only bindings are not writes."""
    commands = CommandList()
    commands.add_dispatch(11, 101, 1)  # bind group 101 writes buffer 7
    commands.add_dispatch(11, 102, 1)  # bind group 102 writes nothing watched
    commands.add_copy(8, 0, 9, 0, 16)  # reads 8, writes 9
    commands.add_clear(10, 0, 16)
    commands.add_resolve(12, 0, 2, 13, 0)
    writes = {101: (7, 20), 102: (21,)}
    assert commands.written_among(writes, {7, 8, 9, 10, 13, 30}) == {7, 9, 10, 13}
    assert commands.written_among(writes, {8, 30}) == set()
    assert CommandList().written_among(writes, {7}) == set()


def _inputs(step: int) -> np.ndarray:
    return (np.arange(N, dtype=np.float32) + 100 * step) / 3


@pytest.mark.wgpu_only
def test_a_read_after_a_submit_that_read_ahead_submits_nothing_and_is_right(device: WgpuDevice) -> None:
    scale = Scale(device)
    for step in range(4):
        scale.replay(_inputs(step))
        np.testing.assert_array_equal(scale.read(), _inputs(step) * 2 + 1)
        calls = scale.spy.take()
        assert "copy_and_map" not in calls and "read_mapped" in calls, calls
    np.testing.assert_array_equal(scale.read(), _inputs(3) * 2 + 1)  # read twice: the copy is still current
    assert scale.spy.take() == ["read_mapped"]
    scale.release()
    assert device.live_handles() == 0


@pytest.mark.wgpu_only
def test_a_range_large_enough_to_read_in_chunks_is_not_read_ahead(device: WgpuDevice) -> None:
    """A read of CHUNKED_READ_MIN bytes or more goes in chunks (the host copies one while the bus moves the next);
    read ahead into one staging buffer it could not overlap, so such a range is left out of the replay's submission
    and its read copies chunk by chunk, and is right."""
    n = CHUNKED_READ_MIN // 4
    big = FrozenKernel(device, SCALE_KERNEL, n, "scale-big")
    spy = Spy(device._unlocked)
    device._unlocked = spy  # type: ignore[assignment]
    x = np.arange(n, dtype=np.float32) / 7
    for _ in range(2):
        big.submit(x)
        assert big.y not in device._aheads
        out = big.read()
        np.testing.assert_array_equal(out, x * 2 + 1)
        assert spy.take().count("copy_and_map") >= 2
    big.release()
    assert device.live_handles() == 0


def _fresh_copy(scale: Scale) -> Scale:
    """Replay 1 (read), then replay 2: replay 2's copy is fresh."""
    scale.replay(_inputs(1))
    scale.read()
    scale.replay(_inputs(2))
    return scale


def _writer(device: WgpuDevice, scale: Scale, how: str) -> Callable[[], np.ndarray]:
    """A write of ``scale.y`` by ``how``; returns what y holds after it."""
    other = np.full(N, 7.25, np.float32)
    z = device.create_buffer(NBYTES)
    device.write_buffer(z, 0, other.tobytes())

    def write() -> np.ndarray:
        if how == "write_buffer":
            device.write_buffer(scale.y, 0, other.tobytes())
            return other
        if how in ("dispatch", "dispatch-frozen", "submit_and_read"):
            group = device.create_bind_group(
                scale.pipeline, [BindingEntry(0, z, 0, NBYTES), BindingEntry(1, scale.y, 0, NBYTES)]
            )
            commands = CommandList()
            commands.add_dispatch(scale.pipeline, group, N // 64)
            if how == "dispatch-frozen":  # validated, encoded ahead: its later submits leave the lock
                commands.freeze()
                for _ in range(3):
                    device.submit(commands)
            elif how == "submit_and_read":
                device.submit_and_read(commands, [(z, 0, np.empty(N, np.float32))])
            else:
                device.submit(commands)
            device.release_bind_group(group)
            return other * 2 + 1
        commands = CommandList()
        if how == "copy":
            commands.add_copy(z, 0, scale.y, 0, NBYTES)
            device.submit(commands)
            return other
        assert how == "clear"
        commands.add_clear(scale.y, 0, NBYTES)
        device.submit(commands)
        return np.zeros(N, np.float32)

    write.z = z  # type: ignore[attr-defined]
    return write


@pytest.mark.wgpu_only
@pytest.mark.parametrize("how", ["write_buffer", "dispatch", "dispatch-frozen", "copy", "clear", "submit_and_read"])
def test_a_write_after_the_read_ahead_is_what_the_next_read_returns(device: WgpuDevice, how: str) -> None:
    scale = Scale(device)
    write = _writer(device, scale, how)
    scale.replay(_inputs(1))
    scale.read()
    scale.replay(_inputs(2))  # (encoded ahead, submitted outside the lock) its copy is fresh
    assert device._aheads[scale.y].fresh
    expected = write()
    np.testing.assert_array_equal(scale.read(), expected)
    assert "copy_and_map" in scale.spy.take(), "the stale copy was used"
    scale.replay(_inputs(3))  # refreshed again: read from the copy
    np.testing.assert_array_equal(scale.read(), _inputs(3) * 2 + 1)
    assert "copy_and_map" not in scale.spy.take()
    device.destroy_buffer(write.z)  # type: ignore[attr-defined]
    scale.release()
    assert device.live_handles() == 0


def _true_contents(device: WgpuDevice, buffer: int) -> np.ndarray:
    """The buffer's contents read through a path that never uses a read ahead."""
    out = np.empty(N, np.float32)
    device.submit_and_read(CommandList(), [(buffer, 0, out)])
    return out


@pytest.mark.wgpu_only
def test_a_writer_that_would_submit_outside_the_lock_cannot_land_after_a_refresh(device: WgpuDevice) -> None:
    """Thread B's frozen list writes the read-ahead buffer; were it submitted outside the lock, it could be marked
    (stale) before a refresh is marked (fresh) and still reach the queue after it.  B is held at that point if it
    gets there; meanwhile this thread refreshes; whatever the order, the read must equal the buffer."""
    scale = Scale(device)
    z = device.create_buffer(NBYTES)
    device.write_buffer(z, 0, np.full(N, -4.0, np.float32).tobytes())
    group = device.create_bind_group(
        scale.pipeline, [BindingEntry(0, z, 0, NBYTES), BindingEntry(1, scale.y, 0, NBYTES)]
    )
    writer = CommandList()
    writer.add_dispatch(scale.pipeline, group, N // 64)
    writer.freeze()
    device.submit(writer)
    device.submit(writer)  # validated and encoded ahead: a next submit would leave the lock
    scale.replay(_inputs(1))
    scale.read()
    held = threading.Event()
    go = threading.Event()
    original = device._submit_unlocked

    def submit_unlocked(*args: Any, **kwargs: Any) -> None:
        if threading.current_thread().name == "writer":
            held.set()
            go.wait(30)
        original(*args, **kwargs)

    device._submit_unlocked = submit_unlocked  # type: ignore[method-assign]
    thread = threading.Thread(target=lambda: device.submit(writer), name="writer")
    thread.start()
    held.wait(2)  # (with the lock rule, the writer never gets there: it submitted under the lock)
    scale.replay(_inputs(2))
    go.set()
    thread.join(60)
    device._submit_unlocked = original  # type: ignore[method-assign]
    np.testing.assert_array_equal(scale.read(), _true_contents(device, scale.y))
    device.release_bind_group(group)
    device.destroy_buffer(z)
    scale.release()
    assert device.live_handles() == 0


@pytest.mark.wgpu_only
def test_replays_nobody_reads_stop_copying_and_reads_stay_right(device: WgpuDevice) -> None:
    scale = Scale(device)
    scale.replay(_inputs(0))
    np.testing.assert_array_equal(scale.read(), _inputs(0) * 2 + 1)
    scale.replay(_inputs(1))  # read: copied
    scale.replay(_inputs(2))  # not read since the last copy: nothing copied, the copy is stale
    assert not device._aheads[scale.y].fresh and not device._aheads[scale.y].wanted
    np.testing.assert_array_equal(scale.read(), _inputs(2) * 2 + 1)  # the ordinary read
    assert "copy_and_map" in scale.spy.take()
    scale.replay(_inputs(3))  # wanted again
    np.testing.assert_array_equal(scale.read(), _inputs(3) * 2 + 1)
    assert "copy_and_map" not in scale.spy.take()
    scale.release()
    assert device.live_handles() == 0


class PausedRead:
    """Holds the next read from a copy made ahead (``read_mapped``, the one C call of such a read: it has taken
    the staging buffer) of a thread started by :meth:`start` until :meth:`resume`."""

    def __init__(self, spy: Spy) -> None:
        self.entered = threading.Event()
        self.resumed = threading.Event()
        self.thread: threading.Thread | None = None

        def hold(name: str) -> None:
            if name == "read_mapped" and threading.current_thread() is self.thread and not self.entered.is_set():
                self.entered.set()
                assert self.resumed.wait(30)

        spy.hold = hold

    def start(self, work: Callable[[], Any]) -> dict[str, Any]:
        result: dict[str, Any] = {}

        def run() -> None:
            try:
                result["value"] = work()
            except BaseException as error:  # noqa: BLE001 - handed to the test
                result["error"] = error

        self.thread = threading.Thread(target=run)
        self.thread.start()
        assert self.entered.wait(30)
        return result

    def resume(self) -> None:
        self.resumed.set()
        assert self.thread is not None
        self.thread.join(60)
        assert not self.thread.is_alive()


@pytest.mark.wgpu_only
def test_a_replay_while_a_read_maps_the_copy_leaves_it_out_and_both_are_right(device: WgpuDevice) -> None:
    scale = _fresh_copy(Scale(device))
    scale.spy.take()
    paused = PausedRead(scale.spy)
    result = paused.start(scale.read)  # maps the copy of replay 2, stopped in its wait
    scale.replay(_inputs(3))  # the copy is busy: this replay copies nothing (the range is stale)
    paused.resume()
    assert "error" not in result, result.get("error")
    np.testing.assert_array_equal(result["value"], _inputs(2) * 2 + 1)  # the read began before replay 3
    np.testing.assert_array_equal(scale.read(), _inputs(3) * 2 + 1)
    scale.release()
    assert device.live_handles() == 0


@pytest.mark.wgpu_only
def test_releasing_the_buffer_while_a_read_maps_its_copy_frees_it_after(device: WgpuDevice) -> None:
    scale = _fresh_copy(Scale(device))
    paused = PausedRead(scale.spy)
    result = paused.start(scale.read)
    staging = device._aheads[scale.y].staging
    scale.release()  # y released: its read ahead is dropped, the staging buffer kept for the read
    assert staging.address in device._staging_all
    paused.resume()
    assert "error" not in result, result.get("error")
    np.testing.assert_array_equal(result["value"], _inputs(2) * 2 + 1)
    assert staging.address not in device._staging_all and not device._aheads
    assert device.live_handles() == 0


@pytest.mark.wgpu_only
def test_destroying_the_device_while_a_read_maps_its_copy_raises_released(backend: WgpuBackend) -> None:
    device = backend.open_device(backend.default_adapter_index())
    scale = _fresh_copy(Scale(device))
    paused = PausedRead(scale.spy)
    result = paused.start(scale.read)
    device.destroy()
    paused.resume()
    assert isinstance(result.get("error"), ReleasedValueError), result
    assert device.live_handles() == 0


@pytest.mark.wgpu_only
def test_threads_each_replaying_and_reading_their_own_get_their_own_results(device: WgpuDevice) -> None:
    scales = [Scale(device) for _ in range(4)]
    failures: list[str] = []

    def work(index: int) -> None:
        for step in range(30):
            x = _inputs(step * 10 + index)
            scales[index].replay(x)
            got = scales[index].read()
            if not np.array_equal(got, x * 2 + 1):
                failures.append(f"thread {index} step {step}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures
    for scale in scales:
        scale.release()
    assert device.live_handles() == 0


def _scale_twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
    """SCALE_KERNEL for the fake backend."""
    arrays[1].view(np.float32)[:] = arrays[0].view(np.float32) * 2 + 1


@pytest.mark.parametrize(
    "bad", ["stale", "past the end", "misaligned", "not a tuple"], ids=lambda bad: bad.replace(" ", "-")
)
def test_a_bad_read_ahead_range_raises_and_submits_nothing(backend_name: str, bad: str) -> None:
    env = ortgpu.Env(backend=backend_name)
    try:
        device = env.default_device._native_device()
        pipeline = device.create_compute_pipeline(SCALE_KERNEL, twin=_scale_twin, label="scale")
        x = device.create_buffer(NBYTES)
        y = device.create_buffer(NBYTES)
        gone = device.create_buffer(NBYTES)
        device.destroy_buffer(gone)
        group = device.create_bind_group(pipeline, [BindingEntry(0, x, 0, NBYTES), BindingEntry(1, y, 0, NBYTES)])
        device.write_buffer(x, 0, np.ones(N, np.float32).tobytes())
        commands = CommandList()
        commands.add_dispatch(pipeline, group, N // 64)
        ranges: dict[str, Any] = {
            "stale": [(gone, 0, NBYTES)],
            "past the end": [(y, 0, NBYTES + 4)],
            "misaligned": [(y, 2, 8)],
            "not a tuple": [y],
        }
        with pytest.raises(ValidationError):
            device.submit(commands, ranges[bad])
        out = np.empty(N, np.float32)
        device.read_buffer_into(y, 0, out)
        np.testing.assert_array_equal(out, np.zeros(N, np.float32))  # nothing ran
        device.release_bind_group(group)
        device.destroy_buffer(x)
        device.destroy_buffer(y)
        device.release_pipeline(pipeline)
    finally:
        env.close()


def _mlp() -> bytes:
    from bench.models import mlp

    return mlp(layers=3, width=64, batch=1).SerializeToString()


def test_replay_then_to_numpy_sees_what_another_session_wrote_into_the_output_since(env: ortgpu.Env) -> None:
    model = _mlp()
    session = ortgpu.InferenceSession(model, env=env, graph_capture=True)
    other = ortgpu.InferenceSession(model, env=env)
    (input_name,) = [i.name for i in session.get_inputs()]
    (output_name,) = [o.name for o in session.get_outputs()]
    rng = np.random.default_rng(5)
    shared = env.shared_allocator()
    x = shared.from_numpy(rng.standard_normal((1, 64)).astype(np.float32))
    y = shared.empty((1, 64), "float32")
    binding = session.io_binding()
    binding.bind_input(input_name, x)
    binding.bind_output(output_name, y)
    graph = session.capture(binding, 0)
    try:
        for _ in range(3):
            feed = rng.standard_normal((1, 64)).astype(np.float32)
            x.update_inplace(feed)
            graph.replay()
            np.testing.assert_allclose(y.to_numpy(), other.run(None, {input_name: feed})[0], rtol=1e-5, atol=1e-6)
        graph.replay()
        # another session's run writes the captured graph's output value after the replay
        feed = rng.standard_normal((1, 64)).astype(np.float32)
        other_input = shared.from_numpy(feed)
        other_binding = other.io_binding()
        other_binding.bind_input(input_name, other_input)
        other_binding.bind_output(output_name, y)
        other.run_with_iobinding(other_binding)
        np.testing.assert_allclose(y.to_numpy(), other.run(None, {input_name: feed})[0], rtol=1e-5, atol=1e-6)
        graph.replay()
        written = np.full((1, 64), 3.5, np.float32)
        y.update_inplace(written)  # a host write into the output after the replay
        np.testing.assert_array_equal(y.to_numpy(), written)
        other_binding.clear_binding_outputs()
        other_binding.clear_binding_inputs()
        other_input.release()
    finally:
        graph.release()
        session.close()
        other.close()
        x.release()
        y.release()
