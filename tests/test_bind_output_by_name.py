"""onnxruntime's ``bind_output(name)`` and ``bind_output(name, device_type, device_id)``: the session allocates the
output (its shape need not be known in advance), read back with ``get_outputs()`` / ``copy_outputs_to_cpu()``; a
capture allocates it once on the device and binds it for good.  Compared with onnxruntime CPU doing the same."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime
import pytest

import ortgpu
from ortgpu_core import CaptureStateError, InvalidArgumentError, UnsafeAccessError


def relu_model() -> bytes:
    """Y = Relu(X) * 2 with X [batch, 3] (the output's first dim is symbolic)."""
    x = oh.make_tensor_value_info("X", onnx.TensorProto.FLOAT, ["batch", 3])
    y = oh.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["batch", 3])
    two = onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two")
    nodes = [oh.make_node("Relu", ["X"], ["r"]), oh.make_node("Mul", ["r", "two"], ["Y"])]
    graph = oh.make_graph(nodes, "relu", [x], [y], [two])
    return bytes(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)]).SerializeToString())


MODEL = relu_model()
X = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], np.float32)


def _onnxruntime_by_name(x: np.ndarray, *device: Any) -> np.ndarray:
    session = onnxruntime.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
    binding = session.io_binding()
    binding.bind_cpu_input("X", x)
    binding.bind_output("Y", *device)
    session.run_with_iobinding(binding)
    (result,) = binding.copy_outputs_to_cpu()
    return np.asarray(result)


@pytest.mark.parametrize("device", [(), ("cpu",), ("cpu", 0)])
def test_an_output_bound_by_name_is_allocated_on_the_host_by_each_run(env: ortgpu.Env, device: tuple[Any, ...]) -> None:
    with ortgpu.InferenceSession(MODEL, env=env) as session:
        binding = session.io_binding()
        binding.bind_cpu_input("X", X)
        binding.bind_output("Y", *device)
        assert binding.get_outputs() == [] and binding.session_outputs() == {"Y": "cpu"}
        session.run_with_iobinding(binding)
        (value,) = binding.get_outputs()
        assert value.device_name() == "cpu"
        np.testing.assert_array_equal(value.numpy(), _onnxruntime_by_name(X, *device))
        # A batch of another size: the output follows, as it is allocated per run.
        bigger = np.concatenate([X, -X, X])
        binding.bind_cpu_input("X", bigger)
        session.run_with_iobinding(binding)
        (again,) = binding.copy_outputs_to_cpu()
        np.testing.assert_array_equal(again, _onnxruntime_by_name(bigger))
        np.testing.assert_array_equal(value.numpy(), _onnxruntime_by_name(X))  # the earlier run's value is its own


def test_an_output_bound_by_name_on_webgpu_is_a_fresh_device_value_each_run(env: ortgpu.Env) -> None:
    with ortgpu.InferenceSession(MODEL, env=env) as session:
        binding = session.io_binding()
        binding.bind_input("X", session.allocator.from_numpy(X))
        binding.bind_output("Y", "webgpu", 0)
        session.run_with_iobinding(binding)
        (first,) = binding.get_outputs()
        assert first.device_name() == "webgpu"
        np.testing.assert_array_equal(first.to_numpy(), _onnxruntime_by_name(X))
        binding.bind_input("X", session.allocator.from_numpy(-X))
        session.run_with_iobinding(binding)
        (second,) = binding.get_outputs()
        assert second is not first
        np.testing.assert_array_equal(second.to_numpy(), _onnxruntime_by_name(-X))
        np.testing.assert_array_equal(first.to_numpy(), _onnxruntime_by_name(X))
        for value in (first, second):
            value.release()


def test_a_capture_allocates_outputs_bound_by_name_once_and_binds_them_for_good(env: ortgpu.Env) -> None:
    with ortgpu.InferenceSession(MODEL, env=env, graph_capture=True) as session:
        x = session.allocator.from_numpy(X)
        binding = session.io_binding()
        binding.bind_input("X", x)
        binding.bind_output("Y")  # onnxruntime's default device type, "cpu": a captured graph writes the device
        graph = session.capture(binding)
        (value,) = binding.get_outputs()
        assert value.device_name() == "webgpu" and binding.session_outputs() == {}
        assert binding.outputs() == {"Y": value}
        np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], _onnxruntime_by_name(X))
        with pytest.raises(CaptureStateError):
            binding.bind_output("Y", "webgpu")
        x.update_inplace(-X)
        graph.replay()
        (same,) = binding.get_outputs()
        assert same is value
        np.testing.assert_array_equal(same.to_numpy(), _onnxruntime_by_name(-X))
        graph.release()
        value.release()
        x.release()


def test_a_failed_capture_leaves_the_output_bound_by_name(env: ortgpu.Env) -> None:
    with ortgpu.InferenceSession(MODEL, env=env, graph_capture=True) as session:
        binding = session.io_binding()
        binding.bind_cpu_input("X", X)  # a captured graph cannot read host memory
        binding.bind_output("Y", "webgpu")
        with pytest.raises(CaptureStateError, match="host"):
            session.capture(binding)
        assert binding.session_outputs() == {"Y": "webgpu"} and binding.outputs() == {}
        assert binding.captured_by == ()
        session.run_with_iobinding(binding, ortgpu.RunOptions(gpu_graph_id=-1))
        np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], _onnxruntime_by_name(X))
        binding.get_outputs()[0].release()


def test_binding_by_name_and_by_value_replace_each_other(env: ortgpu.Env) -> None:
    with ortgpu.InferenceSession(MODEL, env=env) as session:
        binding = session.io_binding()
        binding.bind_cpu_input("X", X)
        target = session.allocator.empty((2, 3), np.float32)
        binding.bind_output("Y", target)
        binding.bind_output("Y", "webgpu")
        assert binding.outputs() == {} and binding.session_outputs() == {"Y": "webgpu"}
        binding.bind_output("Y", target)
        assert binding.outputs() == {"Y": target} and binding.session_outputs() == {}
        session.run_with_iobinding(binding)
        assert binding.get_outputs() == [target]
        np.testing.assert_array_equal(target.to_numpy(), _onnxruntime_by_name(X))
        binding.bind_output("Y")
        binding.clear_binding_outputs()
        assert binding.session_outputs() == {} and binding.get_outputs() == []
        target.release()


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        (("Y", "cuda"), InvalidArgumentError, "'cpu'.*'webgpu'"),
        (("Y", "cpu", -1), ortgpu.ArgumentTypeError, "device_id"),
        (("Y", "cpu", "0"), ortgpu.ArgumentTypeError, "device_id"),
        (("Z",), InvalidArgumentError, "no output 'Z'"),
        (("Y", "cpu", 0, np.float32, [2, 3], 12345), UnsafeAccessError, "raw device memory"),
    ],
)
def test_bad_bind_output_by_name_raises_and_changes_nothing(
    env: ortgpu.Env, arguments: tuple[Any, ...], error: type[Exception], match: str
) -> None:
    with ortgpu.InferenceSession(MODEL, env=env) as session:
        binding = session.io_binding()
        binding.bind_output("Y", "webgpu")
        with pytest.raises(error, match=match):
            binding.bind_output(*arguments)
        assert binding.session_outputs() == {"Y": "webgpu"} and binding.outputs() == {}


def test_an_unbound_output_names_both_ways_to_bind_it(env: ortgpu.Env) -> None:
    with ortgpu.InferenceSession(MODEL, env=env) as session:
        binding = session.io_binding()
        binding.bind_cpu_input("X", X)
        with pytest.raises(InvalidArgumentError, match=r"bind_output\(name, 'webgpu'\)"):
            session.run_with_iobinding(binding)


def test_threads_each_with_a_binding_get_their_own_outputs_and_dropped_values_free(env: ortgpu.Env) -> None:
    """Two threads run one session, each through its own binding with the output bound by name: each reads its own
    results; the values the session allocated and nobody released are freed when dropped (the env fixture fails the
    test on a leaked native object); a binding is not copyable."""
    import copy
    import gc
    import threading

    with ortgpu.InferenceSession(MODEL, env=env) as session:
        failures: list[str] = []

        def worker(sign: float) -> None:
            binding = session.io_binding()
            x = session.allocator.from_numpy(sign * X)
            binding.bind_input("X", x)
            binding.bind_output("Y", "webgpu")
            for _ in range(20):
                session.run_with_iobinding(binding)
                if not np.array_equal(binding.copy_outputs_to_cpu()[0], _onnxruntime_by_name(sign * X)):
                    failures.append(f"thread {sign}: wrong output")
            x.release()

        threads = [threading.Thread(target=worker, args=(sign,)) for sign in (1.0, -1.0)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures, failures
        binding = session.io_binding()
        with pytest.raises(ortgpu.UnsafeAccessError):
            copy.copy(binding)
        gc.collect()
