"""Conformance of every backend to :mod:`ortgpu_core.backends.protocol`.

The same tests run on the fake backend and on wgpu-native (skipped where the
wgpu backend or an adapter is unavailable): round trips, ordering within a
command list and across submits, a tiny WGSL kernel with its numpy twin, live
handle counts and typed errors on misuse.
"""

from __future__ import annotations

import importlib
from typing import Any, Iterator, Sequence

import numpy as np
import pytest

from ortgpu_core._errors import ReleasedValueError, ValidationError
from ortgpu_core.backends.protocol import (
    AdapterInfo,
    Backend,
    BackendDevice,
    BindingEntry,
    CommandList,
    DeviceLimits,
)

BACKENDS = ["fake", "wgpu"]

ADD_ONE = """
@group(0) @binding(0) var<storage, read_write> data: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&data)) {
        data[id.x] = data[id.x] + 1u;
    }
}
"""


def add_one_twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
    words = arrays[0].view(np.uint32)
    n = min(words.size, grid[0] * 64)
    words[:n] += 1


def make_backend(name: str) -> Backend:
    if name == "fake":
        from ortgpu_core.backends.fake import FakeBackend

        return FakeBackend()
    # No driver or no adapter is a failure, not a skip: CI installs lavapipe, and a skipped wgpu run proves nothing.
    module = importlib.import_module("ortgpu_core.backends.wgpu_native")
    backend: Backend = module.WgpuBackend()
    assert backend.enumerate_adapters(), "wgpu-native found no adapter (install mesa-vulkan-drivers)"
    return backend


def default_index(backend: Backend) -> int:
    index = getattr(backend, "default_adapter_index", None)
    return int(index()) if index is not None else 0


@pytest.fixture(scope="module", params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    # Named as conftest's fixture, so that --backend / $ORTGPU_BACKEND deselect one.
    return str(request.param)


@pytest.fixture(scope="module")
def backend(backend_name: str) -> Backend:
    return make_backend(backend_name)


@pytest.fixture(scope="module")
def shared_device(backend: Backend) -> Iterator[BackendDevice]:
    device = backend.open_device(default_index(backend))
    yield device
    device.destroy()


@pytest.fixture
def device(shared_device: BackendDevice) -> Iterator[BackendDevice]:
    # One device per backend for the module (opening one is slow on real
    # drivers); every test must free what it creates.
    before = shared_device.live_handles()
    yield shared_device
    assert shared_device.live_handles() == before, "the test leaked handles"


def u32(*values: int) -> bytes:
    return np.array(values, dtype=np.uint32).tobytes()


def read_u32(device: BackendDevice, buffer: int, offset: int = 0, count: int = 1) -> list[int]:
    return [int(v) for v in np.frombuffer(device.read_buffer(buffer, offset, 4 * count), dtype=np.uint32)]


def test_adapters_and_device_description(backend: Backend, device: BackendDevice) -> None:
    assert isinstance(backend, Backend) and isinstance(device, BackendDevice)
    assert backend.name in BACKENDS
    adapters = backend.enumerate_adapters()
    assert adapters and all(isinstance(a, AdapterInfo) for a in adapters)
    assert [a.index for a in adapters] == list(range(len(adapters)))
    assert device.info == adapters[default_index(backend)]
    assert isinstance(device.limits, DeviceLimits)
    assert device.limits.max_compute_workgroups_per_dimension >= 65535
    assert isinstance(device.features, frozenset)
    assert device.info.adapter_type in {"DiscreteGPU", "IntegratedGPU", "CPU", "Unknown"}
    # A capability, not a name test: only the fake runs numpy twins instead of WGSL.
    assert device.runs_numpy_twins is (backend.name == "fake")


def test_buffer_round_trip(device: BackendDevice) -> None:
    buffer = device.create_buffer(64, label="round trip")
    try:
        assert device.read_buffer(buffer, 0, 64) == bytes(64)
        payload = np.arange(16, dtype=np.uint32) * 3
        device.write_buffer(buffer, 0, payload.tobytes())
        device.write_buffer(buffer, 8, u32(1000, 1001))
        expected = payload.copy()
        expected[2:4] = [1000, 1001]
        assert read_u32(device, buffer, 0, 16) == expected.tolist()
        assert read_u32(device, buffer, 12, 2) == [1001, 12]
    finally:
        device.destroy_buffer(buffer)


def test_copies_and_clears_in_one_command_list_run_in_order(device: BackendDevice) -> None:
    a, b = device.create_buffer(16), device.create_buffer(16)
    try:
        device.write_buffer(a, 0, u32(1, 2, 3, 4))
        commands = CommandList()
        commands.add_copy(a, 0, b, 0, 16)  # b = 1 2 3 4
        commands.add_clear(a, 4, 8)  # a = 1 0 0 4
        commands.add_copy(a, 0, b, 8, 8)  # b = 1 2 1 0
        commands.add_clear(b, 0, 4)  # b = 0 2 1 0
        device.submit(commands)
        assert read_u32(device, a, 0, 4) == [1, 0, 0, 4]
        assert read_u32(device, b, 0, 4) == [0, 2, 1, 0]
    finally:
        device.destroy_buffer(a)
        device.destroy_buffer(b)


def test_queue_writes_are_ordered_with_submits(device: BackendDevice) -> None:
    staging, target = device.create_buffer(8), device.create_buffer(8)
    try:
        commands = CommandList()
        commands.add_copy(staging, 0, target, 0, 8)
        device.write_buffer(staging, 0, u32(3, 4))  # before the submit: the copy sees it
        device.submit(commands)
        device.write_buffer(staging, 0, u32(5, 6))  # after the submit: the copy does not
        assert read_u32(device, target, 0, 2) == [3, 4]
        device.submit(commands)
        assert read_u32(device, target, 0, 2) == [5, 6]
    finally:
        device.destroy_buffer(staging)
        device.destroy_buffer(target)


def test_dispatch_add_one(device: BackendDevice) -> None:
    count = 1000
    data, out = device.create_buffer(4 * count, label="data"), device.create_buffer(4 * count, label="out")
    pipeline = device.create_compute_pipeline(ADD_ONE, twin=add_one_twin, label="add_one")
    bind_group = device.create_bind_group(pipeline, [BindingEntry(0, data, 0, 4 * count)])
    try:
        values = np.arange(count, dtype=np.uint32) * 7
        device.write_buffer(data, 0, values.tobytes())
        grid = (count + 63) // 64
        commands = CommandList()
        commands.add_dispatch(pipeline, bind_group, grid)
        commands.add_copy(data, 0, out, 0, 4 * count)  # sees the first dispatch only
        commands.add_dispatch(pipeline, bind_group, grid)
        assert commands.dispatch_count == 2
        device.submit(commands)
        device.wait_idle()
        assert read_u32(device, data, 0, count) == (values + 2).tolist()
        assert read_u32(device, out, 0, count) == (values + 1).tolist()
        commands.freeze()  # a captured graph's recording replays as often as asked
        device.submit(commands)
        device.submit(commands)
        assert read_u32(device, data, 0, count) == (values + 6).tolist()
    finally:
        device.release_bind_group(bind_group)
        device.release_pipeline(pipeline)
        device.destroy_buffer(data)
        device.destroy_buffer(out)


def test_dispatch_on_a_bound_subrange(device: BackendDevice) -> None:
    offset = max(device.limits.min_storage_buffer_offset_alignment, 256)
    buffer = device.create_buffer(offset + 64)
    pipeline = device.create_compute_pipeline(ADD_ONE, twin=add_one_twin)
    bind_group = device.create_bind_group(pipeline, [BindingEntry(0, buffer, offset, 16)])
    try:
        device.write_buffer(buffer, offset - 4, u32(10, 20, 30, 40, 50, 60))
        commands = CommandList()
        commands.add_dispatch(pipeline, bind_group, 1)
        device.submit(commands)
        assert read_u32(device, buffer, offset - 4, 6) == [10, 21, 31, 41, 51, 60]
    finally:
        device.release_bind_group(bind_group)
        device.release_pipeline(pipeline)
        device.destroy_buffer(buffer)


def test_live_handle_counts(backend: Backend, device: BackendDevice) -> None:
    device_before, backend_before = device.live_handles(), backend.live_handles()
    buffer = device.create_buffer(16)
    pipeline = device.create_compute_pipeline(ADD_ONE, twin=add_one_twin)
    bind_group = device.create_bind_group(pipeline, [BindingEntry(0, buffer, 0, 16)])
    assert device.live_handles() == device_before + 3
    assert backend.live_handles() == backend_before + 3
    device.release_bind_group(bind_group)
    device.release_pipeline(pipeline)
    device.destroy_buffer(buffer)
    assert (device.live_handles(), backend.live_handles()) == (device_before, backend_before)


def test_destroy_frees_everything_and_is_idempotent(backend: Backend) -> None:
    before = backend.live_handles()
    device = backend.open_device(default_index(backend))
    other = backend.open_device(default_index(backend))  # the same adapter twice: two devices
    try:
        assert device is not other
        buffer = device.create_buffer(16)
        pipeline = device.create_compute_pipeline(ADD_ONE, twin=add_one_twin)
        device.create_bind_group(pipeline, [BindingEntry(0, buffer, 0, 16)])
        other.write_buffer(other_buffer := other.create_buffer(4), 0, u32(9))
        assert backend.live_handles() == before + 4
        device.destroy()
        device.destroy()
        assert device.live_handles() == 0 and backend.live_handles() == before + 1
        assert read_u32(other, other_buffer) == [9]  # the other device is unaffected
    finally:
        device.destroy()
        other.destroy()
    assert backend.live_handles() == before


# -- errors on misuse -------------------------------------------------------------------------


def test_buffer_creation_errors(device: BackendDevice) -> None:
    with pytest.raises(ValidationError):
        device.create_buffer(6)
    with pytest.raises(ValidationError):
        device.create_buffer(device.limits.max_buffer_size + 4)


def test_write_and_read_out_of_range(device: BackendDevice) -> None:
    buffer = device.create_buffer(8)
    try:
        with pytest.raises(ValidationError):
            device.write_buffer(buffer, 4, u32(1, 2))
        with pytest.raises(ValidationError):
            device.write_buffer(buffer, 2, u32(1))
        with pytest.raises(ValidationError):
            device.read_buffer(buffer, 4, 8)
        assert read_u32(device, buffer, 0, 2) == [0, 0]  # the device still works, nothing was written
    finally:
        device.destroy_buffer(buffer)


@pytest.mark.parametrize(
    "bad",
    ["copy onto itself", "unaligned copy", "copy out of range", "clear out of range", "grid too large"],
)
def test_invalid_commands_raise_at_submit(device: BackendDevice, bad: str) -> None:
    a, b = device.create_buffer(16), device.create_buffer(16)
    pipeline = device.create_compute_pipeline(ADD_ONE, twin=add_one_twin)
    bind_group = device.create_bind_group(pipeline, [BindingEntry(0, b, 0, 16)])
    try:
        device.write_buffer(a, 0, u32(1, 2, 3, 4))
        commands = CommandList()
        if bad == "copy onto itself":
            commands.add_copy(a, 0, a, 8, 8)
        elif bad == "unaligned copy":
            commands.add_copy(a, 0, b, 0, 6)
        elif bad == "copy out of range":
            commands.add_copy(a, 8, b, 0, 16)
        elif bad == "clear out of range":
            commands.add_clear(a, 8, 16)
        else:
            commands.add_dispatch(pipeline, bind_group, device.limits.max_compute_workgroups_per_dimension + 1)
        with pytest.raises(ValidationError):
            device.submit(commands)
        # The device survives a rejected submit.
        good = CommandList()
        good.add_copy(a, 0, b, 0, 16)
        good.add_dispatch(pipeline, bind_group, 1)
        device.submit(good)
        assert read_u32(device, b, 0, 4) == [2, 3, 4, 5]
    finally:
        device.release_bind_group(bind_group)
        device.release_pipeline(pipeline)
        device.destroy_buffer(a)
        device.destroy_buffer(b)


def test_stale_handles_are_rejected(device: BackendDevice) -> None:
    buffer = device.create_buffer(16)
    device.destroy_buffer(buffer)
    with pytest.raises(ValidationError):
        device.read_buffer(buffer, 0, 4)
    with pytest.raises(ValidationError):
        device.write_buffer(buffer, 0, u32(1))
    with pytest.raises(ValidationError):
        device.destroy_buffer(buffer)
    commands = CommandList()
    commands.add_clear(buffer, 0, 16)
    with pytest.raises(ValidationError):
        device.submit(commands)


def test_dispatch_with_a_destroyed_buffer_is_rejected(device: BackendDevice) -> None:
    keep, doomed = device.create_buffer(16), device.create_buffer(16)
    pipeline = device.create_compute_pipeline(ADD_ONE, twin=add_one_twin)
    bind_group = device.create_bind_group(pipeline, [BindingEntry(0, doomed, 0, 16)])
    try:
        device.destroy_buffer(doomed)
        commands = CommandList()
        commands.add_clear(keep, 0, 16)
        commands.add_dispatch(pipeline, bind_group, 1)
        with pytest.raises(ValidationError):
            device.submit(commands)
    finally:
        device.release_bind_group(bind_group)
        device.release_pipeline(pipeline)
        device.destroy_buffer(keep)


def test_uniform_buffers_are_write_only(device: BackendDevice) -> None:
    uniform, storage = device.create_buffer(16, uniform=True), device.create_buffer(16)
    try:
        device.write_buffer(uniform, 0, u32(1, 2, 3, 4))
        with pytest.raises(ValidationError):
            device.read_buffer(uniform, 0, 16)
        commands = CommandList()
        commands.add_copy(uniform, 0, storage, 0, 16)
        with pytest.raises(ValidationError):
            device.submit(commands)
    finally:
        device.destroy_buffer(uniform)
        device.destroy_buffer(storage)


def test_bind_group_must_match_the_shader(device: BackendDevice) -> None:
    buffer, uniform = device.create_buffer(512), device.create_buffer(16, uniform=True)
    pipeline = device.create_compute_pipeline(ADD_ONE, twin=add_one_twin)
    try:
        with pytest.raises(ValidationError):  # no binding 1 in the shader
            device.create_bind_group(pipeline, [BindingEntry(0, buffer, 0, 16), BindingEntry(1, buffer, 256, 16)])
        with pytest.raises(ValidationError):  # binding 0 missing
            device.create_bind_group(pipeline, [])
        with pytest.raises(ValidationError):  # a uniform buffer where storage is declared
            device.create_bind_group(pipeline, [BindingEntry(0, uniform, 0, 16)])
        with pytest.raises(ValidationError):  # range past the end
            device.create_bind_group(pipeline, [BindingEntry(0, buffer, 256, 512)])
        with pytest.raises(ValidationError):
            device.create_compute_pipeline(ADD_ONE, entry_point="missing", twin=add_one_twin)
    finally:
        device.release_pipeline(pipeline)
        device.destroy_buffer(buffer)
        device.destroy_buffer(uniform)


def test_bad_adapter_index(backend: Backend) -> None:
    with pytest.raises(ValidationError):
        backend.open_device(len(backend.enumerate_adapters()))


def test_destroyed_device_raises_released(backend: Backend) -> None:
    """A device destroyed by its owner (its Env closed) was released, not lost: ReleasedValueError; frees succeed."""
    device = backend.open_device(default_index(backend))
    buffer = device.create_buffer(16)
    device.destroy()
    for call in (
        lambda: device.create_buffer(4),
        lambda: device.write_buffer(buffer, 0, u32(1)),
        lambda: device.read_buffer(buffer, 0, 4),
        lambda: device.submit(CommandList()),
        device.wait_idle,
    ):
        with pytest.raises(ReleasedValueError, match="destroyed"):
            call()
    device.destroy_buffer(buffer)  # releasing is always allowed: nothing left to free
    assert device.live_handles() == 0


# -- extensions both backends provide beyond the protocol ------------------------------------


def test_validate_commands_and_buffer_size(device: BackendDevice) -> None:
    extended: Any = device
    a, b = device.create_buffer(16), device.create_buffer(8)
    try:
        assert (extended.buffer_size(a), extended.buffer_size(b)) == (16, 8)
        commands = CommandList()
        commands.add_copy(b, 0, a, 8, 8)
        extended.validate_commands(commands)
        commands.add_copy(a, 0, b, 0, 16)
        with pytest.raises(ValidationError):
            extended.validate_commands(commands)
        commands.clear()
        device.write_buffer(b, 0, u32(7, 8))
        commands.add_copy(b, 0, a, 8, 8)
        device.submit(commands)
        assert read_u32(device, a, 0, 4) == [0, 0, 7, 8]
    finally:
        device.destroy_buffer(a)
        device.destroy_buffer(b)


def test_write_accepts_any_buffer(device: BackendDevice) -> None:
    buffer = device.create_buffer(16)
    try:
        device.write_buffer(buffer, 0, (np.arange(4, dtype=np.uint32) + 1).data)
        assert read_u32(device, buffer, 0, 4) == [1, 2, 3, 4]
        device.write_buffer(buffer, 0, (np.arange(8, dtype=np.uint32)[::2]).data)  # C order
        assert read_u32(device, buffer, 0, 4) == [0, 2, 4, 6]
    finally:
        device.destroy_buffer(buffer)


def test_read_buffer_into_fills_any_sized_host_buffer(device: BackendDevice) -> None:
    buffer, uniform = device.create_buffer(64, label="read into"), device.create_buffer(16, uniform=True)
    try:
        payload = (np.arange(64, dtype=np.uint8) * 7).astype(np.uint8)
        device.write_buffer(buffer, 0, payload.tobytes())
        out = np.full(64, 255, np.uint8)
        device.read_buffer_into(buffer, 0, out)
        np.testing.assert_array_equal(out, payload)
        odd = np.zeros(7, np.uint8)  # not a multiple of 4: the device copy is rounded up, the host copy is not
        device.read_buffer_into(buffer, 8, odd)
        np.testing.assert_array_equal(odd, payload[8:15])
        words = np.zeros((2, 3), np.uint32)  # any writable contiguous buffer; its bytes are read
        device.read_buffer_into(buffer, 4, words)
        np.testing.assert_array_equal(words.reshape(-1).view(np.uint8), payload[4:28])
        before = out.copy()
        for bad, error in (
            (np.zeros(8, np.uint8)[::2], ValidationError),  # not contiguous
            (bytes(8), ValidationError),  # read-only
        ):
            with pytest.raises(error, match="writable C-contiguous"):
                device.read_buffer_into(buffer, 0, bad)
        with pytest.raises(ValidationError):
            device.read_buffer_into(buffer, 60, np.zeros(8, np.uint8))  # past the end
        with pytest.raises(ValidationError):
            device.read_buffer_into(buffer, 2, np.zeros(4, np.uint8))  # misaligned offset
        with pytest.raises(ValidationError):
            device.read_buffer_into(uniform, 0, np.zeros(16, np.uint8))  # uniform buffers are write-only
        np.testing.assert_array_equal(out, before)
        device.read_buffer_into(buffer, 0, np.zeros(0, np.uint8))  # empty: nothing to do
    finally:
        device.destroy_buffer(buffer)
        device.destroy_buffer(uniform)


def test_submit_and_read_is_submit_then_reads(device: BackendDevice) -> None:
    """One call: the commands run, then every region is read into its array (odd sizes, offsets, several reads);
    a bad read is refused before anything runs."""
    a, b = device.create_buffer(64, label="a"), device.create_buffer(64, label="b")
    try:
        payload = np.arange(16, dtype=np.uint32) + 100
        device.write_buffer(a, 0, payload.tobytes())
        device.write_buffer(b, 0, bytes(64))
        commands = CommandList()
        commands.add_copy(a, 0, b, 16, 32)  # b[4:12] <- a[0:8]
        commands.add_clear(a, 0, 8)  # a[0:2] <- 0
        whole_b, a_tail, odd = np.zeros(16, np.uint32), np.zeros(3, np.uint32), np.zeros(5, np.uint8)
        device.submit_and_read(commands, [(b, 0, whole_b), (a, 4, a_tail), (b, 16, odd), (a, 0, np.zeros(0, np.uint8))])
        expected_b = np.zeros(16, np.uint32)
        expected_b[4:12] = payload[0:8]
        np.testing.assert_array_equal(whole_b, expected_b)
        np.testing.assert_array_equal(a_tail, [0, 102, 103])  # read after the clear
        np.testing.assert_array_equal(odd, payload[0:2].view(np.uint8)[:5])
        device.submit_and_read(CommandList(), [])  # nothing to run, nothing to read

        device.write_buffer(b, 0, bytes(64))
        for bad in ([(b, 0, bytes(8))], [(b, 60, np.zeros(8, np.uint8))], [(b, 2, np.zeros(4, np.uint8))]):
            with pytest.raises(ValidationError):
                device.submit_and_read(commands, bad)  # type: ignore[arg-type]
        assert device.read_buffer(b, 0, 64) == bytes(64)  # the refused calls ran nothing
    finally:
        device.destroy_buffer(a)
        device.destroy_buffer(b)


def test_encode_next_is_a_hint_that_changes_no_result(device: BackendDevice) -> None:
    """``submit(commands, encode_next=other)`` runs ``commands`` as a plain submit does, whatever ``other`` is
    (a frozen list or not, submitted next or not); anything but a CommandList or None is refused before anything
    runs."""
    a, b = device.create_buffer(64, label="a"), device.create_buffer(64, label="b")
    try:
        payload = np.arange(16, dtype=np.uint32) + 7
        device.write_buffer(a, 0, payload.tobytes())
        copy, clear = CommandList(), CommandList()
        copy.add_copy(a, 0, b, 0, 64)
        clear.add_clear(b, 0, 64)
        copy.freeze()
        for hint in (clear, copy, CommandList(), None):
            device.submit(clear)
            device.submit(copy, encode_next=hint)
            np.testing.assert_array_equal(np.frombuffer(device.read_buffer(b, 0, 64), np.uint32), payload)
        device.submit(clear, encode_next=copy)
        assert device.read_buffer(b, 0, 64) == bytes(64)
        with pytest.raises(ValidationError, match="encode_next must be a CommandList or None"):
            device.submit(copy, encode_next=[copy])  # type: ignore[arg-type]
        assert device.read_buffer(b, 0, 64) == bytes(64)  # the refused submit ran nothing
    finally:
        device.destroy_buffer(a)
        device.destroy_buffer(b)
