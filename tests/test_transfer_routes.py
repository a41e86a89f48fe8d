"""The transfer route table (issue 14): routes as data, picked by kind and device identity; foreign kinds never
reach a WebGPU transfer; copy_tensors validated as a whole and batched.

"Which transfer ran" is asserted with ``ortgpu_core.route_counts()`` (transfers run per route) and the fake
foreign device's own log.
"""

from __future__ import annotations

from typing import Iterator, cast

import numpy as np
import pytest

import ortgpu
import ortgpu_core as core
from ortgpu_core import OrtValue
from ortgpu_core._routes import Route
from ortgpu_core.backends._fake_dlpack import FakeDLPackTensor
from ortgpu_core.backends._fake_foreign import FAKE_OTHER_GPU_KIND, FakeForeignDevice
from ortgpu_core.backends.fake import FakeBackend, FakeDevice, fake_adapters
from ortgpu_core.backends.protocol import ForeignKind

WEBGPU_ROUTES = ("upload", "download", "device-copy", "staged-host")


@pytest.fixture(autouse=True)
def foreign_kind_registered() -> None:
    core.register_foreign_kind(FAKE_OTHER_GPU_KIND)  # idempotent; a fake Env registers it too


def delta(before: dict[str, int]) -> dict[str, int]:
    """Transfers run per route since ``before``."""
    after = core.route_counts()
    return {name: count - before.get(name, 0) for name, count in after.items() if count != before.get(name, 0)}


def test_table_lists_core_and_registered_routes() -> None:
    routes = {route.name: route for route in ortgpu.transfer_routes()}
    for name in ("host-copy", "upload", "download", "device-copy", "staged-host", "host-array", "dlpack-host-copy"):
        assert routes[name].owner == "ortgpu_core"
    assert routes["device-copy"].sources == {"webgpu"} and routes["device-copy"].destinations == {"webgpu"}
    assert "dlpack:cuda" in routes["dlpack-host-copy"].sources
    assert "webgpu" not in routes["dlpack-host-copy"].sources
    for suffix in ("download", "upload", "device-copy"):
        assert routes[f"fake-other-gpu:{suffix}"].owner == "fake-other-gpu"
    # No route takes a foreign kind (or a device DLPack tensor) to or from WebGPU memory directly.
    for route in routes.values():
        if "webgpu" in route.destinations:
            assert "fake-other-gpu" not in route.sources
        if "webgpu" in route.sources:
            assert "fake-other-gpu" not in route.destinations
    assert FakeBackend().foreign_kinds() == (FAKE_OTHER_GPU_KIND,)


def test_routes_are_picked_by_kind_and_identity(env: core.Env) -> None:
    shared = env.shared_allocator()
    a = shared.from_numpy(np.arange(4, dtype=np.float32))
    b = shared.empty((4,), "float32")
    cpu = OrtValue.ortvalue_from_numpy(np.zeros(4, np.float32))
    other = FakeForeignDevice()
    foreign = other.tensor(np.ones(4, np.float32))
    cases = [
        (cpu, b, "upload"),
        (a, cpu, "download"),
        (a, b, "device-copy"),
        (cpu, OrtValue.ortvalue_from_numpy(np.zeros(4, np.float32)), "host-copy"),
        (np.zeros(4, np.float32), b, "host-array"),
        (FakeDLPackTensor(np.zeros(4, np.float32), device_type=1), b, "host-array"),
        (FakeDLPackTensor(np.zeros(4, np.float32)), b, "dlpack-host-copy"),
        (FakeDLPackTensor(np.zeros(4, np.float32), device_type=10), cpu, "dlpack-host-copy"),
        (foreign, cpu, "fake-other-gpu:download"),
        (cpu, foreign, "fake-other-gpu:upload"),
        (np.zeros(4, np.float32), foreign, "fake-other-gpu:upload"),
        (foreign, other.empty((4,), np.float32), "fake-other-gpu:device-copy"),
    ]
    for source, destination, name in cases:
        assert core.transfer_route(source, destination) == name, (source, destination)
        before = core.route_counts()
        assert core.transfer(source, destination) == name
        assert delta(before) == {name: 1}
    del a, b


def test_errors_name_both_ends(env: core.Env) -> None:
    value = env.shared_allocator().empty((4,), "float32")
    other = FakeForeignDevice(name="Other", vendor_id=0x1234, device_id=0x0042)
    foreign = other.tensor(np.ones(4, np.float32))
    with pytest.raises(core.TransferRoutingError) as raised:
        value.copy_from(foreign)
    message = str(raised.value)
    device = env.default_device
    for fragment in (
        "kind=fake-other-gpu",
        "vendor_id=0x1234",
        "device_id=0x0042",
        "kind=webgpu",
        f"vendor_id=0x{device.vendor_id:04x}",
        f"env={env.id}",
        "Env-shared allocator",
        "through the host",
    ):
        assert fragment in message, (fragment, message)
    with pytest.raises(core.TransferRoutingError, match="writes into"):
        core.transfer(value, np.zeros(4, np.float32))
    with pytest.raises(core.ArgumentTypeError, match="cannot transfer"):
        core.transfer(object(), value)
    del raised, value


def test_foreign_values_never_reach_a_webgpu_transfer(env: core.Env) -> None:
    """The mixed test: a WebGPU device, a foreign device of another vendor, and one that reports the WebGPU
    adapter's own vendor and device ids (as CUDA and WebGPU do on one NVIDIA GPU)."""
    device = env.default_device
    webgpu = env.shared_allocator(device).from_numpy(np.full((2, 3), 5, np.float32))
    cpu = OrtValue.ortvalue_from_numpy(np.zeros((2, 3), np.float32))
    other_vendor = FakeForeignDevice("other vendor", vendor_id=0x0F0E, device_id=7)
    same_vendor = FakeForeignDevice("same vendor", vendor_id=device.vendor_id, device_id=device.device_id)
    for foreign_device in (other_vendor, same_vendor):
        data = np.arange(6, dtype=np.float32).reshape(2, 3) + foreign_device.vendor_id
        foreign = foreign_device.tensor(data)
        before = core.route_counts()
        # Into WebGPU memory: no route, whatever the vendor ids say; nothing changes on either end.
        with pytest.raises(core.TransferRoutingError):
            webgpu.update_inplace(foreign)  # type: ignore[arg-type]
        with pytest.raises(core.TransferRoutingError):
            webgpu.copy_from(foreign, allow_cross_device=True)
        with pytest.raises(core.TransferRoutingError):
            core.transfer(webgpu, foreign)
        with pytest.raises(core.TransferRoutingError):
            ortgpu.copy_tensors([foreign], [webgpu])
        np.testing.assert_array_equal(webgpu.to_numpy(), np.full((2, 3), 5, np.float32))
        assert foreign_device.log == []
        assert delta(before) == {}  # no route ran
        # Into a CPU value: the foreign runtime's own route, logged by its device.
        before = core.route_counts()
        cpu.copy_from(foreign)
        np.testing.assert_array_equal(cpu.numpy(), data)
        assert delta(before) == {"fake-other-gpu:download": 1}
        assert foreign_device.log == [("read", foreign.id)]
        for name in WEBGPU_ROUTES:
            assert name not in delta(before)
    # Between two foreign devices: refused (even when their ids match the WebGPU device's).
    with pytest.raises(core.TransferRoutingError, match="different devices"):
        core.transfer(other_vendor.tensor(np.zeros((2, 3), np.float32)), same_vendor.empty((2, 3), np.float32))
    del webgpu


def test_cuda_dlpack_tensor_with_the_webgpu_vendor_goes_through_its_host_copy(env: core.Env) -> None:
    device = env.default_device
    value = env.shared_allocator(device).empty((3,), "float32")
    tensor = FakeDLPackTensor(np.array([1, 2, 3], np.float32), vendor_id=device.vendor_id)
    before = core.route_counts()
    value.update_inplace(tensor)
    np.testing.assert_array_equal(value.to_numpy(), [1, 2, 3])
    assert delta(before) == {"dlpack-host-copy": 1}
    assert tensor.device_exports == 0
    assert [r.get("dl_device") for r in tensor.requests] == [(1, 0)]
    del value


def test_several_accepting_routes_are_refused(env: core.Env) -> None:
    value = env.shared_allocator().empty((2,), "float32")
    cpu = OrtValue.ortvalue_from_numpy(np.ones(2, np.float32))
    shadow = Route(
        "shadow-upload", frozenset({"cpu"}), frozenset({"webgpu"}), lambda s, d, flag: None, lambda s, d: None
    )
    core.register_route(shadow)
    try:
        with pytest.raises(core.TransferRoutingError, match="several transfer routes.*upload, shadow-upload"):
            value.copy_from(cpu)
        with pytest.raises(core.InvalidArgumentError, match="already registered"):
            core.register_route(shadow)
    finally:
        core.unregister_route("shadow-upload")
    np.testing.assert_array_equal(value.to_numpy(), np.zeros(2, np.float32))
    value.copy_from(cpu)
    np.testing.assert_array_equal(value.to_numpy(), np.ones(2, np.float32))
    with pytest.raises(core.InvalidArgumentError, match="no transfer route named"):
        core.unregister_route("shadow-upload")
    del value


def test_register_foreign_kind_checks_names() -> None:
    def clone(name: str) -> ForeignKind:
        k = FAKE_OTHER_GPU_KIND
        return ForeignKind(name, k.owns, k.info, k.read, k.write, k.copy)

    for reserved in ("cpu", "webgpu", "host-array", "dlpack:cuda"):
        with pytest.raises(core.InvalidArgumentError, match="reserved"):
            core.register_foreign_kind(clone(reserved))
    with pytest.raises(core.InvalidArgumentError, match="already registered"):
        core.register_foreign_kind(clone("fake-other-gpu"))
    with pytest.raises(core.ArgumentTypeError):
        core.register_foreign_kind("fake-other-gpu")  # type: ignore[arg-type]


# -- copy_tensors ---------------------------------------------------------------------------------------------
@pytest.fixture
def two_device_env() -> Iterator[core.Env]:
    with core.Env(backend=FakeBackend(fake_adapters(2))) as environment:
        yield environment


def test_copy_tensors_batches_device_copies_and_downloads(two_device_env: core.Env) -> None:
    env = two_device_env
    shared = env.shared_allocator(env.devices[0])
    sources = [shared.from_numpy(np.full(8, i, np.float32)) for i in range(3)]
    targets = [shared.empty((8,), "float32") for _ in range(3)]
    hosts = [OrtValue.ortvalue_from_numpy(np.zeros(8, np.float32)) for _ in range(3)]
    backend_device = cast(FakeDevice, env.devices[0]._native_device())
    submits = backend_device.stats.submits
    routes = ortgpu.copy_tensors(sources, targets)
    assert routes == ["device-copy"] * 3
    assert backend_device.stats.submits == submits + 1  # one command list for the three copies
    submits = backend_device.stats.submits
    assert ortgpu.copy_tensors(targets, hosts) == ["download"] * 3
    assert backend_device.stats.submits == submits + 1  # one submission reads all three
    for i in range(3):
        np.testing.assert_array_equal(hosts[i].numpy(), np.full(8, i, np.float32))


def test_copy_tensors_refused_batch_changes_nothing(two_device_env: core.Env) -> None:
    env = two_device_env
    first, second = env.devices
    a = env.shared_allocator(first).from_numpy(np.ones(4, np.float32))
    b = env.shared_allocator(first).empty((4,), "float32")
    c = env.shared_allocator(second).empty((4,), "float32")
    cpu = OrtValue.ortvalue_from_numpy(np.zeros(4, np.float32))

    def unchanged() -> None:
        np.testing.assert_array_equal(b.to_numpy(), np.zeros(4, np.float32))
        np.testing.assert_array_equal(c.to_numpy(), np.zeros(4, np.float32))
        np.testing.assert_array_equal(cpu.numpy(), np.zeros(4, np.float32))

    before = core.route_counts()
    with pytest.raises(core.TransferRoutingError, match="allow_cross_device"):
        ortgpu.copy_tensors([a, a, a], [b, cpu, c])  # the last pair crosses devices
    with pytest.raises(core.DtypeError):
        ortgpu.copy_tensors([a, np.zeros(4, np.int32)], [b, cpu])
    with pytest.raises(core.ShapeError):
        ortgpu.copy_tensors([a, np.zeros(5, np.float32)], [b, cpu])
    with pytest.raises(core.InvalidArgumentError, match="destination"):
        ortgpu.copy_tensors([a, a], [b, b])
    with pytest.raises(core.InvalidArgumentError, match="source"):
        ortgpu.copy_tensors([a, b], [b, c], allow_cross_device=True)
    with pytest.raises(core.InvalidArgumentError, match="one destination per source"):
        ortgpu.copy_tensors([a], [b, c])
    with pytest.raises(core.TransferRoutingError):
        ortgpu.copy_tensors([a, FakeDLPackTensor(np.zeros(4, np.float32), host_copy=False)], [b, cpu])
    unchanged()
    assert delta(before) == {}  # no route ran for a refused batch
    assert ortgpu.copy_tensors([a, a, a], [b, cpu, c], allow_cross_device=True) == [
        "device-copy",
        "download",
        "staged-host",
    ]
    for value in (b.to_numpy(), c.to_numpy(), cpu.numpy()):
        np.testing.assert_array_equal(value, np.ones(4, np.float32))
