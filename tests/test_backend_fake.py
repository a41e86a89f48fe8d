"""The fake backend: ordering, validation (typed, atomic), twins, faults, accounting."""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ortgpu_core._errors import (
    DeviceLostError,
    InvalidArgumentError,
    OutOfMemoryError,
    ReleasedValueError,
    ValidationError,
)
from ortgpu_core.backends.fake import (
    DEFAULT_FAKE_LIMITS,
    FAKE_DEVICE_ID,
    FAKE_VENDOR_ID,
    FakeBackend,
    FakeDevice,
    FakeDeviceSpec,
    fake_limits,
)
from ortgpu_core.backends.protocol import Backend, BackendDevice, BindingEntry, CommandList

ADD_ONE = """
@group(0) @binding(0) var<storage, read_write> data: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&data)) { data[id.x] = data[id.x] + 1u; }
}
"""

# in: read-only storage, out: read_write storage, params: uniform (declared out of order on purpose)
SCALE = """
@group(0) @binding(2) var<uniform> params: vec4<u32>;
@binding(0) @group(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@compute @workgroup_size(64, 1, 1)
fn main(@builtin(global_invocation_id) id: vec3<u32>) { dst[id.x] = src[id.x] * params.x; }
"""


def add_one(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
    words = arrays[0].view(np.uint32)
    n = min(words.size, grid[0] * 64)
    words[:n] += 1


def scale(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
    src, dst, params = (a.view(np.uint32) for a in arrays)
    dst[:] = src[: dst.size] * params[0]


def u32(*values: int) -> bytes:
    return np.array(values, dtype=np.uint32).tobytes()


def read_u32(device: FakeDevice, buffer: int, offset: int = 0, count: int = 1) -> list[int]:
    return [int(v) for v in np.frombuffer(device.read_buffer(buffer, offset, 4 * count), dtype=np.uint32)]


@pytest.fixture
def backend() -> Iterator[FakeBackend]:
    backend = FakeBackend()
    yield backend
    for device in backend.devices:
        device.destroy()
    assert backend.live_handles() == 0


@pytest.fixture
def device(backend: FakeBackend) -> FakeDevice:
    return backend.open_device(backend.default_adapter_index())


# -- adapters and devices --------------------------------------------------------


def test_default_adapter_and_device(backend: FakeBackend, device: FakeDevice) -> None:
    assert isinstance(backend, Backend) and isinstance(device, BackendDevice)
    assert backend.name == "fake"
    (info,) = backend.enumerate_adapters()
    assert (info.index, info.vendor_id, info.device_id) == (0, FAKE_VENDOR_ID, FAKE_DEVICE_ID)
    assert (info.name, info.backend_type, info.adapter_type) == ("Fake WebGPU device", "Fake", "CPU")
    assert device.info == info
    assert device.limits == DEFAULT_FAKE_LIMITS
    assert device.limits.max_compute_workgroups_per_dimension == 65535
    assert device.features == frozenset({"shader-f16"})
    assert device.native_table is None
    assert not device.lost and device.lost_reason is None


def test_configured_devices() -> None:
    small = fake_limits(max_buffer_size=1024, max_storage_buffer_binding_size=512)
    backend = FakeBackend(
        devices=[
            FakeDeviceSpec(),
            FakeDeviceSpec(
                vendor_id=0x10DE,
                device_id=0x2330,
                name="Pretend H100",
                adapter_type="DiscreteGPU",
                backend_type="Vulkan",
                features=frozenset(),
                limits=small,
            ),
        ]
    )
    infos = backend.enumerate_adapters()
    assert [(i.index, i.vendor_id, i.device_id, i.name) for i in infos] == [
        (0, FAKE_VENDOR_ID, FAKE_DEVICE_ID, "Fake WebGPU device"),
        (1, 0x10DE, 0x2330, "Pretend H100"),
    ]
    second = backend.open_device(1)
    assert second.info == infos[1] and second.limits == small and second.features == frozenset()
    assert second.info.adapter_type == "DiscreteGPU" and second.info.backend_type == "Vulkan"
    with pytest.raises(ValidationError, match="max_buffer_size 1024"):
        second.create_buffer(2048)
    with pytest.raises(ValidationError, match="2 adapter"):
        backend.open_device(2)
    second.destroy()


def test_fake_limits_rejects_unknown_names() -> None:
    assert fake_limits(max_buffer_size=64).max_buffer_size == 64
    with pytest.raises(TypeError):
        fake_limits(max_nonsense=1)


def test_same_adapter_twice_gives_distinct_devices(backend: FakeBackend) -> None:
    first, second = backend.open_device(0), backend.open_device(0)
    assert first is not second and backend.devices == (first, second)
    buffer = first.create_buffer(4)
    with pytest.raises(ValidationError, match=f"buffer {buffer} belongs to fake device #0"):
        second.write_buffer(buffer, 0, u32(1))
    assert (first.live_handles(), second.live_handles(), backend.live_handles()) == (1, 0, 1)
    first.destroy_buffer(buffer)
    assert backend.live_handles() == 0


# -- buffers and ordering ------------------------------------------------------------


def test_buffers_are_zero_filled_and_round_trip(device: FakeDevice) -> None:
    buffer = device.create_buffer(16, label="x")
    assert device.read_buffer(buffer, 0, 16) == bytes(16)
    device.write_buffer(buffer, 4, u32(7, 8))
    device.write_buffer(buffer, 12, (np.array([9], dtype=np.uint32)).data)
    device.write_buffer(buffer, 0, bytearray(u32(6)))
    assert read_u32(device, buffer, 0, 4) == [6, 7, 8, 9]
    assert read_u32(device, buffer, 8, 1) == [8]
    device.write_buffer(buffer, 0, (np.arange(8, dtype=np.uint32)[::2]).data)  # copied in C order
    assert read_u32(device, buffer, 0, 4) == [0, 2, 4, 6]
    assert device.buffer_size(buffer) == 16
    device.destroy_buffer(buffer)


def test_handles_are_never_reused(device: FakeDevice) -> None:
    handles = []
    for _ in range(5):
        handles.append(device.create_buffer(4))
        device.destroy_buffer(handles[-1])
    assert len(set(handles)) == 5 and 0 not in handles


def test_recorded_upload_is_invisible_until_submit(device: FakeDevice) -> None:
    # The caller's mistake the fake must expose: an upload recorded in a command
    # list, then a read before submitting it.
    staging, target = device.create_buffer(8), device.create_buffer(8)
    device.write_buffer(staging, 0, u32(1, 2))
    commands = CommandList()
    commands.add_copy(staging, 0, target, 0, 8)
    assert read_u32(device, target, 0, 2) == [0, 0]  # recorded, not submitted
    device.write_buffer(staging, 0, u32(3, 4))  # a queue write before the submit: the copy sees it
    device.submit(commands)
    device.write_buffer(staging, 0, u32(5, 6))  # after the submit: the copy does not see it
    assert read_u32(device, target, 0, 2) == [3, 4]
    for buffer in (staging, target):
        device.destroy_buffer(buffer)


def test_copies_and_clears_execute_in_record_order(device: FakeDevice) -> None:
    a, b = device.create_buffer(16), device.create_buffer(16)
    device.write_buffer(a, 0, u32(1, 2, 3, 4))
    commands = CommandList()
    commands.add_copy(a, 0, b, 0, 16)  # b = 1 2 3 4
    commands.add_clear(a, 4, 8)  # a = 1 0 0 4
    commands.add_copy(a, 0, b, 8, 8)  # b = 1 2 1 0
    commands.add_clear(b, 0, 4)  # b = 0 2 1 0
    device.submit(commands)
    assert read_u32(device, a, 0, 4) == [1, 0, 0, 4]
    assert read_u32(device, b, 0, 4) == [0, 2, 1, 0]
    device.destroy_buffer(a)
    device.destroy_buffer(b)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(
                st.just("write"), st.integers(0, 1), st.integers(0, 7), st.integers(1, 3), st.integers(0, 2**32 - 1)
            ),
            st.tuples(st.just("copy"), st.integers(0, 1), st.integers(0, 7), st.integers(0, 7), st.integers(1, 4)),
            st.tuples(st.just("clear"), st.integers(0, 1), st.integers(0, 7), st.integers(1, 4)),
            st.tuples(st.just("submit")),
        ),
        max_size=25,
    )
)
def test_ordering_matches_a_queue_model(ops: list[tuple[object, ...]]) -> None:
    # Model: writes apply now, recorded commands apply at submit, reads see submitted work.
    device = FakeBackend().open_device(0)
    words = 8
    buffers = [device.create_buffer(4 * words), device.create_buffer(4 * words)]
    model = [np.zeros(words, np.uint32), np.zeros(words, np.uint32)]
    pending: list[tuple[object, ...]] = []
    commands = CommandList()
    for op in ops:
        if op[0] == "write":
            _, which, start, count, value = op
            assert isinstance(which, int) and isinstance(start, int) and isinstance(count, int)
            count = min(count, words - start)
            device.write_buffer(buffers[which], 4 * start, u32(*[int(value)] * count))  # type: ignore[call-overload]
            model[which][start : start + count] = int(value)  # type: ignore[call-overload]
        elif op[0] == "copy":
            _, which, src, dst, count = op
            assert isinstance(which, int) and isinstance(src, int) and isinstance(dst, int) and isinstance(count, int)
            count = min(count, words - src, words - dst)
            commands.add_copy(buffers[which], 4 * src, buffers[1 - which], 4 * dst, 4 * count)
            pending.append(op[:4] + (count,))
        elif op[0] == "clear":
            _, which, start, count = op
            assert isinstance(which, int) and isinstance(start, int) and isinstance(count, int)
            count = min(count, words - start)
            commands.add_clear(buffers[which], 4 * start, 4 * count)
            pending.append(op[:3] + (count,))
        else:
            device.submit(commands)
            for command in pending:
                if command[0] == "copy":
                    _, which, src, dst, count = command
                    model[1 - which][dst : dst + count] = model[which][src : src + count].copy()  # type: ignore
                else:
                    _, which, start, count = command
                    model[which][start : start + count] = 0  # type: ignore
            pending.clear()
            commands = CommandList()
        for which in (0, 1):
            assert read_u32(device, buffers[which], 0, words) == model[which].tolist()
    device.destroy()


# -- validation ------------------------------------------------------------------------


def test_buffer_creation_validation(device: FakeDevice) -> None:
    with pytest.raises(ValidationError, match="multiple of 4"):
        device.create_buffer(6)
    with pytest.raises(ValidationError, match="multiple of 4"):
        device.create_buffer(-4)
    with pytest.raises(ValidationError, match="max_buffer_size"):
        device.create_buffer(DEFAULT_FAKE_LIMITS.max_buffer_size + 4)
    assert device.live_handles() == 0


def test_write_and_read_validation(device: FakeDevice) -> None:
    buffer = device.create_buffer(8, label="small")
    uniform = device.create_buffer(16, uniform=True)
    with pytest.raises(ValidationError, match="offset is 2"):
        device.write_buffer(buffer, 2, u32(1))
    with pytest.raises(ValidationError, match="size is 3"):
        device.write_buffer(buffer, 0, b"abc")
    with pytest.raises(ValidationError, match=r"\[4, 12\) is outside buffer .* \('small'\) of 8 bytes"):
        device.write_buffer(buffer, 4, u32(1, 2))
    with pytest.raises(ValidationError, match="outside"):
        device.read_buffer(buffer, 8, 4)
    with pytest.raises(ValidationError, match="uniform buffer"):
        device.read_buffer(uniform, 0, 4)
    device.write_buffer(uniform, 0, u32(1, 2, 3, 4))  # uniform buffers are COPY_DST
    assert read_u32(device, buffer, 0, 2) == [0, 0]
    device.destroy_buffer(buffer)
    device.destroy_buffer(uniform)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (lambda c, a, b, u: c.add_copy(a, 0, a, 8, 4), "source and destination are both"),
        (lambda c, a, b, u: c.add_copy(a, 2, b, 0, 4), "offset is 2"),
        (lambda c, a, b, u: c.add_copy(a, 0, b, 0, 6), "size is 6"),
        (lambda c, a, b, u: c.add_copy(a, 12, b, 0, 8), "outside buffer"),
        (lambda c, a, b, u: c.add_copy(u, 0, b, 0, 4), "uniform buffer"),
        (lambda c, a, b, u: c.add_clear(a, 0, 20), "outside buffer"),
        (lambda c, a, b, u: c.add_clear(b, 1, 4), "offset is 1"),
        (lambda c, a, b, u: c.add_copy(a, 0, 123456, 0, 4), "123456 is not a handle"),
    ],
)
def test_invalid_command_list_raises_at_submit_and_executes_nothing(device: FakeDevice, record, message) -> None:  # type: ignore[no-untyped-def]
    a, b, u = device.create_buffer(16), device.create_buffer(16), device.create_buffer(16, uniform=True)
    device.write_buffer(a, 0, u32(1, 2, 3, 4))
    commands = CommandList()
    commands.add_copy(a, 0, b, 0, 16)  # valid, but must not run
    commands.add_clear(a, 0, 16)  # valid, but must not run
    record(commands, a, b, u)  # recording never validates
    with pytest.raises(ValidationError, match=message):
        device.submit(commands)
    assert read_u32(device, a, 0, 4) == [1, 2, 3, 4]
    assert read_u32(device, b, 0, 4) == [0, 0, 0, 0]
    assert device.stats.submits == 0 and device.stats.copies == 0
    for buffer in (a, b, u):
        device.destroy_buffer(buffer)


def test_stale_and_wrong_kind_handles_are_named(device: FakeDevice) -> None:
    buffer = device.create_buffer(4, label="weights")
    pipeline = device.create_compute_pipeline(ADD_ONE, twin=add_one, label="add_one")
    device.destroy_buffer(buffer)
    with pytest.raises(ValidationError, match=rf"buffer {buffer} \('weights'\) was already freed"):
        device.read_buffer(buffer, 0, 4)
    with pytest.raises(ValidationError, match=rf"buffer {buffer} \('weights'\) was already freed"):
        device.destroy_buffer(buffer)
    with pytest.raises(ValidationError, match=rf"pipeline {pipeline} \('add_one'\) is a pipeline, not a buffer"):
        device.write_buffer(pipeline, 0, u32(1))
    with pytest.raises(ValidationError, match="is a buffer, not a pipeline"):
        device.create_bind_group(device.create_buffer(4), [])
    with pytest.raises(ValidationError, match="not a handle of the fake backend"):
        device.release_bind_group(10**9)
    device.release_pipeline(pipeline)
    assert device.live_handles() == 1  # the buffer created inline above
    device.destroy()


# -- pipelines, bind groups, dispatches ----------------------------------------------------


def test_pipeline_needs_a_twin(device: FakeDevice) -> None:
    with pytest.raises(ValidationError, match="must provide a numpy twin for the fake backend"):
        device.create_compute_pipeline(ADD_ONE, label="add_one")
    with pytest.raises(ValidationError, match="no compute entry point 'other'"):
        device.create_compute_pipeline(ADD_ONE, entry_point="other", twin=add_one)
    with pytest.raises(ValidationError, match="workgroup_size"):
        device.create_compute_pipeline(ADD_ONE.replace("@workgroup_size(64)", "@workgroup_size(16, 32)"), twin=add_one)
    assert device.live_handles() == 0


def test_twin_receives_bound_ranges_in_binding_order(device: FakeDevice) -> None:
    src = device.create_buffer(512, label="src")
    dst = device.create_buffer(1024, label="dst")
    params = device.create_buffer(16, uniform=True, label="params")
    device.write_buffer(src, 256, u32(1, 2, 3, 4))
    device.write_buffer(params, 0, u32(10, 0, 0, 0))
    seen: list[tuple[list[int], tuple[int, int, int]]] = []

    def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        seen.append(([a.size for a in arrays], grid))
        assert all(a.dtype == np.uint8 and a.flags.writeable for a in arrays)
        scale(arrays, grid)

    pipeline = device.create_compute_pipeline(SCALE, twin=twin, label="scale")
    bind_group = device.create_bind_group(
        pipeline,
        [BindingEntry(2, params, 0, 16), BindingEntry(1, dst, 512, 16), BindingEntry(0, src, 256, 16)],
    )
    commands = CommandList()
    commands.add_dispatch(pipeline, bind_group, 1, 2, 3)
    commands.add_dispatch(pipeline, bind_group, 0)  # empty grid: counted, twin not run
    device.submit(commands)
    assert seen == [([16, 16, 16], (1, 2, 3))]
    assert read_u32(device, dst, 512, 4) == [10, 20, 30, 40]
    assert read_u32(device, dst, 0, 1) == [0] and read_u32(device, dst, 528, 1) == [0]
    assert device.stats.dispatches == 2
    assert device.live_handles() == 5
    device.release_bind_group(bind_group)
    device.release_pipeline(pipeline)
    for buffer in (src, dst, params):
        device.destroy_buffer(buffer)
    assert device.live_handles() == 0


def test_frozen_command_list_replays(device: FakeDevice) -> None:
    buffer = device.create_buffer(8)
    pipeline = device.create_compute_pipeline(ADD_ONE, twin=add_one)
    bind_group = device.create_bind_group(pipeline, [BindingEntry(0, buffer, 0, 8)])
    commands = CommandList()
    commands.add_dispatch(pipeline, bind_group, 1)
    commands.freeze()
    for _ in range(3):
        device.submit(commands)
    assert read_u32(device, buffer, 0, 2) == [3, 3]
    assert (device.stats.submits, device.stats.dispatches) == (3, 3)
    device.destroy()


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (
            lambda s, d, p: [BindingEntry(0, s, 0, 16), BindingEntry(1, d, 0, 16)],
            r"no entry for the shader's binding\(s\) \[2\]",
        ),
        (
            lambda s, d, p: [
                BindingEntry(0, s, 0, 16),
                BindingEntry(1, d, 0, 16),
                BindingEntry(2, p, 0, 16),
                BindingEntry(3, d, 256, 16),
            ],
            "declares no @group",
        ),
        (
            lambda s, d, p: [BindingEntry(0, s, 0, 16), BindingEntry(1, d, 0, 16), BindingEntry(2, s, 256, 16)],
            "declares a uniform binding",
        ),
        (
            lambda s, d, p: [BindingEntry(0, p, 0, 16), BindingEntry(1, d, 0, 16), BindingEntry(2, p, 0, 16)],
            "declares a storage binding",
        ),
        (
            lambda s, d, p: [BindingEntry(0, s, 4, 16), BindingEntry(1, d, 0, 16), BindingEntry(2, p, 0, 16)],
            "not a multiple of 256",
        ),
        (
            lambda s, d, p: [BindingEntry(0, s, 0, 0), BindingEntry(1, d, 0, 16), BindingEntry(2, p, 0, 16)],
            "must be positive",
        ),
        (
            lambda s, d, p: [BindingEntry(0, s, 256, 512), BindingEntry(1, d, 0, 16), BindingEntry(2, p, 0, 16)],
            "outside buffer",
        ),
        (lambda s, d, p: [BindingEntry(0, s, 0, 16), BindingEntry(0, d, 0, 16), BindingEntry(2, p, 0, 16)], "distinct"),
    ],
)
def test_bind_group_validation(device: FakeDevice, entries, message) -> None:  # type: ignore[no-untyped-def]
    src, dst, params = device.create_buffer(512), device.create_buffer(512), device.create_buffer(16, uniform=True)
    pipeline = device.create_compute_pipeline(SCALE, twin=scale)
    with pytest.raises(ValidationError, match=message):
        device.create_bind_group(pipeline, entries(src, dst, params))
    assert device.live_handles() == 4
    device.destroy()


def test_binding_size_and_count_limits() -> None:
    limits = fake_limits(max_storage_buffer_binding_size=64, max_storage_buffers_per_shader_stage=2)
    device = FakeBackend(devices=[FakeDeviceSpec(limits=limits)]).open_device(0)
    buffer = device.create_buffer(1024)
    pipeline = device.create_compute_pipeline("", twin=add_one)  # nothing declared: only limits checked
    with pytest.raises(ValidationError, match="max_storage_buffer_binding_size 64"):
        device.create_bind_group(pipeline, [BindingEntry(0, buffer, 0, 128)])
    with pytest.raises(ValidationError, match="3 storage bindings exceed"):
        device.create_bind_group(pipeline, [BindingEntry(i, buffer, 256 * i, 16) for i in range(3)])
    device.destroy()


def test_dispatch_validation_is_atomic(device: FakeDevice) -> None:
    buffer = device.create_buffer(8)
    pipeline = device.create_compute_pipeline(ADD_ONE, twin=add_one)
    other = device.create_compute_pipeline(ADD_ONE, twin=add_one)
    bind_group = device.create_bind_group(pipeline, [BindingEntry(0, buffer, 0, 8)])

    def attempt(x: int, pipe: int = pipeline, y: int = 1, z: int = 1) -> None:
        commands = CommandList()
        commands.add_dispatch(pipeline, bind_group, 1)  # valid, must not run
        commands.add_dispatch(pipe, bind_group, x, y, z)
        device.submit(commands)

    with pytest.raises(ValidationError, match="max_compute_workgroups_per_dimension 65535"):
        attempt(65536)
    with pytest.raises(ValidationError, match="65535"):
        attempt(1, z=70000)
    with pytest.raises(ValidationError, match="automatic layouts are not shared"):
        attempt(1, pipe=other)
    attempt(65535)  # at the limit: fine
    assert read_u32(device, buffer, 0, 2) == [2, 2]
    device.release_pipeline(other)
    with pytest.raises(ValidationError, match=f"pipeline {other} was already freed"):
        attempt(1, pipe=other)
    device.destroy_buffer(buffer)
    with pytest.raises(ValidationError, match=f"uses buffer {buffer} at binding 0, which was destroyed"):
        attempt(1)
    device.release_bind_group(bind_group)
    device.release_pipeline(pipeline)
    assert device.live_handles() == 0


def test_writable_binding_sharing_a_buffer_is_rejected_at_submit(device: FakeDevice) -> None:
    # wgpu-native rejects a read_write binding sharing its buffer with another
    # binding of the same dispatch, even on disjoint ranges.
    shared, other, params = (
        device.create_buffer(1024),
        device.create_buffer(1024),
        device.create_buffer(16, uniform=True),
    )
    pipeline = device.create_compute_pipeline(SCALE, twin=scale)
    separate = device.create_bind_group(
        pipeline, [BindingEntry(0, shared, 0, 256), BindingEntry(1, other, 0, 16), BindingEntry(2, params, 0, 16)]
    )
    disjoint = device.create_bind_group(
        pipeline, [BindingEntry(0, shared, 0, 256), BindingEntry(1, shared, 512, 16), BindingEntry(2, params, 0, 16)]
    )
    commands = CommandList()
    commands.add_dispatch(pipeline, separate, 1)
    device.submit(commands)
    commands.add_dispatch(pipeline, disjoint, 1)
    with pytest.raises(ValidationError, match="both use buffer .* read_write"):
        device.validate_commands(commands)
    with pytest.raises(ValidationError, match="both use buffer .* read_write"):
        device.submit(commands)
    assert device.stats.dispatches == 1
    device.destroy()


def test_validate_commands_executes_nothing_and_is_not_a_submit(backend: FakeBackend, device: FakeDevice) -> None:
    buffer = device.create_buffer(8)
    commands = CommandList()
    commands.add_clear(buffer, 0, 8)
    device.write_buffer(buffer, 0, u32(1, 2))
    backend.faults.validation_error_on_submit(1)
    device.validate_commands(commands)  # valid; does not consume the fault
    assert read_u32(device, buffer, 0, 2) == [1, 2] and device.stats.submits == 0
    with pytest.raises(ValidationError, match="injected"):
        device.submit(commands)
    commands.add_clear(buffer, 4, 8)
    with pytest.raises(ValidationError, match="outside"):
        device.validate_commands(commands)
    device.destroy_buffer(buffer)


def test_close_destroys_every_device(backend: FakeBackend) -> None:
    first, second = backend.open_device(0), backend.open_device(0)
    first.create_buffer(4)
    second.create_buffer(4)
    backend.close()
    backend.close()
    assert first.destroyed and second.destroyed and backend.live_handles() == 0
    backend.open_device(0).destroy()  # a closed fake backend still opens devices


# -- faults --------------------------------------------------------------------------------


def test_out_of_memory_on_nth_allocation_across_devices(backend: FakeBackend) -> None:
    first, second = backend.open_device(0), backend.open_device(0)
    backend.faults.out_of_memory_on_allocation(3)
    assert [f.kind for f in backend.faults.pending] == ["out_of_memory_on_allocation"]
    a = first.create_buffer(4)
    b = second.create_buffer(4)
    with pytest.raises(OutOfMemoryError, match="cannot allocate 8 bytes") as caught:
        first.create_buffer(8, label="third")
    assert isinstance(caught.value, MemoryError)
    assert backend.live_handles() == 2 and first.stats.live_buffer_bytes == 4
    c = first.create_buffer(8)  # fires once
    assert backend.faults.pending == ()
    for device, buffer in ((first, a), (second, b), (first, c)):
        device.destroy_buffer(buffer)


def test_memory_size_bounds_live_bytes() -> None:
    device = FakeBackend(devices=[FakeDeviceSpec(memory_size=64)]).open_device(0)
    a = device.create_buffer(48)
    with pytest.raises(OutOfMemoryError, match="48 of 64 bytes are in use"):
        device.create_buffer(32)
    device.destroy_buffer(a)
    b = device.create_buffer(64)
    assert device.stats.peak_buffer_bytes == 64
    device.destroy_buffer(b)
    assert device.stats.live_buffer_bytes == 0


def test_lost_device_raises_everywhere_but_frees(device: FakeDevice, backend: FakeBackend) -> None:
    buffer = device.create_buffer(4)
    pipeline = device.create_compute_pipeline(ADD_ONE, twin=add_one)
    bind_group = device.create_bind_group(pipeline, [BindingEntry(0, buffer, 0, 4)])
    device.lose("driver reset")
    assert device.lost and device.lost_reason == "driver reset"
    calls = [
        lambda: device.create_buffer(4),
        lambda: device.write_buffer(buffer, 0, u32(1)),
        lambda: device.read_buffer(buffer, 0, 4),
        lambda: device.create_compute_pipeline(ADD_ONE, twin=add_one),
        lambda: device.create_bind_group(pipeline, [BindingEntry(0, buffer, 0, 4)]),
        lambda: device.submit(CommandList()),
        device.wait_idle,
    ]
    for call in calls:
        with pytest.raises(DeviceLostError, match="driver reset"):
            call()
    frees = [
        lambda: device.release_bind_group(bind_group),
        lambda: device.release_pipeline(pipeline),
        lambda: device.destroy_buffer(buffer),
    ]
    assert device.live_handles() == 3 and not device.destroyed  # lost objects exist until freed
    frees[0]()  # freeing works on a lost device (cleanup paths need no special case)
    assert backend.live_handles() == 2
    device.destroy()
    device.destroy()  # idempotent
    assert device.destroyed and backend.live_handles() == 0
    for call in calls:
        with pytest.raises(ReleasedValueError, match="destroyed"):
            call()
    frees[1]()  # freed by destroy(): releasing afterwards does nothing
    frees[2]()
    with pytest.raises(ValidationError, match="already freed"):
        frees[0]()  # but a real double free is still caught


def test_lose_device_on_nth_submit(backend: FakeBackend, device: FakeDevice) -> None:
    buffer = device.create_buffer(4)
    pipeline = device.create_compute_pipeline(ADD_ONE, twin=add_one)
    bind_group = device.create_bind_group(pipeline, [BindingEntry(0, buffer, 0, 4)])
    commands = CommandList()
    commands.add_dispatch(pipeline, bind_group, 1)
    backend.faults.lose_device_on_submit(2, reason="TDR")
    device.submit(commands)
    with pytest.raises(DeviceLostError, match="TDR"):
        device.submit(commands)
    assert (device.stats.submits, device.stats.dispatches) == (1, 1)  # the failed submit ran nothing
    with pytest.raises(DeviceLostError):
        device.read_buffer(buffer, 0, 4)
    other = backend.open_device(0)  # a fresh device works
    assert other.read_buffer(other.create_buffer(4), 0, 4) == bytes(4)


def test_validation_error_on_nth_submit(backend: FakeBackend, device: FakeDevice) -> None:
    buffer = device.create_buffer(4)
    commands = CommandList()
    commands.add_clear(buffer, 0, 4)
    device.write_buffer(buffer, 0, u32(5))
    backend.faults.validation_error_on_submit(1, message="boom")
    with pytest.raises(ValidationError, match="boom"):
        device.submit(commands)
    assert read_u32(device, buffer) == [5]  # nothing executed
    device.submit(commands)  # fires once
    assert read_u32(device, buffer) == [0]
    device.destroy_buffer(buffer)


def test_faults_can_be_cleared_and_are_checked(backend: FakeBackend, device: FakeDevice) -> None:
    backend.faults.out_of_memory_on_allocation(1)
    backend.faults.validation_error_on_submit(1)
    backend.faults.lose_device_on_submit(2)
    assert len(backend.faults.pending) == 3
    backend.faults.clear()
    assert len(backend.faults.pending) == 0
    device.destroy_buffer(device.create_buffer(4))
    device.submit(CommandList())
    device.submit(CommandList())
    assert not device.lost
    for bad in (0, -1, True):
        with pytest.raises(InvalidArgumentError):
            backend.faults.out_of_memory_on_allocation(bad)


# -- accounting ----------------------------------------------------------------------------


def test_stats_count_work_that_took_effect(device: FakeDevice) -> None:
    a, b = device.create_buffer(16), device.create_buffer(16)
    device.write_buffer(a, 0, u32(1, 2, 3, 4))
    commands = CommandList()
    commands.add_copy(a, 0, b, 0, 8)
    commands.add_clear(b, 0, 4)
    device.submit(commands)
    device.read_buffer(b, 0, 12)
    stats = device.stats
    assert (stats.submits, stats.copies, stats.clears, stats.dispatches) == (1, 1, 1, 0)
    assert (stats.writes, stats.bytes_written, stats.reads, stats.bytes_read, stats.bytes_copied) == (1, 16, 1, 12, 8)
    assert (stats.buffers_created, stats.live_buffer_bytes, stats.peak_buffer_bytes) == (2, 32, 32)
    stats.submits = 99  # a copy: the device's counters are unaffected
    assert device.stats.submits == 1
    device.reset_stats()
    assert device.stats.submits == 0 and device.stats.live_buffer_bytes == 32
    device.destroy_buffer(a)
    device.destroy_buffer(b)


def test_live_handles_and_descriptions(backend: FakeBackend, device: FakeDevice) -> None:
    buffer = device.create_buffer(4, label="leaky")
    pipeline = device.create_compute_pipeline(ADD_ONE, twin=add_one, label="add_one")
    bind_group = device.create_bind_group(pipeline, [BindingEntry(0, buffer, 0, 4)])
    assert (device.live_handles(), backend.live_handles()) == (3, 3)
    assert backend.describe_live_handles() == [
        f"fake device #0 (Fake WebGPU device): buffer {buffer} ('leaky')",
        f"fake device #0 (Fake WebGPU device): pipeline {pipeline} ('add_one')",
        f"fake device #0 (Fake WebGPU device): bind group {bind_group} ('add_one')",
    ]
    device.destroy_buffer(buffer)  # a bind group does not keep its buffers counted
    device.release_pipeline(pipeline)
    assert backend.live_handles() == 1
    device.release_bind_group(bind_group)
    assert backend.live_handles() == 0 and backend.describe_live_handles() == []
