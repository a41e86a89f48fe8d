"""Run one node's :class:`OpPlan` on a backend device, outside any session.

Used by the operator tests and the conformance suite to check a kernel
against its reference on a real (or fake) device; the executor does the same
work with cached pipelines and planned buffers.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ortgpu_core._errors import InvalidArgumentError
from ortgpu_core._value import padded_payload
from ortgpu_core.backends._commands import CommandList
from ortgpu_core.backends.protocol import BackendDevice, BindingEntry

from ._kernel import STATUS_BYTES, OpPlan, TensorInfo

__all__ = ["padded_size", "run_plan"]


def padded_size(nbytes: int) -> int:
    """Bytes to allocate for a tensor of ``nbytes``: a multiple of 4, at least 4."""
    return max(4, (nbytes + 3) // 4 * 4)


def run_plan(
    device: BackendDevice,
    plan: OpPlan,
    inputs: Sequence[np.ndarray | None],
    outputs: Sequence[TensorInfo],
) -> list[np.ndarray]:
    """Upload ``inputs``, run ``plan``'s kernels in one submission, read the outputs back."""
    owned: list[int] = []
    pipelines: list[int] = []
    bind_groups: list[int] = []
    try:
        input_buffers: list[int | None] = []
        for array in inputs:
            if array is None:
                input_buffers.append(None)
                continue
            buffer = device.create_buffer(padded_size(array.nbytes), label="input")
            owned.append(buffer)
            device.write_buffer(buffer, 0, padded_payload(array))
            input_buffers.append(buffer)
        output_buffers: list[int] = []
        for index, info in enumerate(outputs):
            if index in plan.alias:
                aliased = input_buffers[plan.alias[index]]
                assert aliased is not None
                output_buffers.append(aliased)
                continue
            buffer = device.create_buffer(padded_size(info.nbytes), label="output")
            owned.append(buffer)
            output_buffers.append(buffer)
        scratch = []
        for size in plan.scratch_sizes:
            buffer = device.create_buffer(padded_size(size), label="scratch")
            owned.append(buffer)
            scratch.append(buffer)

        status: int | None = None
        if any(b.kind == "status" for kernel in plan.kernels for b in kernel.bindings):
            status = device.create_buffer(STATUS_BYTES, label="status")
            owned.append(status)
            device.write_buffer(status, 0, bytes(STATUS_BYTES))
        commands = CommandList()
        for kernel in plan.kernels:
            pipeline = device.create_compute_pipeline(kernel.wgsl, twin=kernel.twin, label=kernel.name)
            pipelines.append(pipeline)
            entries = []
            for slot, binding in enumerate(kernel.bindings):
                if binding.kind == "params":
                    buffer = device.create_buffer(padded_size(len(kernel.params)), uniform=True, label="params")
                    owned.append(buffer)
                    device.write_buffer(
                        buffer, 0, kernel.params + b"\0" * (padded_size(len(kernel.params)) - len(kernel.params))
                    )
                elif binding.kind == "input":
                    maybe = input_buffers[binding.index]
                    assert maybe is not None, "a kernel binds an absent optional input"
                    buffer = maybe
                elif binding.kind == "output":
                    buffer = output_buffers[binding.index]
                elif binding.kind == "status":
                    assert status is not None
                    buffer = status
                else:
                    buffer = scratch[binding.index]
                entries.append(
                    BindingEntry(
                        slot, buffer, 0, _buffer_size(device, buffer, owned, inputs, outputs, kernel, binding, plan)
                    )
                )
            bind_group = device.create_bind_group(pipeline, entries)
            bind_groups.append(bind_group)
            commands.add_dispatch(pipeline, bind_group, *kernel.grid)
        device.submit(commands)
        if status is not None and np.frombuffer(device.read_buffer(status, 0, STATUS_BYTES), np.uint32)[0]:
            raise InvalidArgumentError("a kernel found invalid data (an index out of range)")
        results = []
        for info, buffer in zip(outputs, output_buffers):
            raw = device.read_buffer(buffer, 0, padded_size(info.nbytes))
            results.append(np.frombuffer(raw[: info.nbytes], dtype=info.dtype).reshape(info.shape).copy())
        return results
    finally:
        for bind_group in bind_groups:
            device.release_bind_group(bind_group)
        for pipeline in pipelines:
            device.release_pipeline(pipeline)
        for buffer in owned:
            device.destroy_buffer(buffer)


def _buffer_size(device, buffer, owned, inputs, outputs, kernel, binding, plan) -> int:  # type: ignore[no-untyped-def]
    if binding.kind == "params":
        return padded_size(len(kernel.params))
    if binding.kind == "status":
        return STATUS_BYTES
    if binding.kind == "input":
        array = inputs[binding.index]
        assert array is not None
        return padded_size(array.nbytes)
    if binding.kind == "output":
        if binding.index in plan.alias:
            array = inputs[plan.alias[binding.index]]
            assert array is not None
            return padded_size(array.nbytes)
        return padded_size(outputs[binding.index].nbytes)
    return padded_size(plan.scratch_sizes[binding.index])
