"""The data types of an execution plan: where each tensor lives and what each step runs.

:func:`~ortgpu._planner.plan_model` makes an :class:`ExecutionPlan`;
:class:`~ortgpu._executor.DeviceProgram` instantiates one on a device.  These
records hold no behaviour beyond describing themselves, so every module of the
planner (rewrites, memory plan) and of the executor can import them without
importing each other.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from typing import Any, Hashable, Literal, Mapping

import numpy as np

from .ops import DeviceCaps, Operator, OpPlan, TensorInfo

__all__ = [
    "constant_digest",
    "Placement",
    "PlacementRow",
    "Storage",
    "PlannedStep",
    "PlannedTensor",
    "ExecutionPlan",
    "root_of",
]

Placement = Literal["webgpu", "cpu"]
Storage = Literal["input", "output", "constant", "intermediate", "alias"]


@dataclass(frozen=True)
class PlannedTensor:
    """Where a tensor lives while a plan runs.

    ``storage``: ``input``/``output`` (the caller's buffer of that name),
    ``constant`` (an uploaded weight), ``intermediate`` (buffer slot ``slot``),
    ``alias`` (the buffer of tensor ``alias_of``, unchanged: Reshape and the like).
    """

    name: str
    info: TensorInfo
    storage: Storage
    slot: int = -1
    alias_of: str = ""


@dataclass(frozen=True)
class PlannedStep:
    """One node, or a fused group whose first node is the producer."""

    node_names: tuple[str, ...]
    op_types: tuple[str, ...]
    placement: Placement
    reason: str
    operator: Operator
    attrs: Mapping[str, Any]
    inputs: tuple[str, ...]  # "" for an absent optional input
    outputs: tuple[str, ...]
    input_infos: tuple[TensorInfo | None, ...]
    output_infos: tuple[TensorInfo, ...]
    op_plan: OpPlan | None  # None on the CPU
    scratch_slots: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return self.node_names[0]

    @property
    def op_type(self) -> str:
        return "+".join(self.op_types)


def constant_digest(value: np.ndarray) -> str:
    """A digest of a computed constant's bytes: with its name, dtype and shape, the key its upload is shared by."""
    data: Any = np.ascontiguousarray(value).reshape(-1).view(np.uint8)  # hashed in place, not copied to bytes
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def root_of(tensors: Mapping[str, PlannedTensor], name: str) -> str:
    """The tensor whose buffer ``name`` lives in (following aliases)."""
    tensor = tensors[name]
    while tensor.storage == "alias":
        tensor = tensors[tensor.alias_of]
    return tensor.name


#: Where one node runs: (node name, op type, "webgpu" or "cpu", reason, the control-flow node that runs it whole as
#: part of its subgraph, or "").
PlacementRow = tuple[str, str, str, str, str]


@dataclass
class ExecutionPlan:
    """Everything needed to run a model for one input-shape signature.

    ``constants`` holds every constant a step reads (CPU steps read them on the
    host); ``constant_keys`` those to upload, with their :class:`WeightStore` keys.
    ``output_copies`` lists ``(step index, graph output, source tensor)``: after
    that step (index -1: before the first) the source's bytes are copied into
    the output's buffer, because the output is an alias, an input, a constant
    or another output's tensor.
    """

    caps: DeviceCaps
    input_infos: dict[str, TensorInfo]
    output_infos: dict[str, TensorInfo]
    steps: list[PlannedStep]
    tensors: dict[str, PlannedTensor]
    slot_sizes: list[int]
    constants: dict[str, np.ndarray]
    constant_keys: dict[str, Hashable]
    output_copies: list[tuple[int, str, str]]
    placement: list[PlacementRow]
    folded_nodes: list[str] = field(default_factory=list)

    @property
    def cpu_nodes(self) -> list[str]:
        """The names of the nodes the plan runs on the host."""
        return [name for step in self.steps if step.placement == "cpu" for name in step.node_names]

    @property
    def capturable(self) -> bool:
        """Whether every step runs on the device, so the plan's work can be recorded as a graph."""
        return not any(step.placement == "cpu" for step in self.steps)

    @functools.cached_property
    def unread_inputs(self) -> frozenset[str]:
        """Graph inputs nothing reads: no host step, no kernel (through aliases: a Reshape's input is read where its
        output is), no output copy.  Inputs whose values were folded into the plan (a sample rate that chose an
        ``If`` branch, a total length that sized a cache), or that no output depends on.  They need no device
        buffer, and a capture may keep them bound on the host."""
        read: set[str] = set()

        def mark(name: str) -> None:
            if name:
                read.add(self.root(name) if name in self.tensors else name)

        for step in self.steps:
            if step.op_plan is None:
                for name in step.inputs:
                    mark(name)
                continue
            for kernel in step.op_plan.kernels:
                for binding in kernel.bindings:
                    if binding.kind == "input" and binding.index < len(step.inputs):
                        mark(step.inputs[binding.index])
        for _, _, source in self.output_copies:
            mark(source)
        return frozenset(name for name in self.input_infos if name not in read)

    def root(self, name: str) -> str:
        """The tensor whose buffer ``name`` lives in (following aliases)."""
        return root_of(self.tensors, name)

    @functools.cached_property
    def buffer_events(self) -> list[tuple[frozenset[str], frozenset[str]]]:
        """What each dispatch, host step and output copy reads and writes, in run order, as the root tensors of the
        buffers it binds: (read, written)."""
        events: list[tuple[frozenset[str], frozenset[str]]] = []
        copies: dict[int, list[tuple[str, str]]] = {}
        for index, output, source in self.output_copies:
            copies.setdefault(index, []).append((source, output))

        def add_copies(index: int) -> None:
            for source, output in copies.get(index, []):
                events.append((frozenset({self.root(source)}), frozenset({self.root(output)})))

        add_copies(-1)
        for index, step in enumerate(self.steps):
            inputs = [self.root(name) if name else "" for name in step.inputs]
            outputs = [self.root(name) if name else "" for name in step.outputs]
            if step.op_plan is None:
                events.append((frozenset(n for n in inputs if n), frozenset(n for n in outputs if n)))
            else:
                for kernel in step.op_plan.kernels:
                    read = {inputs[b.index] for b in kernel.bindings if b.kind == "input" and b.index < len(inputs)}
                    written = {
                        outputs[b.index] for b in kernel.bindings if b.kind == "output" and b.index < len(outputs)
                    }
                    events.append((frozenset(n for n in read if n), frozenset(n for n in written if n)))
            add_copies(index)
        return events

    def may_share(self, read: str, written: str) -> bool:
        """Whether graph input ``read`` and graph output ``written`` may be bound to one value: a step's operator
        declares them an in-place pair (:attr:`~ortgpu.ops.Operator.in_place_pairs`, the input and output feeding
        its positions directly) and the plan reads the input before it writes the output."""
        for step in self.steps:
            for position, output in step.operator.in_place_pairs:
                if position >= len(step.inputs) or output >= len(step.outputs):
                    continue
                if step.inputs[position] and step.outputs[output]:
                    if self.root(step.inputs[position]) == read and self.root(step.outputs[output]) == written:
                        return self.reads_before_writes(read, written)
        return False

    def reads_before_writes(self, read: str, written: str) -> bool:
        """Whether graph input ``read`` and graph output ``written`` may share one buffer: every dispatch, host step
        or copy that reads the input comes before the first that writes the output, and none does both (a KV cache
        read as the past and written as the present: GroupQueryAttention assembles the cache from the past before it
        writes the present)."""
        first_write = None
        last_read = -1
        for index, (reads, writes) in enumerate(self.buffer_events):
            if read in reads:
                last_read = index
            if written in writes and first_write is None:
                first_write = index
        return first_write is None or last_read < first_write

    def describe(self) -> str:
        lines = [f"{len(self.steps)} steps, {len(self.slot_sizes)} buffer slots ({sum(self.slot_sizes)} bytes)"]
        for name, op_type, where, reason, _ in self.placement:
            lines.append(f"  {name:30s} {op_type:24s} {where:7s} {reason}")
        return "\n".join(lines)
