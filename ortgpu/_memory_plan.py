"""The memory plan: where each tensor of a planned step list lives, and which intermediates share a buffer.

:func:`plan_memory` gives every tensor a :class:`~ortgpu._plan_types.PlannedTensor` (a graph input or output,
a constant, an alias of another tensor's buffer, or an intermediate in a buffer slot), lists the outputs that
must be copied into their buffers, and assigns intermediates and kernel scratch buffers to reusable slots: a
slot is free again after the last step that reads the tensor in it (liveness), and a new tensor takes the
best-fitting free slot.  :func:`uploaded_constants` says which constants the steps read and which of those go to
the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ModelError, ShapeError

from ._plan_types import PlannedStep, PlannedTensor, root_of
from .ops import DeviceCaps, TensorInfo
from .ops._runner import padded_size

__all__ = ["MemoryPlan", "plan_memory", "uploaded_constants"]


@dataclass(frozen=True)
class MemoryPlan:
    """Every tensor's storage; the steps again, each with its scratch slots; the slots' byte sizes; and the
    ``(step index, graph output, source tensor)`` copies of outputs their producer does not write directly."""

    tensors: dict[str, PlannedTensor]
    steps: list[PlannedStep]
    slot_sizes: list[int]
    output_copies: list[tuple[int, str, str]]


def plan_memory(
    steps: Sequence[PlannedStep],
    input_infos: Mapping[str, TensorInfo],
    output_names: Sequence[str],
    infos: Mapping[str, TensorInfo],
    constants: Mapping[str, np.ndarray],
    caps: DeviceCaps,
) -> MemoryPlan:
    """Storage of every tensor ``steps`` read or write, and slots for the intermediates and scratch buffers.

    Raises :class:`ModelError` when a step reads a tensor nothing produces, :class:`ShapeError` when a scratch
    buffer exceeds the device's storage binding limit.
    """
    tensors: dict[str, PlannedTensor] = {}
    for name, info in input_infos.items():
        tensors[name] = PlannedTensor(name, info, "input")
    output_set = set(output_names)
    produced_direct: set[str] = set()
    for step in steps:
        alias = step.op_plan.alias if step.op_plan is not None else {}
        for index, name in enumerate(step.outputs):
            if not name:
                continue
            info = step.output_infos[index]
            if index in alias:
                tensors[name] = PlannedTensor(name, info, "alias", alias_of=step.inputs[alias[index]])
            elif name in output_set:
                tensors[name] = PlannedTensor(name, info, "output")
                produced_direct.add(name)
            else:
                tensors[name] = PlannedTensor(name, info, "intermediate")
        for name in step.inputs:
            if name and name not in tensors:
                if name not in constants:
                    raise ModelError(f"tensor {name!r} read by node {step.name!r} is produced by no earlier node")
                tensors[name] = PlannedTensor(name, infos[name], "constant")
    for name in output_names:
        if name not in tensors and name in constants:
            tensors[name] = PlannedTensor(
                name, TensorInfo(tuple(constants[name].shape), constants[name].dtype), "constant"
            )

    def root(name: str) -> str:
        return root_of(tensors, name)

    # Output copies: outputs that are not written directly by their producer.
    producing_step: dict[str, int] = {}
    for index, step in enumerate(steps):
        for name in step.outputs:
            if name:
                producing_step[name] = index
    output_copies: list[tuple[int, str, str]] = []
    for name in output_names:
        if name in produced_direct:
            continue
        output_copies.append((producing_step.get(name, -1), name, root(name)))

    # Liveness of buffer roots: last step that reads them (a copy counts as a read).
    last_use: dict[str, int] = {}
    for index, step in enumerate(steps):
        for name in step.inputs:
            if name:
                last_use[root(name)] = index
        for name in step.outputs:
            if name:
                last_use.setdefault(root(name), index)
                last_use[root(name)] = max(last_use[root(name)], index)
    for index, _, source in output_copies:
        last_use[source] = max(last_use.get(source, index), index)

    slot_sizes: list[int] = []
    free_slots: list[int] = []
    slot_of: dict[str, int] = {}
    dying_at: dict[int, list[str]] = {}
    planned_steps: list[PlannedStep] = []
    for index, step in enumerate(steps):
        for name in step.outputs:
            if name and tensors[name].storage == "intermediate" and tensors[name].info.dtype != object:
                # (string tensors live on the host: no device slot)
                slot = _take_slot(padded_size(tensors[name].info.nbytes), slot_sizes, free_slots)
                slot_of[name] = slot
                dying_at.setdefault(last_use.get(name, index), []).append(name)
        scratch: tuple[int, ...] = ()
        if step.op_plan is not None and step.op_plan.scratch_sizes:
            for size in step.op_plan.scratch_sizes:
                if padded_size(size) > caps.limits.max_storage_buffer_binding_size:
                    raise ShapeError(
                        f"node {step.name!r} ({step.op_type}) needs a {size}-byte scratch buffer, over the "
                        f"device's max_storage_buffer_binding_size; use smaller input shapes"
                    )
            scratch = tuple(_take_slot(padded_size(s), slot_sizes, free_slots) for s in step.op_plan.scratch_sizes)
        planned_steps.append(_with_scratch(step, scratch))
        free_slots.extend(scratch)
        for name in dying_at.pop(index, []):
            free_slots.append(slot_of[name])
    for name, slot in slot_of.items():
        tensors[name] = PlannedTensor(name, tensors[name].info, "intermediate", slot=slot)
    return MemoryPlan(tensors, planned_steps, slot_sizes, output_copies)


def uploaded_constants(
    memory: MemoryPlan, constants: Mapping[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], set[str]]:
    """The constants the steps (and output copies) read, by name, and the names of those the device reads (bound
    to a kernel, or copied into an output): CPU steps read the others on the host."""
    tensors = memory.tensors
    used_constants: dict[str, np.ndarray] = {}
    uploaded: set[str] = set()
    for step in memory.steps:
        bound = _bound_inputs(step)
        for position, name in enumerate(step.inputs):
            if name and tensors[root_of(tensors, name)].storage == "constant":
                used_constants[root_of(tensors, name)] = constants[root_of(tensors, name)]
                if position in bound:
                    uploaded.add(root_of(tensors, name))
    for _, _, source in memory.output_copies:
        if tensors[source].storage == "constant":
            used_constants[source] = constants[source]
            uploaded.add(source)
    return used_constants, uploaded


def _bound_inputs(step: PlannedStep) -> set[int]:
    if step.op_plan is None:
        return set()
    return {b.index for kernel in step.op_plan.kernels for b in kernel.bindings if b.kind == "input"}


def _with_scratch(step: PlannedStep, scratch: tuple[int, ...]) -> PlannedStep:
    if not scratch:
        return step
    return PlannedStep(
        step.node_names,
        step.op_types,
        step.placement,
        step.reason,
        step.operator,
        step.attrs,
        step.inputs,
        step.outputs,
        step.input_infos,
        step.output_infos,
        step.op_plan,
        scratch,
    )


def _take_slot(size: int, slot_sizes: list[int], free_slots: list[int]) -> int:
    """Best fit among free slots; grow the largest free one if none fits; else a new slot."""
    fitting = [s for s in free_slots if slot_sizes[s] >= size]
    if fitting:
        slot = min(fitting, key=lambda s: slot_sizes[s])
    elif free_slots:
        slot = max(free_slots, key=lambda s: slot_sizes[s])
        slot_sizes[slot] = size
    else:
        slot_sizes.append(size)
        return len(slot_sizes) - 1
    free_slots.remove(slot)
    return slot
