"""Env and Device: enumeration, the default device, identity, multiple devices, closing."""

from __future__ import annotations

import numpy as np
import pytest

import ortgpu_core as core
from ortgpu_core.backends.fake import FakeBackend, FakeDeviceSpec


def test_enumeration_fields(env: core.Env) -> None:
    assert env.devices, "no adapter found"
    for index, device in enumerate(env.devices):
        assert device.index == index
        assert isinstance(device.vendor_id, int) and isinstance(device.device_id, int)
        assert device.name and device.backend_type and device.adapter_type
        assert device.env_id == env.id
        assert f"vendor_id=0x{device.vendor_id:04x}" in repr(device)


@pytest.mark.wgpu_only
def test_wgpu_default_is_best_adapter() -> None:
    from tests.conftest import shared_env

    env = shared_env("wgpu")
    ranks = {"DiscreteGPU": 0, "IntegratedGPU": 1, "CPU": 2}
    best = min(ranks.get(d.adapter_type, 3) for d in env.devices)
    assert ranks.get(env.default_device.adapter_type, 3) == best
    # On a machine without a GPU (CI) that is lavapipe on Vulkan.
    if best == 2:
        assert env.default_device.backend_type == "Vulkan"


def test_fake_default_prefers_discrete_gpu() -> None:
    specs = [
        FakeDeviceSpec(vendor_id=0x1, device_id=0x10, name="soft", adapter_type="CPU"),
        FakeDeviceSpec(vendor_id=0x10DE, device_id=0x2335, name="big", adapter_type="DiscreteGPU"),
        FakeDeviceSpec(vendor_id=0x8086, device_id=0x20, name="igpu", adapter_type="IntegratedGPU"),
    ]
    with core.Env(backend=FakeBackend(devices=specs)) as env:
        assert [d.name for d in env.devices] == ["big", "igpu", "soft"]
        assert env.default_device.name == "big"
        assert (env.default_device.vendor_id, env.default_device.device_id) == (0x10DE, 0x2335)


def test_device_identity_is_the_adapter_not_the_numbers() -> None:
    specs = [FakeDeviceSpec(name="a"), FakeDeviceSpec(name="b")]  # same vendor/device ids
    with core.Env(backend=FakeBackend(devices=specs)) as env:
        first, second = env.devices
        assert (first.vendor_id, first.device_id) == (second.vendor_id, second.device_id)
        assert first is not second and first != second
        a = env.shared_allocator(first).from_numpy(np.ones(2, np.float32))
        b = env.shared_allocator(second).empty((2,), "float32")
        with pytest.raises(core.TransferRoutingError, match="allow_cross_device=True"):
            core.transfer_route(a, b)  # a cross-device copy is staged through the host only when asked
        assert core.transfer_route(a, b, allow_cross_device=True) == "staged-host"


def test_envs_are_independent() -> None:
    with core.Env(backend="fake") as one, core.Env(backend="fake") as two:
        assert one.id != two.id
        with pytest.raises(core.ProvenanceError, match=f"belongs to Env {one.id}"):
            two.shared_allocator(one.default_device)


def test_shared_allocator_is_one_per_device(env: core.Env) -> None:
    assert env.shared_allocator() is env.shared_allocator(env.default_device)


def test_bad_env_arguments() -> None:
    with pytest.raises(ValueError, match="unknown backend"):
        core.Env(backend="cuda")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="execution_mode"):
        core.Env(backend="fake", execution_mode="parallel")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="created by an Env"):
        core.Device()


def test_closed_env_releases_everything() -> None:
    backend = FakeBackend()
    env = core.Env(backend=backend)
    value = env.shared_allocator().from_numpy(np.ones(4, np.float32))
    assert backend.live_handles() == 1
    env.close()
    env.close()  # idempotent
    assert backend.live_handles() == 0
    with pytest.raises(core.ReleasedValueError, match="closed"):
        value.to_numpy()
    with pytest.raises(core.ReleasedValueError, match="closed"):
        env.shared_allocator()


def test_get_env_is_a_singleton() -> None:
    assert core.get_env() is core.get_env()


@pytest.mark.wgpu_only
def test_vulkan_and_opengl_adapters_of_one_gpu_are_different_devices() -> None:
    from ortgpu_core.backends.wgpu_native import WgpuBackend

    with core.Env(backend=WgpuBackend(include_opengl=True)) as env:
        kinds = {d.backend_type for d in env.devices}
        assert "OpenGL" in kinds and "Vulkan" in kinds, kinds  # lavapipe (CI) and the H200 list both
        vulkan = next(d for d in env.devices if d.backend_type == "Vulkan")
        opengl = next(d for d in env.devices if d.backend_type == "OpenGL")
        assert env.default_device is vulkan
        a = env.shared_allocator(vulkan).from_numpy(np.arange(4, dtype=np.float32))
        b = env.shared_allocator(opengl).empty((4,), "float32")
        with pytest.raises(core.TransferRoutingError, match="allow_cross_device=True"):
            b.copy_from(a)  # never a device copy between the two; host staging only when asked
        assert core.transfer_route(a, b, allow_cross_device=True) == "staged-host"
        b.copy_from(a, allow_cross_device=True)
        np.testing.assert_array_equal(b.to_numpy(), np.arange(4, dtype=np.float32))
        del a, b


@pytest.mark.wgpu_only
def test_default_wgpu_env_lists_no_opengl_adapter() -> None:
    from tests.conftest import shared_env

    assert all(d.backend_type != "OpenGL" for d in shared_env("wgpu").devices)
