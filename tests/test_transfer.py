"""Transfer routing by placement, device identity and Env."""

from __future__ import annotations

import numpy as np
import pytest

import ortgpu_core as core
from ortgpu_core import OrtValue


def test_routes(env: core.Env) -> None:
    shared = env.shared_allocator()
    device_a = shared.from_numpy(np.arange(4, dtype=np.float32))
    device_b = shared.empty((4,), "float32")
    cpu = OrtValue.ortvalue_from_numpy(np.zeros(4, np.float32))
    assert core.transfer_route(cpu, device_b) == "upload"
    assert core.transfer_route(device_a, cpu) == "download"
    assert core.transfer_route(device_a, device_b) == "device-copy"
    assert core.transfer_route(cpu, OrtValue.ortvalue_from_numpy(np.zeros(4, np.float32))) == "host-copy"
    device_b.copy_from(device_a)
    np.testing.assert_array_equal(device_b.to_numpy(), np.arange(4, dtype=np.float32))
    cpu.copy_from(device_a)
    np.testing.assert_array_equal(cpu.numpy(), np.arange(4, dtype=np.float32))


def test_device_copy_is_ordered_after_earlier_writes(env: core.Env) -> None:
    shared = env.shared_allocator()
    source = shared.from_numpy(np.zeros(64, np.float32))
    target = shared.empty((64,), "float32")
    for step in range(3):
        source.update_inplace(np.full(64, step, np.float32))
        target.copy_from(source)
        np.testing.assert_array_equal(target.to_numpy(), np.full(64, step, np.float32))


def test_cross_env_copy_needs_the_staging_flag(env: core.Env) -> None:
    with core.Env(backend="fake") as other:
        foreign = other.shared_allocator().from_numpy(np.ones(2, np.float32))
        local = env.shared_allocator().empty((2,), "float32")
        with pytest.raises(core.TransferRoutingError, match="different Envs") as raised:
            local.copy_from(foreign)
        assert "allow_cross_device=True" in str(raised.value)
        del raised
        np.testing.assert_array_equal(local.to_numpy(), np.zeros(2, np.float32))
        assert core.transfer_route(foreign, local, allow_cross_device=True) == "staged-host"
        local.copy_from(foreign, allow_cross_device=True)
        np.testing.assert_array_equal(local.to_numpy(), np.ones(2, np.float32))
        del foreign


def test_copy_checks_dtype_and_shape(env: core.Env) -> None:
    shared = env.shared_allocator()
    a = shared.empty((4,), "float32")
    with pytest.raises(core.DtypeError, match="never casts"):
        a.copy_from(shared.empty((4,), "int32"))
    with pytest.raises(core.ShapeError):
        a.copy_from(shared.empty((5,), "float32"))
    with pytest.raises(TypeError, match="cannot transfer str"):
        a.copy_from("data")
    a.copy_from(np.ones(4, np.float32))  # numpy arrays (any DLPack tensor) are sources too
    np.testing.assert_array_equal(a.to_numpy(), np.ones(4, np.float32))
