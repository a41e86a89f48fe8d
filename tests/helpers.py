"""Test drivers that production code does not need: :func:`run_model` runs a model once on a raw backend device.

Sessions do the same with their allocator, caches and recording; these tests check the planner and the executor
without them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ortgpu._executor import DeviceProgram, device_caps, padded_bytes
from ortgpu._pipeline_cache import PipelineCache
from ortgpu._planner import ExecutionPlan, plan_model
from ortgpu.loader._model import LoadedModel, load_model
from ortgpu.ops._runner import padded_size
from ortgpu_core.backends._commands import CommandList
from ortgpu_core.backends.protocol import BackendDevice, BindingEntry

__all__ = ["FrozenKernel", "RawBuffer", "run_model", "SCALE_KERNEL"]

#: A WGSL kernel for raw-device tests: y = 2x + 1 over binding 1's length (x at binding 0).
SCALE_KERNEL = """
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < arrayLength(&y)) {
        y[i] = x[i] * 2.0 + 1.0;
    }
}
"""

_raw_generations = itertools.count(1)


class FrozenKernel:
    """A two-binding kernel (``x`` read at binding 0, ``y`` written at binding 1, ``n`` floats each) dispatched by a
    frozen (captured-like) list on a raw backend device: the shape of a replay, without a session."""

    def __init__(self, device: Any, kernel: str, n: int, label: str) -> None:
        self.device = device
        self.n = n
        nbytes = n * 4
        self.pipeline = device.create_compute_pipeline(kernel, label=label)
        self.x = device.create_buffer(nbytes)
        self.y = device.create_buffer(nbytes)
        self.group = device.create_bind_group(
            self.pipeline, [BindingEntry(0, self.x, 0, nbytes), BindingEntry(1, self.y, 0, nbytes)]
        )
        self.commands = CommandList()
        self.commands.add_dispatch(self.pipeline, self.group, (n + 63) // 64)
        self.commands.freeze()

    def submit(self, x: np.ndarray, read_ahead: bool = True) -> None:
        """Write ``x`` and submit the list, naming all of ``y`` to be read ahead if ``read_ahead``."""
        self.device.write_buffer(self.x, 0, np.ascontiguousarray(x, np.float32).tobytes())
        self.device.submit(self.commands, [(self.y, 0, self.n * 4)] if read_ahead else [])

    def read(self) -> np.ndarray:
        out = np.empty(self.n, np.float32)
        self.device.read_buffer_into(self.y, 0, out)
        return out

    def release(self) -> None:
        self.device.release_bind_group(self.group)
        for buffer in (self.x, self.y):
            self.device.destroy_buffer(buffer)
        self.device.release_pipeline(self.pipeline)


@dataclass(eq=False)
class RawBuffer:
    """A buffer made directly on a backend device (no allocator, no core Device), as programs take buffers."""

    handle: int
    generation: int
    released: bool = False


def run_model(
    model: Any,
    feeds: Mapping[str, np.ndarray],
    device: BackendDevice,
    *,
    pipeline_cache: PipelineCache | None = None,
    allow_cpu: bool = True,
    fuse: bool = True,
) -> tuple[list[np.ndarray], ExecutionPlan]:
    """Load (if needed), plan and run ``model`` once on ``device``; returns the outputs and the plan.

    Every buffer it makes (and the pipeline cache, unless given) is freed before it returns.
    """
    loaded = model if isinstance(model, LoadedModel) else load_model(model)
    arrays = {name: np.asarray(value, order="C") for name, value in feeds.items()}
    plan = plan_model(
        loaded,
        {name: a.shape for name, a in arrays.items()},
        device_caps(device),
        input_dtypes={name: a.dtype for name, a in arrays.items()},
        input_values={name: arrays[name] for name in loaded.value_dependent_inputs if name in arrays},
        allow_cpu=allow_cpu,
        fuse=fuse,
    )
    cache = pipeline_cache if pipeline_cache is not None else PipelineCache(device)
    owned: list[RawBuffer] = []

    def allocate(nbytes: int, label: str = "intermediate") -> RawBuffer:
        buffer = RawBuffer(device.create_buffer(nbytes, label=label), next(_raw_generations))
        owned.append(buffer)
        return buffer

    program = None
    try:
        program = DeviceProgram(plan, device, cache, allocate, lambda buffer: None)  # all freed below
        input_buffers = {}
        for name, array in arrays.items():
            buffer = allocate(padded_size(array.nbytes), "input")
            if array.nbytes:
                device.write_buffer(buffer.handle, 0, padded_bytes(array))
            input_buffers[name] = buffer
        output_buffers = {
            name: allocate(padded_size(info.nbytes), "output") for name, info in plan.output_infos.items()
        }
        program.run(input_buffers, output_buffers, device.submit)
        results = []
        for name in loaded.output_names:
            info = plan.output_infos[name]
            if info.nbytes == 0:
                results.append(np.zeros(info.shape, dtype=info.dtype))
                continue
            raw = device.read_buffer(output_buffers[name].handle, 0, padded_size(info.nbytes))
            results.append(
                np.frombuffer(raw, dtype=np.uint8, count=info.nbytes).view(info.dtype).reshape(info.shape).copy()
            )
        return results, plan
    finally:
        if program is not None:
            program.release()
        for buffer in owned:
            buffer.released = True
            device.destroy_buffer(buffer.handle)
        if pipeline_cache is None:
            cache.release()
