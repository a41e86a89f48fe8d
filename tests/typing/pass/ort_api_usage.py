"""User code that must type-check under mypy --strict: an onnxruntime program with only the import changed."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

import ortgpu as ort


def infer(path: str, x: npt.NDArray[np.float32]) -> list[object]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.intra_op_num_threads = 4
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "0")
    so.add_free_dimension_override_by_name("batch", int(x.shape[0]))
    providers: list[str] = ort.get_available_providers()
    sess = ort.InferenceSession(path, sess_options=so, providers=providers)
    names: list[str] = sess.get_providers()
    options: dict[str, dict[str, str]] = sess.get_provider_options()
    meta: ort.ModelMetadata = sess.get_modelmeta()
    run_options = ort.RunOptions()
    run_options.log_severity_level = 3
    value = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(x, 1)
    size: int = value.tensor_size_in_bytes()
    del names, options, meta, size
    return sess.run(None, {sess.get_inputs()[0].name: x}, run_options)


def bound_run(path: str, x: npt.NDArray[np.float32], gpu: bool) -> list[npt.NDArray[Any]]:
    """onnxruntime's habits with a device type held in a ``str``, and outputs the session allocates."""
    device_type = "webgpu" if gpu else "cpu"
    sess = ort.InferenceSession(path, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    value = ort.OrtValue.ortvalue_from_numpy(x, device_type, 0)
    empty = ort.OrtValue.ortvalue_from_shape_and_type([1, 3], np.float32, device_type, 0)
    del empty
    binding = sess.io_binding()
    binding.bind_input(sess.get_inputs()[0].name, value)
    binding.bind_output(sess.get_outputs()[0].name)
    binding.bind_output(sess.get_outputs()[0].name, device_type, 0)
    sess.run_with_iobinding(binding)
    outputs = binding.get_outputs()
    del outputs
    return binding.copy_outputs_to_cpu()
