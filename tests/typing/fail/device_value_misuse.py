"""Misuse of device values that mypy must reject.  Each line marked with an expect comment (code in brackets) must fail with that mypy error code."""

from __future__ import annotations

import numpy as np

import ortgpu
from ortgpu import CPU, OrtValue, WebGPU


def misuse(value: OrtValue[WebGPU]) -> None:
    value.numpy()  # expect: [misc]
    value.__dlpack__()  # expect: [misc]
    value.data_ptr()  # expect: [misc]


def wants_cpu(value: OrtValue[CPU]) -> None:
    value.numpy()


def wrong_placement(env: ortgpu.Env) -> None:
    device_value = env.shared_allocator().empty((2,), "float32")
    wants_cpu(device_value)  # expect: [arg-type]
    cpu_value: OrtValue[CPU] = OrtValue.ortvalue_from_numpy(np.zeros(2, np.float32), "webgpu")  # expect: [assignment]
    del cpu_value
