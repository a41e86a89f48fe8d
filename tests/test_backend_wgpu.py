"""The wgpu backend on a real device (lavapipe on CI and development machines).

One backend and one device serve the whole module (opening a device on
lavapipe is slow); tests that break a device open their own.
"""

from __future__ import annotations

import gc
import threading
from typing import Any, Iterator

import numpy as np
import pytest
from helpers import SCALE_KERNEL

from ortgpu_core._errors import (
    DeviceLostError,
    InvalidArgumentError,
    OutOfMemoryError,
    ReleasedValueError,
    ValidationError,
)
from ortgpu_core.backends import _cdef
from ortgpu_core.backends._commands import HANDLE_ADDRESS_MASK, CommandList
from ortgpu_core.backends._device_calls import UNCAPTURED_ERROR_CALLBACK
from ortgpu_core.backends._wgpu_chunked_reads import CHUNKED_READ_MIN
from ortgpu_core.backends.protocol import AdapterInfo, Backend, BackendDevice, BindingEntry
from ortgpu_core.backends.wgpu_native import (
    WgpuBackend,
    WgpuDevice,
    choose_default_adapter,
    feature_name,
    load_native,
)

pytestmark = pytest.mark.wgpu_only

ADD_KERNEL = """
struct Params { count: u32, row: u32, scale: f32, pad: u32 }
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    // A 2-D grid: params.row invocations per grid row.
    let i = gid.x + gid.y * params.row;
    if (i < params.count) {
        out[i] = (a[i] + b[i]) * params.scale;
    }
}
"""

F16_KERNEL = """
enable f16;
@group(0) @binding(0) var<storage, read> x: array<f16>;
@group(0) @binding(1) var<storage, read_write> y: array<f16>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < arrayLength(&y)) {
        y[i] = x[i] * 2.0h + 1.0h;
    }
}
"""


@pytest.fixture(scope="module")
def backend() -> Iterator[WgpuBackend]:
    instance = WgpuBackend()
    yield instance
    instance.close()


@pytest.fixture(scope="module")
def device(backend: WgpuBackend) -> Iterator[WgpuDevice]:
    opened = backend.open_device(backend.default_adapter_index())
    yield opened
    opened.destroy()


@pytest.fixture
def clean(device: WgpuDevice) -> Iterator[WgpuDevice]:
    """The shared device; fails the test if it leaves handles behind."""
    before = device.live_handles()
    yield device
    assert device.live_handles() == before, "the test leaked buffers, pipelines or bind groups"


def _params(count: int, row: int, scale: float) -> bytes:
    return np.array([count, row], np.uint32).tobytes() + np.array([scale], np.float32).tobytes() + bytes(4)


class AddKernel:
    """The add kernel with its buffers, released by ``close``."""

    def __init__(self, device: WgpuDevice, count: int, row: int) -> None:
        self.device = device
        self.count = count
        size = 4 * count
        self.pipeline = device.create_compute_pipeline(ADD_KERNEL, label="add")
        self.a = device.create_buffer(size, label="a")
        self.b = device.create_buffer(size, label="b")
        self.out = device.create_buffer(size, label="out")
        self.params = device.create_buffer(16, uniform=True, label="params")
        self.bind_group = device.create_bind_group(
            self.pipeline,
            [
                BindingEntry(0, self.a, 0, size),
                BindingEntry(1, self.b, 0, size),
                BindingEntry(2, self.out, 0, size),
                BindingEntry(3, self.params, 0, 16),
            ],
        )

    def close(self) -> None:
        self.device.release_bind_group(self.bind_group)
        for buffer in (self.a, self.b, self.out, self.params):
            self.device.destroy_buffer(buffer)
        self.device.release_pipeline(self.pipeline)


# -- the generated cdef -------------------------------------------------------------


def test_cdef_matches_installed_headers() -> None:
    committed = _cdef.generated_cdef_path().read_text(encoding="utf-8")
    assert _cdef.generate_cdef() == committed, (
        "resources/wgpu_native.cdef.h is stale: run python -m ortgpu_core.backends._cdef"
    )


def test_cdef_constants_and_preprocessor() -> None:
    _, lib = load_native()
    assert lib.WGPUBufferUsage_Storage == 0x80
    assert lib.WGPU_WHOLE_SIZE == 2**64 - 1
    assert lib.WGPUInstanceBackend_Primary == (1 << 0) | (1 << 2) | (1 << 3) | (1 << 5)
    text = '#define A_ATTR\n#ifdef __cplusplus\nextern "C" {\n#endif\ntypedef int T A_ATTR; // c\n#define K (UINT32_C(3))\n'
    assert _cdef.preprocess_header(text) == "typedef int T;\n#define K 0x3\n"


def test_feature_names() -> None:
    assert feature_name("ShaderF16") == "shader-f16"
    assert feature_name("TimestampQuery") == "timestamp-query"
    assert feature_name("Subgroups") == "subgroups"
    assert feature_name("Depth32FloatStencil8") == "depth32float-stencil8"
    assert feature_name("ShaderInt64") == "shader-int64"


# -- adapters and devices -----------------------------------------------------------------


def test_enumerate_adapters(backend: WgpuBackend) -> None:
    adapters = backend.enumerate_adapters()
    assert isinstance(backend, Backend) and backend.name == "wgpu"
    assert adapters, "wgpu-native found no adapter"
    for index, info in enumerate(adapters):
        assert info.index == index
        assert info.name and isinstance(info.driver, str)
        assert 0 <= info.vendor_id < 2**32 and 0 <= info.device_id < 2**32
        assert info.backend_type in {"Vulkan", "OpenGL", "OpenGLES", "Metal", "D3D12", "D3D11", "WebGPU", "Null"}
        assert info.adapter_type in {"DiscreteGPU", "IntegratedGPU", "CPU", "Unknown"}
    assert any(info.backend_type == "Vulkan" for info in adapters), "lavapipe or a GPU should show up as Vulkan"


def _info(index: int, backend_type: str, adapter_type: str) -> AdapterInfo:
    return AdapterInfo(index, 0x10DE, 1, f"gpu{index}", "driver", backend_type, adapter_type)


def test_default_adapter_choice(backend: WgpuBackend) -> None:
    gl_discrete = _info(0, "OpenGL", "DiscreteGPU")
    cpu_vulkan = _info(1, "Vulkan", "CPU")
    vulkan_discrete = _info(2, "Vulkan", "DiscreteGPU")
    integrated = _info(3, "Vulkan", "IntegratedGPU")
    cpu_gl = _info(4, "OpenGL", "CPU")
    assert choose_default_adapter([gl_discrete, cpu_vulkan, vulkan_discrete, integrated]) == 2
    assert choose_default_adapter([gl_discrete, cpu_vulkan]) == 0
    assert choose_default_adapter([cpu_gl, cpu_vulkan, integrated]) == 3
    assert choose_default_adapter([cpu_gl, cpu_vulkan]) == 1
    chosen = backend.enumerate_adapters()[backend.default_adapter_index()]
    assert chosen.backend_type == "Vulkan"


def test_device_limits_are_the_adapters(backend: WgpuBackend, device: WgpuDevice) -> None:
    assert isinstance(device, BackendDevice)
    assert device.limits == backend.adapter_limits(device.info.index)
    assert device.limits.max_compute_workgroups_per_dimension >= 65535
    if device.info.adapter_type == "CPU":  # lavapipe: larger than WebGPU's 256 MiB default
        assert device.limits.max_buffer_size > 256 * 2**20
    assert "shader-f16" in device.features or device.info.backend_type == "OpenGL"
    assert all(isinstance(name, str) and name == name.lower() for name in device.features)


def test_open_device_bad_index(backend: WgpuBackend) -> None:
    with pytest.raises(ValidationError, match="out of range"):
        backend.open_device(len(backend.enumerate_adapters()))


# -- buffers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [4, 12, 256, 4096, 65540, 3 * 2**20 + 4])
def test_write_read_round_trip(clean: WgpuDevice, size: int) -> None:
    device = clean
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    buffer = device.create_buffer(size + 8)
    try:
        assert device.read_buffer(buffer, 0, size + 8) == bytes(size + 8), "new buffers are zero-filled"
        device.write_buffer(buffer, 4, data)
        assert device.read_buffer(buffer, 4, size) == data
        assert device.read_buffer(buffer, 0, 4) == bytes(4)
        device.write_buffer(buffer, 0, memoryview(bytearray(b"\x01\x02\x03\x04")))
        assert device.read_buffer(buffer, 0, 8) == b"\x01\x02\x03\x04" + data[:4]
    finally:
        device.destroy_buffer(buffer)


def test_buffer_argument_errors(clean: WgpuDevice) -> None:
    device = clean
    buffer = device.create_buffer(64)
    try:
        with pytest.raises(ValidationError, match="multiple of 4"):
            device.create_buffer(6)
        with pytest.raises(ValidationError, match="multiple of 4"):
            device.write_buffer(buffer, 2, bytes(4))
        with pytest.raises(ValidationError, match="multiple of 4"):
            device.read_buffer(buffer, 0, 5)
        with pytest.raises(ValidationError, match="past the buffer"):
            device.write_buffer(buffer, 60, bytes(8))
        with pytest.raises(ValidationError, match="past the buffer"):
            device.read_buffer(buffer, 32, 64)
        with pytest.raises(ValidationError, match="not a live buffer"):
            device.read_buffer(12345, 0, 4)
    finally:
        device.destroy_buffer(buffer)
    with pytest.raises(ValidationError, match="released or never existed"):
        device.destroy_buffer(buffer)
    with pytest.raises(ValidationError):
        device.write_buffer(buffer, 0, bytes(4))


def test_buffer_over_the_limit_is_a_typed_error(clean: WgpuDevice) -> None:
    device = clean
    limit = device.limits.max_buffer_size
    too_big = limit - limit % 4 + 4
    with pytest.raises(ValidationError) as raised:
        device.create_buffer(too_big)
    assert str(too_big) in str(raised.value) and str(limit) in str(raised.value)
    assert not isinstance(raised.value, OutOfMemoryError)


# -- kernels -------------------------------------------------------------------------------


def test_add_kernel_with_copies_and_clears(clean: WgpuDevice) -> None:
    device = clean
    count = 1000
    kernel = AddKernel(device, count, row=count)
    scratch = device.create_buffer(4 * count, label="scratch")
    try:
        rng = np.random.default_rng(0)
        a = rng.standard_normal(count, dtype=np.float32)
        b = rng.standard_normal(count, dtype=np.float32)
        device.write_buffer(kernel.a, 0, a.tobytes())
        device.write_buffer(kernel.params, 0, _params(count, count, 2.0))
        device.write_buffer(scratch, 0, b.tobytes())
        groups = (count + 63) // 64
        commands = CommandList()
        commands.add_copy(scratch, 0, kernel.b, 0, 4 * count)  # b <- scratch
        commands.add_clear(scratch, 0, 4 * count)  # scratch <- 0
        commands.add_dispatch(kernel.pipeline, kernel.bind_group, groups)  # out = (a + b) * 2
        commands.add_copy(kernel.out, 0, scratch, 0, 4 * count)  # scratch <- out
        commands.add_clear(kernel.out, 0, 400)  # out[:100] <- 0
        commands.add_dispatch(kernel.pipeline, kernel.bind_group, groups)  # out = (a + b) * 2 again
        commands.add_clear(kernel.out, 4 * 900, 400)  # out[900:] <- 0
        device.submit(commands)
        expected = (a + b) * np.float32(2.0)
        got_scratch = np.frombuffer(device.read_buffer(scratch, 0, 4 * count), np.float32)
        got_out = np.frombuffer(device.read_buffer(kernel.out, 0, 4 * count), np.float32)
        np.testing.assert_allclose(got_scratch, expected, rtol=1e-6)
        np.testing.assert_allclose(got_out[:900], expected[:900], rtol=1e-6)
        assert not got_out[900:].any()
        # A submitted list can be submitted again (a frozen list is what replay uses);
        # this time b <- scratch holds the first result.
        device.write_buffer(kernel.params, 0, _params(count, count, -1.0))
        device.submit(commands.freeze())
        got_out = np.frombuffer(device.read_buffer(kernel.out, 0, 4 * count), np.float32)
        np.testing.assert_allclose(got_out[:900], -(a + expected)[:900], rtol=1e-6)
    finally:
        device.destroy_buffer(scratch)
        kernel.close()


def test_two_dimensional_grid(clean: WgpuDevice) -> None:
    device = clean
    max_groups = device.limits.max_compute_workgroups_per_dimension
    count = 64 * (max_groups + 3)  # one dimension is not enough
    groups = (count + 63) // 64
    grid_x = 1024
    grid_y = (groups + grid_x - 1) // grid_x
    kernel = AddKernel(device, count, row=grid_x * 64)
    try:
        a = np.arange(count, dtype=np.float32)
        device.write_buffer(kernel.a, 0, a.tobytes())
        device.write_buffer(kernel.b, 0, np.ones(count, np.float32).tobytes())
        device.write_buffer(kernel.params, 0, _params(count, grid_x * 64, 1.0))
        too_wide = CommandList()
        too_wide.add_dispatch(kernel.pipeline, kernel.bind_group, groups)
        with pytest.raises(ValidationError, match="workgroups per dimension"):
            device.submit(too_wide)
        commands = CommandList()
        commands.add_dispatch(kernel.pipeline, kernel.bind_group, grid_x, grid_y)
        device.submit(commands)
        got = np.frombuffer(device.read_buffer(kernel.out, 0, 4 * count), np.float32)
        np.testing.assert_array_equal(got, a + 1)
    finally:
        kernel.close()


def test_invalid_command_buffer_is_not_submitted(clean: WgpuDevice) -> None:
    """Past the Python checks, the C loop refuses a buffer Finish reported invalid (wgpu-native would abort)."""
    device = clean
    kernel = AddKernel(device, 64, row=64)
    try:
        commands = CommandList()
        commands.add_dispatch(
            kernel.pipeline, kernel.bind_group, device.limits.max_compute_workgroups_per_dimension + 1
        )
        assert commands.encode_submit_native(device.native_table) is False
        with pytest.raises(ValidationError, match="65535"):
            device.wait_idle()  # the collected error is raised by the next call
        device.write_buffer(kernel.params, 0, _params(64, 64, 1.0))
        device.write_buffer(kernel.a, 0, np.full(64, 3, np.float32).tobytes())
        ok = CommandList()
        ok.add_dispatch(kernel.pipeline, kernel.bind_group, 1)
        device.submit(ok)  # the device still works
        assert np.frombuffer(device.read_buffer(kernel.out, 0, 256), np.float32).tolist() == [3.0] * 64
    finally:
        kernel.close()


def test_submit_rejects_stale_and_mismatched_handles(clean: WgpuDevice) -> None:
    device = clean
    kernel = AddKernel(device, 64, row=64)
    other = device.create_compute_pipeline(ADD_KERNEL)
    try:
        mismatched = CommandList()
        mismatched.add_dispatch(other, kernel.bind_group, 1)
        with pytest.raises(ValidationError, match="was made for pipeline"):
            device.submit(mismatched)
        copy_past_end = CommandList()
        copy_past_end.add_copy(kernel.a, 0, kernel.b, 8, 256)
        with pytest.raises(ValidationError, match="past the end"):
            device.submit(copy_past_end)
        unaligned_clear = CommandList()
        unaligned_clear.add_clear(kernel.a, 2, 4)
        with pytest.raises(ValidationError, match="multiple of 4"):
            device.submit(unaligned_clear)
        with pytest.raises(ValidationError, match="both as read-only and as read_write"):
            device.create_bind_group(
                kernel.pipeline,
                [
                    BindingEntry(0, kernel.a, 0, 128),
                    BindingEntry(1, kernel.b, 0, 128),
                    BindingEntry(2, kernel.a, 128, 128),
                    BindingEntry(3, kernel.params, 0, 16),
                ],
            )
    finally:
        device.release_pipeline(other)
        kernel.close()
    stale = CommandList()
    stale.add_dispatch(kernel.pipeline, kernel.bind_group, 1)
    with pytest.raises(ValidationError, match="not a live pipeline"):
        device.submit(stale)


def test_destroyed_buffer_in_bind_group(clean: WgpuDevice) -> None:
    device = clean
    kernel = AddKernel(device, 64, row=64)
    try:
        device.destroy_buffer(kernel.b)
        commands = CommandList()
        commands.add_dispatch(kernel.pipeline, kernel.bind_group, 1)
        with pytest.raises(ValidationError, match="a buffer of bind group"):
            device.submit(commands)
        kernel.b = device.create_buffer(256)  # so close() has something to destroy
    finally:
        kernel.close()


def test_wgsl_compile_error(clean: WgpuDevice) -> None:
    device = clean
    with pytest.raises(ValidationError) as raised:
        device.create_compute_pipeline("@compute @workgroup_size(1) fn main() { let x: f32 = undefined_name; }")
    assert "undefined_name" in str(raised.value)
    assert "WGSL compilation failed" in str(raised.value)
    with pytest.raises(ValidationError, match="entry_point='nope'"):
        device.create_compute_pipeline(ADD_KERNEL, entry_point="nope")


def test_bind_group_argument_errors(clean: WgpuDevice) -> None:
    device = clean
    kernel = AddKernel(device, 64, row=64)
    try:
        with pytest.raises(ValidationError, match="not a multiple of"):
            device.create_bind_group(kernel.pipeline, [BindingEntry(0, kernel.a, 4, 64)])
        with pytest.raises(ValidationError, match="used twice"):
            device.create_bind_group(
                kernel.pipeline, [BindingEntry(0, kernel.a, 0, 64), BindingEntry(0, kernel.b, 0, 64)]
            )
        with pytest.raises(ValidationError):  # binding 3 missing: wgpu-native's own validation
            device.create_bind_group(
                kernel.pipeline,
                [
                    BindingEntry(0, kernel.a, 0, 256),
                    BindingEntry(1, kernel.b, 0, 256),
                    BindingEntry(2, kernel.out, 0, 256),
                ],
            )
        with pytest.raises(ValidationError, match="not a live pipeline"):
            device.create_bind_group(kernel.a, [])
    finally:
        kernel.close()


def test_f16_round_trip(clean: WgpuDevice) -> None:
    device = clean
    # lavapipe (CI) and the H200 both offer shader-f16; an adapter without it must not hide that.
    assert "shader-f16" in device.features, f"{device.info.name} offers no shader-f16"
    count = 300
    x = np.linspace(-4, 4, count).astype(np.float16)
    size = 2 * count
    pipeline = device.create_compute_pipeline(F16_KERNEL, label="f16")
    source = device.create_buffer(size)
    result = device.create_buffer(size)
    bind_group = device.create_bind_group(
        pipeline, [BindingEntry(0, source, 0, size), BindingEntry(1, result, 0, size)]
    )
    try:
        device.write_buffer(source, 0, x.tobytes())
        assert np.array_equal(np.frombuffer(device.read_buffer(source, 0, size), np.float16), x)
        commands = CommandList()
        commands.add_dispatch(pipeline, bind_group, (count + 63) // 64)
        device.submit(commands)
        got = np.frombuffer(device.read_buffer(result, 0, size), np.float16)
        np.testing.assert_array_equal(got, x * np.float16(2) + np.float16(1))
    finally:
        device.release_bind_group(bind_group)
        device.destroy_buffer(source)
        device.destroy_buffer(result)
        device.release_pipeline(pipeline)


# -- lifetime -----------------------------------------------------------------------------


def test_live_handles_return_to_start(backend: WgpuBackend, device: WgpuDevice) -> None:
    start_device, start_backend = device.live_handles(), backend.live_handles()
    kernel = AddKernel(device, 64, row=64)
    assert device.live_handles() == start_device + 6
    assert backend.live_handles() == start_backend + 6
    kernel.close()
    assert device.live_handles() == start_device
    with pytest.raises(ValidationError):
        device.release_bind_group(kernel.bind_group)
    with pytest.raises(ValidationError):
        device.release_pipeline(kernel.pipeline)
    assert backend.live_handles() == start_backend


def test_device_destroy_and_loss(backend: WgpuBackend) -> None:
    device = backend.open_device(backend.default_adapter_index())
    device.create_buffer(64)
    device.create_compute_pipeline(ADD_KERNEL)
    assert device.live_handles() == 2
    device.destroy()
    device.destroy()  # idempotent
    assert device.live_handles() == 0 and device.destroyed
    with pytest.raises(ReleasedValueError, match="destroyed"):
        device.create_buffer(64)

    lost = backend.open_device(backend.default_adapter_index())
    buffer = lost.create_buffer(64)
    _, lib = load_native()
    lib.wgpuDeviceDestroy(lost._device)  # what a driver reset looks like from here
    for call in (lambda: lost.create_buffer(64), lambda: lost.read_buffer(buffer, 0, 4), lost.wait_idle):
        with pytest.raises(DeviceLostError, match="lost"):
            call()
    lost.destroy()


def test_dropping_a_device_releases_it(backend: WgpuBackend) -> None:
    device = backend.open_device(backend.default_adapter_index())
    device.create_buffer(64)
    before = backend.live_handles()
    del device
    gc.collect()
    assert backend.live_handles() == before - 1


def test_native_version_is_wgpu_native_29() -> None:
    from ortgpu_core.backends.wgpu_native import native_version

    major, *rest = native_version().split(".")
    assert major == "29" and len(rest) == 3  # wgpu 0.32 carries wgpu-native 29 (GPU.md)


def test_native_library_is_loaded_once() -> None:
    """Every backend and device must share one cffi instance: cdata of two instances cannot be mixed."""
    from ortgpu_core.backends.wgpu_native import load_native

    assert load_native() is load_native()


# -- waiting: spin, then block -------------------------------------------------------

SLOW_KERNEL = """
@group(0) @binding(0) var<storage, read_write> data: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    var x = gid.x;
    for (var i = 0u; i < 20000u; i = i + 1u) {
        x = x * 1664525u + 1013904223u;
    }
    data[gid.x] = x;
}
"""


def _slow_expected(count: int) -> np.ndarray:
    x = np.arange(count, dtype=np.uint64)
    for _ in range(20000):
        x = (x * 1664525 + 1013904223) & 0xFFFFFFFF
    return x.astype(np.uint32)


@pytest.mark.parametrize("bad", [-1, -0.5, float("nan"), float("inf"), "10", True])
def test_spin_wait_argument_is_checked(bad: object) -> None:

    with pytest.raises(InvalidArgumentError, match="spin_wait_us must be a finite number of microseconds >= 0"):
        WgpuBackend(spin_wait_us=bad)  # type: ignore[arg-type]


def test_default_spin_is_off_on_cpu_adapters(device: WgpuDevice) -> None:
    # on a CPU adapter (lavapipe) a spinning waiter would take a core from the driver's own threads
    from ortgpu_core.backends.wgpu_native import DEFAULT_SPIN_WAIT_US

    expected = 0.0 if device.info.adapter_type == "CPU" else DEFAULT_SPIN_WAIT_US
    assert device.spin_wait_us == expected


@pytest.mark.parametrize("spin_us", [1e6, 1.0])
def test_waits_that_spin_first_still_wait_for_the_work(spin_us: float) -> None:
    """A long spin returns when the work is done; a spin shorter than the work falls back to blocking.  Either way
    wait_idle leaves the queue empty and read_buffer returns the finished result."""
    backend = WgpuBackend(spin_wait_us=spin_us)
    device = backend.open_device(backend.default_adapter_index())
    try:
        assert device.spin_wait_us == spin_us
        count = 64 * 64
        buffer = device.create_buffer(4 * count)
        pipeline = device.create_compute_pipeline(SLOW_KERNEL, label="slow")
        group = device.create_bind_group(pipeline, [BindingEntry(0, buffer, 0, 4 * count)])
        commands = CommandList()
        commands.add_dispatch(pipeline, group, count // 64)
        expected = _slow_expected(count)
        device.submit(commands)
        device.wait_idle()
        # nothing left in flight: a work-done callback registered now fires on the first non-blocking poll
        ffi, lib = load_native()
        fired: list[int] = []
        callback = ffi.callback("WGPUQueueWorkDoneCallback", lambda status, message, u1, u2: fired.append(int(status)))
        info = ffi.new("WGPUQueueWorkDoneCallbackInfo *")
        info.mode = lib.WGPUCallbackMode_AllowProcessEvents
        info.callback = callback
        lib.wgpuQueueOnSubmittedWorkDone(device._queue, info[0])
        lib.wgpuDevicePoll(device._device, 0, ffi.NULL)
        assert fired == [lib.WGPUQueueWorkDoneStatus_Success]
        device.write_buffer(buffer, 0, bytes(4 * count))
        device.submit(commands)
        got = np.frombuffer(device.read_buffer(buffer, 0, 4 * count), np.uint32)
        np.testing.assert_array_equal(got, expected)
        device.release_bind_group(group)
        device.release_pipeline(pipeline)
        device.destroy_buffer(buffer)
        assert device.live_handles() == 0
    finally:
        device.destroy()
        backend.close()


@pytest.mark.parametrize("split", [0, 1, 2, 3, 5])
def test_early_submit_splits_without_changing_results(clean: WgpuDevice, split: int) -> None:
    """The first ``split`` dispatches go in a command buffer of their own; later copies and dispatches that read
    their results still see them (submissions run in order), whatever the split point."""
    device = clean
    count = 256
    kernel = AddKernel(device, count, row=count)
    scratch = device.create_buffer(4 * count, label="scratch")
    try:
        rng = np.random.default_rng(1)
        a = rng.standard_normal(count, dtype=np.float32)
        device.write_buffer(kernel.a, 0, a.tobytes())
        device.write_buffer(kernel.b, 0, bytes(4 * count))
        device.write_buffer(kernel.params, 0, _params(count, count, 1.0))
        commands = CommandList()
        for _ in range(3):  # b <- a + b, three times over: b = 3a
            commands.add_dispatch(kernel.pipeline, kernel.bind_group, count // 64)
            commands.add_copy(kernel.out, 0, kernel.b, 0, 4 * count)
        commands.add_copy(kernel.b, 0, scratch, 0, 4 * count)
        commands.early_submit = split
        assert commands.early_submit == split
        commands.freeze()
        with pytest.raises(RuntimeError, match="frozen"):
            commands.early_submit = 1
        device.submit(commands)
        got = np.frombuffer(device.read_buffer(scratch, 0, 4 * count), np.float32)
        np.testing.assert_allclose(got, 3 * a, rtol=1e-6)
        device.write_buffer(kernel.b, 0, bytes(4 * count))
        phases = commands.profile_native(device.native_table)
        assert phases["submitted"] and phases["encode"] > 0 and phases["finish"] > 0 and phases["submit"] > 0
        got = np.frombuffer(device.read_buffer(scratch, 0, 4 * count), np.float32)
        np.testing.assert_allclose(got, 3 * a, rtol=1e-6)
    finally:
        device.destroy_buffer(scratch)
        kernel.close()


def test_early_submit_argument_is_checked() -> None:
    commands = CommandList()
    with pytest.raises(ValueError, match="early_submit must be >= 0"):
        commands.early_submit = -1
    with pytest.raises(OverflowError):
        commands.early_submit = 2**70
    assert commands.early_submit == 0


# -- command buffers encoded ahead (captured graphs' frozen lists) -----------------------------------------------


def _doubling_list(kernel: AddKernel) -> CommandList:
    """out = (a + b) * scale, for a frozen list that a captured graph would hold."""
    commands = CommandList()
    commands.add_dispatch(kernel.pipeline, kernel.bind_group, (kernel.count + 63) // 64)
    return commands.freeze()


def test_encoded_ahead_replays_see_writes_made_after_encoding(clean: WgpuDevice) -> None:
    """Each submit of a frozen list encodes the next one; that command buffer must still compute on the inputs
    written after it was encoded (a command buffer names buffers; it reads them when it runs)."""
    device = clean
    assert device.encode_ahead
    count = 300
    kernel = AddKernel(device, count, row=count)
    try:
        commands = _doubling_list(kernel)
        device.write_buffer(kernel.params, 0, _params(count, count, 2.0))
        before = device.live_handles()
        for step in range(5):
            a = np.full(count, step, np.float32) + np.arange(count, dtype=np.float32)
            device.write_buffer(kernel.a, 0, a.tobytes())
            device.write_buffer(kernel.b, 0, np.full(count, 0.5 * step, np.float32).tobytes())
            device.submit(commands)
            # from the first submit on, one command buffer waits for the next
            assert device.live_handles() == before + 1
            assert any("encoded ahead" in line for line in device.describe_live_handles())
            got = np.frombuffer(device.read_buffer(kernel.out, 0, 4 * count), np.float32)
            np.testing.assert_array_equal(got, (a + np.float32(0.5 * step)) * np.float32(2.0))
    finally:
        kernel.close()  # releasing the list's handles releases what was encoded for it


@pytest.mark.parametrize("release", ["bind_group", "buffer", "list"])
def test_encoded_ahead_buffer_is_released_with_what_it_uses(clean: WgpuDevice, release: str) -> None:
    device = clean
    count = 64
    kernel = AddKernel(device, count, row=count)
    try:
        commands = _doubling_list(kernel)
        device.write_buffer(kernel.params, 0, _params(count, count, 1.0))
        device.submit(commands)
        device.wait_idle()
        ahead = device.live_handles()
        if release == "list":
            del commands
            gc.collect()
            assert device.live_handles() == ahead - 1
            return
        if release == "bind_group":
            device.release_bind_group(kernel.bind_group)
            kernel.bind_group = device.create_bind_group(
                kernel.pipeline,
                [
                    BindingEntry(0, kernel.a, 0, 4 * count),
                    BindingEntry(1, kernel.b, 0, 4 * count),
                    BindingEntry(2, kernel.out, 0, 4 * count),
                    BindingEntry(3, kernel.params, 0, 16),
                ],
            )
            assert device.live_handles() == ahead - 1  # one bind group swapped, the encoded buffer gone
        else:
            device.destroy_buffer(kernel.b)
            assert device.live_handles() == ahead - 2  # the buffer and the encoded command buffer
            kernel.b = device.create_buffer(4 * count, label="b")
        # the list is checked again and refused (its bind group or buffer is gone), never submitted stale
        with pytest.raises(ValidationError, match="not a live|released|unknown"):
            device.submit(commands)
    finally:
        kernel.close()


def test_encoded_ahead_reads_survive_a_new_staging_buffer(backend: WgpuBackend) -> None:
    """submit_and_read's copies into the staging buffer are encoded ahead too; when a larger read replaces that
    buffer, the encoded copies (which name the old one) are released, and the next read copies into the new one."""
    # A device of its own: its staging buffer is at its first size, which a read below CHUNKED_READ_MIN (reads
    # from there on go in chunks, each in a staging buffer of its own) can outgrow.
    device = backend.open_device(backend.default_adapter_index())
    try:
        _reads_survive_a_new_staging_buffer(device)
        assert device.live_handles() == 0
    finally:
        device.destroy()


def _reads_survive_a_new_staging_buffer(device: WgpuDevice) -> None:
    count = 256
    kernel = AddKernel(device, count, row=count)
    big_size = max(1 << 20, 2 * device._staging_size)
    assert big_size < CHUNKED_READ_MIN
    big = device.create_buffer(big_size, label="big")
    try:
        commands = _doubling_list(kernel)
        device.write_buffer(kernel.params, 0, _params(count, count, 3.0))
        device.write_buffer(kernel.b, 0, bytes(4 * count))
        before = device.live_handles()
        for step in range(4):
            a = np.arange(count, dtype=np.float32) * np.float32(step + 1)
            device.write_buffer(kernel.a, 0, a.tobytes())
            out = np.empty(count, np.float32)
            device.submit_and_read(commands, [(kernel.out, 0, out)])
            np.testing.assert_array_equal(out, a * np.float32(3.0))
            assert device.live_handles() == before + 1
            if step == 1:  # a read larger than the staging buffer replaces it
                device.write_buffer(big, big_size - 4, np.array([7], np.uint32).tobytes())
                assert device.read_buffer(big, 0, big_size)[-4:] == np.array([7], np.uint32).tobytes()
                assert device.live_handles() == before
        # a plain submit of the same list has its own encoded buffer, next to the one with the reads
        device.submit(commands)
        assert device.live_handles() == before + 2
        got = np.frombuffer(device.read_buffer(kernel.out, 0, 4 * count), np.float32)
        np.testing.assert_array_equal(got, np.arange(count, dtype=np.float32) * np.float32(12.0))
    finally:
        device.destroy_buffer(big)
        kernel.close()


def test_encode_ahead_off_holds_nothing(backend: WgpuBackend) -> None:
    quiet = WgpuBackend(encode_ahead=False)
    try:
        device = quiet.open_device(quiet.default_adapter_index())
        assert device.encode_ahead is False
        count = 64
        kernel = AddKernel(device, count, row=count)
        commands = _doubling_list(kernel)
        device.write_buffer(kernel.params, 0, _params(count, count, 1.0))
        device.write_buffer(kernel.a, 0, np.ones(count, np.float32).tobytes())
        device.write_buffer(kernel.b, 0, np.ones(count, np.float32).tobytes())
        before = device.live_handles()
        device.submit(commands)
        assert device.live_handles() == before
        np.testing.assert_array_equal(np.frombuffer(device.read_buffer(kernel.out, 0, 4 * count), np.float32), 2.0)
        device.encode_ahead = True  # per device, switchable
        device.submit(commands)
        assert device.live_handles() == before + 1
        device.encode_ahead = False  # switched off: the next submit releases what was encoded
        device.submit(commands)
        assert device.live_handles() == before
        device.submit(commands)
        device.encode_ahead = True
        device.submit(commands)
        # destroying the device releases the encoded buffer with everything else
        device.destroy()
        assert device.live_handles() == 0
    finally:
        quiet.close()


@pytest.mark.parametrize("bad", [1, None, "yes"])
def test_encode_ahead_argument_is_checked(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="encode_ahead must be True or False"):
        WgpuBackend(encode_ahead=bad)  # type: ignore[arg-type]


def test_a_released_handle_never_names_the_object_made_at_its_address(clean: WgpuDevice) -> None:
    """wgpu-native reuses a freed object's address for a later one.  A handle kept past its release (another
    thread still holding it, say) must be refused, not name the new object: on the H200 such a read returned the
    contents of the buffer made later at the same address.  Handles carry a generation above the address bits."""
    device = clean
    stale = device.create_buffer(1024)
    device.destroy_buffer(stale)
    fresh = 0
    for _ in range(64):  # make and free buffers until one lands at the released one's address
        fresh = device.create_buffer(1024)
        if fresh & HANDLE_ADDRESS_MASK == stale & HANDLE_ADDRESS_MASK:
            break
        device.destroy_buffer(fresh)
    else:
        pytest.fail("wgpu-native never reused the released buffer's address: this test shows nothing")
    try:
        device.write_buffer(fresh, 0, np.arange(256, dtype=np.float32).tobytes())
        assert fresh != stale
        with pytest.raises(ValidationError, match="not a live"):
            device.read_buffer(stale, 0, 1024)
        commands = CommandList()
        commands.add_copy(stale, 0, fresh, 0, 1024)
        with pytest.raises(ValidationError, match="not a live"):
            device.submit(commands)
        assert np.array_equal(np.frombuffer(device.read_buffer(fresh, 0, 1024), np.float32), np.arange(256))
    finally:
        device.destroy_buffer(fresh)


def test_errors_reach_only_the_thread_whose_call_reported_them(clean: WgpuDevice) -> None:
    """The uncaptured-error callback (C) records each error with the thread it fired in (wgpu-native calls it
    inside the failing call): a thread's _raise_pending raises its own errors only, never another thread's."""
    device = clean
    ffi = device._ffi
    callback = ffi.cast("WGPUUncapturedErrorCallback", UNCAPTURED_ERROR_CALLBACK)
    userdata = ffi.cast("void *", device._sink.reports.address)
    keep: list[Any] = []

    def report(text: str) -> None:  # what wgpu-native does inside a failing call made by this thread
        message = ffi.new("WGPUStringView *")
        data = ffi.new("char[]", text.encode())
        keep.append(data)
        message.data = data
        message.length = len(text)
        callback(ffi.NULL, device._lib.WGPUErrorType_Validation, message[0], userdata, ffi.NULL)

    reported = threading.Event()
    raised: list[str] = []

    def other() -> None:
        report("the other thread's error")
        reported.set()
        try:
            device._raise_pending("the other thread's call")
        except ValidationError as error:
            raised.append(str(error))

    thread = threading.Thread(target=other)
    thread.start()
    assert reported.wait(30)
    thread.join(30)
    device._raise_pending("this thread's call")  # nothing of its own: raises nothing
    report("this thread's error")
    with pytest.raises(ValidationError, match="this thread's call: this thread's error"):
        device._raise_pending("this thread's call")
    assert raised == ["the other thread's call: the other thread's error"]
    assert device._sink.reports.pending == 0


def test_a_timestamp_with_no_pass_open_begins_the_pass(clean: WgpuDevice) -> None:
    """Where the device writes timestamps inside compute passes, a list's first timestamp (no pass open yet) begins
    the pass and is written in it (``timestamps_open_pass``, on by default there); either way the work's result is
    the same and the resolved timestamps are ordered: before the dispatch <= after it."""
    device = clean
    table = device._native_table
    assert table.timestamps_open_pass == table.timestamps_in_passes
    if not device.timestamps_supported:
        pytest.fail("the wgpu device has no timestamp queries inside encoders (lavapipe and the H200 have them)")
    pipeline = device.create_compute_pipeline(SCALE_KERNEL, label="scale")
    count = 256
    x = device.create_buffer(4 * count)
    y = device.create_buffer(4 * count)
    group = device.create_bind_group(pipeline, [BindingEntry(0, x, 0, 4 * count), BindingEntry(1, y, 0, 4 * count)])
    query_set = device.create_query_set(2, label="test")
    resolved = device.create_query_resolve_buffer(256, label="test")
    initial = table.timestamps_open_pass
    try:
        data = np.arange(count, dtype=np.float32)
        device.write_buffer(x, 0, data.tobytes())
        for open_pass in (True, False):
            table.timestamps_open_pass = open_pass
            device.write_buffer(y, 0, np.zeros(count, np.float32).tobytes())
            commands = CommandList()
            commands.add_timestamp(query_set, 0)
            commands.add_dispatch(pipeline, group, count // 64)
            commands.add_timestamp(query_set, 1)
            commands.add_resolve(query_set, 0, 2, resolved, 0)
            device.submit(commands)
            out = np.empty(count, np.float32)
            device.read_buffer_into(y, 0, out)
            np.testing.assert_array_equal(out, data * 2 + 1)
            ticks = np.empty(2, np.uint64)
            device.read_buffer_into(resolved, 0, ticks.view(np.uint8))
            assert 0 < int(ticks[0]) <= int(ticks[1]), (open_pass, ticks)
    finally:
        table.timestamps_open_pass = initial
        device.destroy_buffer(resolved)
        device.release_query_set(query_set)
        device.release_bind_group(group)
        device.destroy_buffer(x)
        device.destroy_buffer(y)
        device.release_pipeline(pipeline)
