"""User code that must type-check under mypy --strict: the full capture workflow."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

import ortgpu
from ortgpu import CPU, CapturedGraph, FrozenIOBinding, IOBinding, OrtValue, WebGPU


def make_inputs(env: ortgpu.Env, batch: npt.NDArray[np.float32]) -> OrtValue[WebGPU]:
    shared = env.shared_allocator(env.default_device)
    value = shared.empty(batch.shape, "float32")
    value.update_inplace(batch)
    return value


def serve(path: str, batches: list[npt.NDArray[np.float32]]) -> list[npt.NDArray[np.float32]]:
    env = ortgpu.get_env()
    device: ortgpu.Device = env.default_device
    print(device.vendor_id, device.device_id, device.name, device.backend_type, device.adapter_type)
    results: list[npt.NDArray[np.float32]] = []
    with ortgpu.InferenceSession(path, env=env, device=device, graph_capture=True) as sess:
        x = make_inputs(env, batches[0])
        y: OrtValue[WebGPU] = sess.create_ortvalue_from_shape_and_type((1, 1024), "float32", "webgpu", 0)
        binding: IOBinding = sess.io_binding()
        binding.bind_input("X", x)
        binding.bind_output("Y", y)
        frozen: FrozenIOBinding = binding.freeze()
        graph: CapturedGraph = sess.capture(frozen, graph_id=0)
        with graph:
            for batch in batches:
                x.update_inplace(batch)
                graph.replay()
                results.append(y.to_numpy())
        sess.run_with_iobinding(binding, ortgpu.RunOptions(gpu_graph_id=-1))
        outputs = sess.run(None, {"X": batches[0]}, ortgpu.RunOptions(gpu_graph_id=-1))
        results.extend(outputs)
        values = sess.run_with_ort_values(["Y"], {"X": x})
        provenance: ortgpu.Provenance = values[0].provenance
        assert provenance.session_id == sess.session_id
    return results


def cpu_values(array: npt.NDArray[np.float32]) -> int:
    value: OrtValue[CPU] = OrtValue.ortvalue_from_numpy(array)
    host = value.numpy()
    capsule = value.__dlpack__()
    del capsule
    return int(host.size) + value.data_ptr() * 0


def errors_are_a_tree(error: Exception) -> str:
    if isinstance(error, ortgpu.ProvenanceError | ortgpu.CaptureStateError | ortgpu.UnsafeAccessError):
        return "usage"
    if isinstance(error, ortgpu.OutOfMemoryError | ortgpu.DeviceLostError | ortgpu.ValidationError):
        return "device"
    if isinstance(error, ortgpu.OrtGpuError):
        return "other"
    return "foreign"
