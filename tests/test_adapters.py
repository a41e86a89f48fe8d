"""Several adapters in one Env (issue 14): every adapter is listed, cross-device copies are staged through the
host only when asked, sessions take only values of their own device; and a property test of routing over every
kind of end (CPU values, numpy arrays, DLPack producers, two WebGPU devices, a foreign device).

Two adapters: the fake backend with ``fake_adapters(2)`` (same vendor and device ids, as the Vulkan and OpenGL
adapters of one GPU), and wgpu-native with its OpenGL adapter enabled (lavapipe lists a Vulkan and an OpenGL
adapter of one software GPU).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import ortgpu
import ortgpu_core as core
from ortgpu import InferenceSession, OrtValue
from ortgpu_core.backends._fake_dlpack import FakeDLPackTensor
from ortgpu_core.backends._fake_foreign import FAKE_OTHER_GPU_KIND, FakeForeignDevice, FakeForeignTensor
from ortgpu_core.backends.fake import FakeBackend, fake_adapters

SHAPE = (3, 4)


@pytest.fixture(scope="module", params=("fake", "wgpu"))
def backend_name(request: pytest.FixtureRequest) -> str:
    """Module-scoped (one two-adapter Env per backend for the file); deselected per backend by conftest."""
    return str(request.param)


@pytest.fixture(scope="module")
def two_adapters(backend_name: str) -> Iterator[core.Env]:
    if backend_name == "fake":
        backend: Any = FakeBackend(fake_adapters(2))
    else:
        from ortgpu_core.backends.wgpu_native import WgpuBackend

        backend = WgpuBackend(include_opengl=True)
    with core.Env(backend=backend) as env:
        yield env


@pytest.fixture(scope="module")
def other_env(two_adapters: core.Env, backend_name: str) -> Iterator[core.Env]:
    """A second Env on the same (default) adapter: its device shares the ids but not the memory."""
    with core.Env(backend="fake" if backend_name == "fake" else "wgpu") as env:
        yield env


def test_env_lists_every_adapter(two_adapters: core.Env, backend_name: str) -> None:
    devices = two_adapters.devices
    assert len(devices) >= 2
    first, second = devices[0], devices[1]
    assert first is not second and first.index == 0 and second.index == 1
    # One GPU's adapters share the vendor (lavapipe: the device id too; NVIDIA's OpenGL adapter reports device id 0).
    assert first.vendor_id == second.vendor_id or backend_name == "fake"
    if backend_name == "wgpu":
        assert {d.backend_type for d in devices} >= {"Vulkan", "OpenGL"}
        assert two_adapters.default_device.backend_type == "Vulkan"


def test_cross_device_copies_need_the_flag(two_adapters: core.Env) -> None:
    first, second = two_adapters.devices[:2]
    data = np.arange(12, dtype=np.float32).reshape(SHAPE)
    a = two_adapters.shared_allocator(first).from_numpy(data)
    b = two_adapters.shared_allocator(second).empty(SHAPE, "float32")
    for copy in (
        lambda: b.copy_from(a),
        lambda: a.copy_from(b),
        lambda: core.transfer(a, b),
        lambda: ortgpu.copy_tensors([a], [b]),
    ):
        with pytest.raises(core.TransferRoutingError, match="allow_cross_device=True"):
            copy()
    np.testing.assert_array_equal(b.to_numpy(), np.zeros(SHAPE, np.float32))
    np.testing.assert_array_equal(a.to_numpy(), data)
    before = core.route_counts().get("staged-host", 0)
    b.copy_from(a, allow_cross_device=True)
    np.testing.assert_array_equal(b.to_numpy(), data)
    assert core.route_counts()["staged-host"] == before + 1
    # And back, as a batch with a same-device copy.
    c = two_adapters.shared_allocator(first).empty(SHAPE, "float32")
    b.update_inplace(data * 2)
    assert ortgpu.copy_tensors([b, a], [c, two_adapters.shared_allocator(second).empty(SHAPE, "float32")], True) == [
        "staged-host",
        "staged-host",
    ]
    np.testing.assert_array_equal(c.to_numpy(), data * 2)


def _add_model() -> bytes:
    node = helper.make_node("Add", ["X", "X"], ["Y"])
    graph = helper.make_graph(
        [node],
        "add",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(SHAPE))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, list(SHAPE))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def test_session_takes_only_values_of_its_own_device(two_adapters: core.Env) -> None:
    # The session runs on the default (Vulkan) adapter: NVIDIA's OpenGL adapter compiles no compute pipelines (on the
    # H200: "The selected version doesn't support ... COMPUTE_SHADER"), though its buffers copy fine.
    second, first = two_adapters.devices[:2]
    data = np.arange(12, dtype=np.float32).reshape(SHAPE)
    with InferenceSession(_add_model(), env=two_adapters, device=second) as session:
        foreign_input = two_adapters.shared_allocator(first).from_numpy(data)
        own_input = two_adapters.shared_allocator(second).from_numpy(data)
        output = session.allocator.empty(SHAPE, "float32")
        binding = session.io_binding()
        with pytest.raises(core.ProvenanceError, match="another device"):
            binding.bind_input("X", foreign_input)
        with pytest.raises(core.ProvenanceError, match="another device"):
            binding.bind_output("Y", two_adapters.shared_allocator(first).empty(SHAPE, "float32"))
        binding.bind_input("X", own_input)
        binding.bind_output("Y", output)
        session.run_with_iobinding(binding)
        np.testing.assert_array_equal(output.to_numpy(), data + data)
        # The way to use a value of the other device: an explicit staged copy onto this one.
        staged = two_adapters.shared_allocator(second).empty(SHAPE, "float32")
        staged.copy_from(foreign_input, allow_cross_device=True)
        binding.bind_input("X", staged)
        session.run_with_iobinding(binding)
        np.testing.assert_array_equal(output.to_numpy(), data + data)
        del binding, foreign_input, own_input, output, staged


# -- property: every (source, destination) pair equals numpy's copy or raises TransferRoutingError ------------
SOURCES = (
    "cpu",
    "numpy",
    "dlpack-cpu",
    "dlpack-cuda",
    "dlpack-cuda-no-host-copy",
    "webgpu0",
    "webgpu1",
    "webgpu-other-env",
    "foreign",
)
DESTINATIONS = ("cpu", "numpy", "webgpu0", "webgpu1", "webgpu-other-env", "foreign")


def _make(kind: str, data: np.ndarray[Any, Any], env: core.Env, other: core.Env, foreign: FakeForeignDevice) -> object:
    if kind == "cpu":
        return OrtValue.ortvalue_from_numpy(data.copy())
    if kind == "numpy":
        return data.copy()
    if kind == "dlpack-cpu":
        return FakeDLPackTensor(data, device_type=1)
    if kind == "dlpack-cuda":
        return FakeDLPackTensor(data)
    if kind == "dlpack-cuda-no-host-copy":
        return FakeDLPackTensor(data, host_copy=False)
    if kind == "webgpu-other-env":
        return other.shared_allocator().from_numpy(data)
    if kind.startswith("webgpu"):
        return env.shared_allocator(env.devices[int(kind[-1])]).from_numpy(data)
    assert kind == "foreign"
    return foreign.tensor(data)


def _read(obj: object) -> np.ndarray[Any, Any]:
    if isinstance(obj, OrtValue):
        return obj.to_numpy()
    if isinstance(obj, (FakeDLPackTensor, FakeForeignTensor)):
        return obj.numpy()
    assert isinstance(obj, np.ndarray)
    return obj.copy()


def _routable(source: str, destination: str, allow_cross_device: bool) -> bool:
    """Independent statement of the routing rules this property checks."""
    if destination == "numpy" or source == "dlpack-cuda-no-host-copy":
        return False
    if "foreign" in (source, destination) and (source.startswith("webgpu") or destination.startswith("webgpu")):
        return False  # foreign memory never meets a WebGPU transfer
    if source == "dlpack-cuda" and destination == "foreign":
        return False  # a device DLPack tensor's host copy goes into OrtValues only
    if source.startswith("webgpu") and destination.startswith("webgpu") and source != destination:
        return allow_cross_device
    return True


@settings(max_examples=60, deadline=None)
@given(
    source=st.sampled_from(SOURCES),
    destination=st.sampled_from(DESTINATIONS),
    allow_cross_device=st.booleans(),
    batch=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_property_copy_equals_numpy_or_refuses(
    two_adapters: core.Env,
    other_env: core.Env,
    source: str,
    destination: str,
    allow_cross_device: bool,
    batch: bool,
    seed: int,
) -> None:
    core.register_foreign_kind(FAKE_OTHER_GPU_KIND)
    rng = np.random.default_rng(seed)
    foreign = FakeForeignDevice()
    src = _make(source, rng.standard_normal(SHAPE).astype(np.float32), two_adapters, other_env, foreign)
    dst = _make(destination, rng.standard_normal(SHAPE).astype(np.float32), two_adapters, other_env, foreign)
    src_before, dst_before = _read(src), _read(dst)
    copy: Callable[[], object] = (
        (lambda: ortgpu.copy_tensors([src], [dst], allow_cross_device))
        if batch
        else (lambda: core.transfer(src, dst, allow_cross_device))
    )
    if _routable(source, destination, allow_cross_device):
        copy()
        np.testing.assert_array_equal(_read(dst), src_before)
    else:
        with pytest.raises(core.TransferRoutingError):
            copy()
        np.testing.assert_array_equal(_read(dst), dst_before)
    np.testing.assert_array_equal(_read(src), src_before)
    for end in (src, dst):
        if isinstance(end, FakeDLPackTensor):
            assert end.device_exports == 0  # nobody asked a CUDA producer for its device pointer
