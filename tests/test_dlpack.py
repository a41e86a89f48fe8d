"""Foreign tensors through DLPack (issue 14): every API that takes host data takes DLPack producers, host
producers without a copy, device producers only through a host copy they make, and refused dtypes named.

The producers are numpy and :class:`~ortgpu_core.backends._fake_dlpack.FakeDLPackTensor` (a "CUDA tensor" that
counts any request for its device memory); PyTorch is exercised where it is installed.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

import ortgpu_core as core
from ortgpu import InferenceSession, OrtValue
from ortgpu_core._dlpack import host_array
from ortgpu_core.backends._fake_dlpack import KDL_CPU, FakeDLPackTensor


class NumpyProducer:
    """A kDLCPU producer that is not a numpy array (as a torch CPU tensor is), delegating to one."""

    def __init__(self, array: np.ndarray[Any, Any]) -> None:
        self.array = array

    def __dlpack__(self, **kwargs: Any) -> object:
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDL_CPU, 0)


def test_host_producers_are_shared_without_a_copy() -> None:
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert host_array(data, "t") is data
    shared = host_array(NumpyProducer(data), "t")
    assert np.shares_memory(shared, data)
    np.testing.assert_array_equal(shared, data)
    strided = host_array(NumpyProducer(data[:, ::2]), "t")  # a strided view stays a view
    assert np.shares_memory(strided, data)
    np.testing.assert_array_equal(strided, data[:, ::2])
    value = OrtValue.ortvalue_from_numpy(NumpyProducer(data))
    assert np.shares_memory(value.numpy(), data)  # as onnxruntime does for numpy arrays
    cpu_value = OrtValue.from_dlpack(NumpyProducer(data))
    assert np.shares_memory(cpu_value.numpy(), data)


def test_device_producers_are_asked_for_a_host_copy() -> None:
    data = np.arange(6, dtype=np.int64).reshape(2, 3)
    tensor = FakeDLPackTensor(data)
    array = host_array(tensor, "t")
    np.testing.assert_array_equal(array, data)
    assert array.dtype == np.int64
    assert tensor.requests == [{"max_version": (1, 0), "dl_device": (1, 0), "copy": True}]
    assert tensor.device_exports == 0
    value = OrtValue.from_dlpack(tensor)
    np.testing.assert_array_equal(value.numpy(), data)
    assert tensor.device_exports == 0


@pytest.mark.parametrize(
    "producer, fragments",
    [
        (dict(host_copy=False), ["cannot give a host copy", "tensor.cpu()", "dlpack:cuda"]),
        (dict(legacy=True), ["cannot give a host copy", "tensor.cpu()"]),
        (dict(device_type=10), []),  # ROCm, host copy available: accepted (checked below)
        (dict(lie=True), ["exported memory on dlpack:cuda", "never reads device memory"]),
    ],
)
def test_producers_that_cannot_copy_to_the_host_are_refused(producer: dict[str, Any], fragments: list[str]) -> None:
    tensor = FakeDLPackTensor(np.ones(3, np.float32), **producer)
    if not fragments:
        np.testing.assert_array_equal(host_array(tensor, "t"), np.ones(3, np.float32))
        return
    with pytest.raises(core.TransferRoutingError) as raised:
        host_array(tensor, "update_inplace")
    for fragment in ["update_inplace", *fragments]:
        assert fragment in str(raised.value)
    assert tensor.device_exports == 0


@pytest.mark.parametrize(
    "code, bits, name",
    [(4, 16, "bfloat16"), (5, 64, "complex64"), (12, 8, "float8_e5m2"), (10, 8, "float8_e4m3fn"), (2, 8, "float8")],
)
@pytest.mark.parametrize("device_type", [1, 2])
def test_dtypes_ortgpu_cannot_hold_are_refused_by_name(code: int, bits: int, name: str, device_type: int) -> None:
    tensor = FakeDLPackTensor(np.ones(4, np.float32), device_type=device_type, dtype_code=code, bits=bits)
    with pytest.raises(core.DtypeError, match=name) as raised:
        host_array(tensor, "feed 'X'")
    assert "feed 'X'" in str(raised.value) and "cast" in str(raised.value)
    with pytest.raises(core.DtypeError, match="complex64"):
        host_array(np.ones(2, np.complex64), "t")


def test_not_a_tensor_is_a_type_error() -> None:
    with pytest.raises(core.ArgumentTypeError, match="DLPack"):
        host_array([1.0, 2.0], "update_inplace")
    with pytest.raises(core.ArgumentTypeError, match="DLPack"):
        OrtValue.ortvalue_from_numpy([1.0, 2.0])  # type: ignore[call-overload]


def test_update_inplace_and_copy_from_take_dlpack(env: core.Env) -> None:
    shared = env.shared_allocator()
    value = shared.empty((2, 3), "float32")
    cpu = OrtValue.ortvalue_from_numpy(np.zeros((2, 3), np.float32))
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    for target in (value, cpu):
        for producer in (
            NumpyProducer(data + 1),
            FakeDLPackTensor(data + 2),
            FakeDLPackTensor(data + 3, device_type=1),
        ):
            target.update_inplace(producer)
            np.testing.assert_array_equal(target.to_numpy(), producer_data(producer))
        target.copy_from(FakeDLPackTensor(data + 4))
        np.testing.assert_array_equal(target.to_numpy(), data + 4)
        before = target.to_numpy()
        with pytest.raises(core.DtypeError, match="never casts"):
            target.update_inplace(FakeDLPackTensor(data.astype(np.float64)))
        with pytest.raises(core.ShapeError):
            target.update_inplace(FakeDLPackTensor(data.reshape(3, 2)))
        with pytest.raises(core.TransferRoutingError, match="tensor.cpu()"):
            target.update_inplace(FakeDLPackTensor(data, host_copy=False))
        with pytest.raises(core.DtypeError, match="bfloat16"):
            target.update_inplace(FakeDLPackTensor(data, dtype_code=4, bits=16))
        with pytest.raises(core.ArgumentTypeError, match="DLPack"):
            target.update_inplace([1, 2, 3])  # type: ignore[arg-type]
        np.testing.assert_array_equal(target.to_numpy(), before)  # refused updates change nothing
    uploaded = shared.from_numpy(FakeDLPackTensor(data))
    np.testing.assert_array_equal(uploaded.to_numpy(), data)
    del value, uploaded


def producer_data(producer: object) -> np.ndarray[Any, Any]:
    if isinstance(producer, NumpyProducer):
        return producer.array
    assert isinstance(producer, FakeDLPackTensor)
    return producer.numpy()


def _identity_model() -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["X"], ["Y"])],
        "identity",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def test_bind_cpu_input_takes_dlpack(env: core.Env) -> None:
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    with InferenceSession(_identity_model(), env=env) as session:
        binding = session.io_binding()
        tensor = FakeDLPackTensor(data)
        binding.bind_cpu_input("X", tensor)
        bound = binding.cpu_inputs()["X"]
        assert isinstance(bound, np.ndarray)
        np.testing.assert_array_equal(bound, data)
        assert tensor.device_exports == 0
        with pytest.raises(core.TransferRoutingError, match="tensor.cpu()"):
            binding.bind_cpu_input("X", FakeDLPackTensor(data, legacy=True))
        output = session.allocator.empty((2, 3), "float32")
        binding.bind_output("Y", output)
        session.run_with_iobinding(binding)
        np.testing.assert_array_equal(output.to_numpy(), data)
        del binding, output


def test_run_feeds_take_dlpack(env: core.Env) -> None:
    """``session.run`` feeds: a CUDA-kind producer gives the same outputs as numpy through one host copy it makes
    (its device memory never exported), a CPU one is read in place; a producer that cannot copy is refused before
    anything runs."""
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    with InferenceSession(_identity_model(), env=env) as session:
        expected = session.run(None, {"X": data})[0]
        cuda = FakeDLPackTensor(data)
        np.testing.assert_array_equal(session.run(None, {"X": cuda})[0], expected)
        assert cuda.device_exports == 0
        assert [(r.get("dl_device"), r.get("copy")) for r in cuda.requests] == [((KDL_CPU, 0), True)], cuda.requests
        np.testing.assert_array_equal(
            session.run(None, {"X": FakeDLPackTensor(data, device_type=KDL_CPU)})[0], expected
        )
        with pytest.raises(core.TransferRoutingError, match="tensor.cpu()"):
            session.run(None, {"X": FakeDLPackTensor(data, host_copy=False)})
        with pytest.raises(core.DtypeError):
            session.run(None, {"X": FakeDLPackTensor(data.astype(np.float64))})


def test_torch_tensors_where_installed(env: core.Env) -> None:
    """PyTorch CPU tensors are shared, CUDA tensors copied by torch (on the GPU machine); not installed here:
    then this checks only that ortgpu does not depend on it."""
    if importlib.util.find_spec("torch") is None:
        import ortgpu_core._dlpack as module

        assert "torch" not in module.__dict__
        return
    import torch  # type: ignore[import-not-found, unused-ignore]

    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    cpu_tensor = torch.from_numpy(data.copy())
    shared = host_array(cpu_tensor, "t")
    assert shared.ctypes.data == cpu_tensor.data_ptr()  # no copy
    value = env.shared_allocator().empty((2, 3), "float32")
    value.update_inplace(cpu_tensor)
    np.testing.assert_array_equal(value.to_numpy(), data)
    with pytest.raises(core.DtypeError, match="bfloat16"):
        host_array(cpu_tensor.to(torch.bfloat16), "t")
    if torch.cuda.is_available():
        before = core.route_counts()
        value.update_inplace(cpu_tensor.cuda() * 2)  # torch makes the host copy; WebGPU gets host memory
        np.testing.assert_array_equal(value.to_numpy(), data * 2)
        after = core.route_counts()
        ran = {name: after[name] - before.get(name, 0) for name in after if after[name] != before.get(name, 0)}
        assert ran == {"dlpack-host-copy": 1}, ran
        print(f"torch CUDA update_inplace ran routes {ran}")
    del value
