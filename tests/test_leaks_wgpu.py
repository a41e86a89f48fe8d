"""wgpu-native frees the command buffers ortgpu releases without submitting them (issue 10, item 8).

wgpu-native 29 removes a command buffer from wgpu-core's registry on ``wgpuCommandBufferRelease`` only when the
flag its ``wgpuQueueSubmit`` sets is set, so a finished command buffer released unsubmitted is never freed: on
lavapipe, 3000 of them (16 dispatches each) cost +289 MB of RSS, and a device-poll, an empty submit or a wait
after each release changes nothing (measured).  Encode-ahead releases one such buffer per captured graph
released, so the backend sets that flag first (``NativeTable.submitted_flag_offset``, probed once per process).
"""

from __future__ import annotations

import gc
import os
from typing import Iterator

import numpy as np
import pytest

from ortgpu_core.backends import _wgpu_unsubmitted, wgpu_native
from ortgpu_core.backends._commands import CommandList
from ortgpu_core.backends.protocol import BindingEntry
from ortgpu_core.backends.wgpu_native import WgpuBackend, WgpuDevice

pytestmark = pytest.mark.wgpu_only

KERNEL = """
@group(0) @binding(0) var<storage, read_write> data: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < arrayLength(&data)) {
        data[gid.x] = data[gid.x] + 1.0;
    }
}
"""


def rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGESIZE") / 2**20


@pytest.fixture(scope="module")
def backend() -> Iterator[WgpuBackend]:
    instance = WgpuBackend()
    yield instance
    instance.close()


@pytest.fixture
def device(backend: WgpuBackend) -> Iterator[WgpuDevice]:
    opened = backend.open_device(backend.default_adapter_index())
    yield opened
    opened.destroy()


def test_the_submitted_flag_of_this_wgpu_native_is_known(device: WgpuDevice) -> None:
    """The probe recognises the wgpu-native the package pins (29.x): encode-ahead stays on, and releases of
    unsubmitted command buffers set the flag."""
    assert wgpu_native.native_version().startswith("29.")
    assert device.native_table.submitted_flag_offset == _wgpu_unsubmitted.SUBMITTED_FLAG_OFFSET == 16
    assert device.encode_ahead


def test_unsubmitted_command_buffers_are_freed(device: WgpuDevice) -> None:
    """1000 command buffers of 16 dispatches, encoded and released without a submit: RSS stays flat (it grew
    ~92-100 MB per 1000 before), and the device still computes afterwards."""
    data = device.create_buffer(4 * 256, label="data")
    pipeline = device.create_compute_pipeline(KERNEL, label="add one")
    group = device.create_bind_group(pipeline, [BindingEntry(0, data, 0, 4 * 256)])
    try:
        commands = CommandList()
        for _ in range(16):
            commands.add_dispatch(pipeline, group, 4)
        commands.freeze()
        table = device.native_table

        def discard(count: int) -> None:
            for _ in range(count):
                address = commands.encode_native(table)
                assert address
                table.release_encoded(address)

        discard(100)
        gc.collect()
        before = rss_mb()
        discard(1000)
        gc.collect()
        grown = rss_mb() - before
        assert grown < 10.0, f"1000 command buffers released unsubmitted grew RSS by {grown:.1f} MB"
        # nothing released ran: the buffer is still zero; a submit runs the 16 dispatches once
        assert np.frombuffer(device.read_buffer(data, 0, 16), np.float32).tolist() == [0.0] * 4
        device.submit(commands)
        assert np.frombuffer(device.read_buffer(data, 0, 16), np.float32).tolist() == [16.0] * 4
    finally:
        device.release_bind_group(group)
        device.release_pipeline(pipeline)
        device.destroy_buffer(data)


def test_encode_ahead_starts_off_where_the_flag_is_unknown(
    backend: WgpuBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wgpu-native whose command buffers the probe does not recognise would leak one buffer per released
    graph: encode-ahead starts off on its devices (and can still be switched on by hand)."""
    monkeypatch.setattr(_wgpu_unsubmitted, "_probed", -1)
    device = backend.open_device(backend.default_adapter_index())
    try:
        assert device.native_table.submitted_flag_offset == -1
        assert device.encode_ahead is False
    finally:
        device.destroy()


@pytest.mark.parametrize("why", ["switched off", "unknown version"])
def test_the_flag_is_never_written_when_switched_off_or_on_an_unchecked_version(
    backend: WgpuBackend, monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    """The write into wgpu-native's command buffer has a switch (ENABLED, or ORTGPU_UNSUBMITTED_FLAG_WRITE=0) and a
    version check: with the switch off, or on a wgpu-native major version whose layout was not checked, the offset
    is -1 without a probe, and encode-ahead starts off."""
    if why == "switched off":
        monkeypatch.setattr(_wgpu_unsubmitted, "ENABLED", False)
    else:
        monkeypatch.setattr(_wgpu_unsubmitted, "KNOWN_MAJOR_VERSIONS", frozenset({"0"}))
    monkeypatch.setattr(_wgpu_unsubmitted, "_probed", None)
    device = backend.open_device(backend.default_adapter_index())
    try:
        assert device.native_table.submitted_flag_offset == -1
        assert device.encode_ahead is False
        assert _wgpu_unsubmitted._probed is None  # nothing probed
    finally:
        device.destroy()


def test_submitted_flag_offset_is_checked(device: WgpuDevice) -> None:
    table = device.native_table
    for bad in (-2, 257):
        with pytest.raises(ValueError, match="submitted_flag_offset"):
            table.submitted_flag_offset = bad
    assert table.submitted_flag_offset == 16
