"""The plan for a binding's values, and every check a bound run or a capture makes on the binding first.

A bound run (``run_with_iobinding``), a capture and verify mode all start here: every input bound, every output
bound to a value of the planned dtype and shape (or by name, for the session to allocate:
:func:`ortgpu._capture.allocate_session_outputs`), provenance checked, and for a capture no host values and no
aliasing between outputs or between an input and an output.  Inputs whose values decide the plan (a trip count, a
target shape) are read to the host: a captured graph re-checks them before each replay (at most
:data:`MAX_GUARDED_BYTES`).
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

import numpy as np

from ortgpu_core import CaptureStateError, InvalidArgumentError, ShapeError

from ._capture import AnyBinding, AnyValue
from ._planner import ExecutionPlan
from .loader._model import LoadedModel

__all__ = ["MAX_GUARDED_BYTES", "BoundPlanHost", "plan_for_binding"]

#: The most bytes of value-deciding inputs (a sample rate, a trip count, a target shape) a captured graph may depend
#: on: each replay reads them back and compares them with their values at capture.
MAX_GUARDED_BYTES = 4096


class BoundPlanHost(Protocol):
    """What planning a binding needs from the session's runner."""

    @property
    def model(self) -> LoadedModel: ...
    @property
    def input_names(self) -> list[str]: ...
    @property
    def output_names(self) -> list[str]: ...
    def check_value(self, value: object, what: str) -> None: ...
    def values_deciding_shapes(
        self, values: Mapping[str, AnyValue], cpu_inputs: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]: ...
    def plan_for(
        self,
        shapes: Mapping[str, tuple[int, ...]],
        dtypes: Mapping[str, np.dtype[Any]],
        values: Mapping[str, np.ndarray] | None = None,
    ) -> ExecutionPlan: ...


def plan_for_binding(
    runner: BoundPlanHost, binding: AnyBinding, *, for_capture: bool, deciding: dict[str, np.ndarray] | None = None
) -> ExecutionPlan:
    """The plan for a binding's values; ``deciding`` (a dict to fill) receives the host copies of the inputs whose
    values decided it (what a captured graph re-checks before each replay)."""
    inputs, outputs, cpu_inputs = binding.inputs(), binding.outputs(), binding.cpu_inputs()
    missing = [n for n in runner.input_names if n not in inputs and n not in cpu_inputs]
    if missing:
        raise (
            CaptureStateError(
                f"inputs {missing} are not bound; bind every input (binding.bind_input(name, value)) before running"
            )
            if for_capture
            else InvalidArgumentError(f"inputs {missing} are not bound; bind every input before running")
        )
    by_name = binding.session_outputs()
    unbound = [n for n in runner.output_names if n not in outputs and n not in by_name]
    if unbound:
        message = (
            f"outputs {unbound} are not bound; bind each to a device value (binding.bind_output(name, "
            f"session.allocator.empty(shape, dtype))), or by name for the session to allocate (binding.bind_output(name, "
            f"'webgpu'))"
        )
        raise CaptureStateError(message) if for_capture else InvalidArgumentError(message)
    for name, value in list(inputs.items()) + list(outputs.items()):
        runner.check_value(value, f"bound value {name!r}")
    if for_capture:
        # A host array may stay bound where its value only decides the plan (checked against the plan below).
        host = [n for n in cpu_inputs if n not in runner.model.value_dependent_inputs]
        host += [n for n, v in inputs.items() if v.provenance.placement == "cpu"]
        host_out = [n for n, v in outputs.items() if v.provenance.placement == "cpu"]
        if host or host_out:
            raise CaptureStateError(
                f"cannot capture with host values bound ({sorted(host + host_out)}): a captured graph replays device "
                f"buffers only; bind device values and update them with value.update_inplace(array)"
            )
    shapes = {n: tuple(v.shape()) for n, v in inputs.items()}
    shapes.update({n: tuple(a.shape) for n, a in cpu_inputs.items()})
    dtypes = {n: v.dtype for n, v in inputs.items()}
    dtypes.update({n: a.dtype for n, a in cpu_inputs.items()})
    values = runner.values_deciding_shapes(inputs, cpu_inputs)
    if for_capture and values:
        size = sum(value.nbytes for value in values.values())
        if size > MAX_GUARDED_BYTES:
            raise CaptureStateError(
                f"cannot capture: inputs {sorted(values)} decide shapes, branches or trip counts by their values "
                f"({size} bytes), and a captured graph re-reads such inputs before every replay to refuse a "
                f"changed value (up to {MAX_GUARDED_BYTES} bytes); run this model with gpu_graph_id=-1"
            )
    if deciding is not None:
        deciding.update(values)
    plan = runner.plan_for(shapes, dtypes, values)
    for name, info in plan.output_infos.items():
        if name in by_name:
            continue  # the session allocates it, of this shape
        value = outputs[name]
        if tuple(value.shape()) != info.shape or value.dtype != info.dtype:
            raise ShapeError(
                f"output {name!r} is {info.dtype} of shape {list(info.shape)} for these inputs, but the bound value is "
                f"{value.dtype} of shape {value.shape()}; bind a value of that dtype and shape"
            )
    _check_shared_buffers(plan, inputs, outputs, for_capture)
    read_on_host = sorted(set(cpu_inputs) - plan.unread_inputs)
    if for_capture and read_on_host:
        raise CaptureStateError(
            f"cannot capture with inputs {read_on_host} bound on the host: their values decide the plan, but device "
            f"work reads them too, and a captured graph replays device buffers only; bind device values"
        )
    if for_capture and not plan.capturable:
        raise CaptureStateError(
            f"cannot capture: nodes {plan.cpu_nodes} run on the CPU (see session.get_node_placement(), which says "
            f"why), and a captured graph can only replay device work; run this model with gpu_graph_id=-1"
        )
    return plan


def _check_shared_buffers(
    plan: ExecutionPlan, inputs: dict[str, Any], outputs: dict[str, Any], for_capture: bool
) -> None:
    """Refuse two outputs bound to one device buffer, and an input and an output bound to one buffer unless they are
    an operator's in-place pair that the plan reads before it writes (:meth:`ExecutionPlan.may_share`: a KV cache
    updated in place); the error names the pair and what to do."""
    error = CaptureStateError if for_capture else InvalidArgumentError
    by_buffer: dict[Any, str] = {}
    for name, value in outputs.items():
        buffer = value._device_buffer
        if buffer is None:
            continue
        other = by_buffer.setdefault(buffer.identity, name)
        if other != name:
            raise error(
                f"outputs {other!r} and {name!r} are bound to the same value; bind a distinct value to each output"
            )
    for name, value in inputs.items():
        buffer = value._device_buffer
        if buffer is None or buffer.identity not in by_buffer:
            continue
        output = by_buffer[buffer.identity]
        if not plan.may_share(name, output):
            raise error(
                f"input {name!r} and output {output!r}: one value bound both as an input and as an output; bind "
                "distinct values (only an operator's cache may be updated in place, where it reads the input before "
                "writing the output: GroupQueryAttention's past and present keys and values)"
            )
