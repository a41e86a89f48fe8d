"""Control flow: If, Loop and Scan, run on the CPU by the subgraph interpreter of :mod:`ortgpu.loader._subgraph`.

Their ``GRAPH`` attributes reach them as :class:`ortgpu._types.SubgraphRunner` values (which the loader builds:
these operators never import it).  Outer-scope tensors a subgraph reads are appended by the loader to the node's
inputs, after the declared ones, in the order of ``SubgraphRunner.outer_names`` (see
:mod:`ortgpu.loader._subgraph`): each operator splits its ``inputs`` into declared inputs and those trailing
outer-scope values.

Shapes: onnx's shape inference often leaves control-flow outputs unknown; the planner then runs ``reference``
once on the constants and zeros.  ``If``'s condition and ``Loop``'s trip count and condition decide shapes, so
they are shape-deciding inputs (``ortgpu.loader._propagate.SHAPE_INPUT_POSITIONS``): a plan needs their values.  A run
whose shapes differ from the planned ones is a typed error of the executor, never a wrong value.

Limits: a Loop stops with a typed error past :data:`MAX_LOOP_ITERATIONS` iterations or
:data:`MAX_SCAN_OUTPUT_BYTES` of scan outputs (it may run while the model loads, folding constants).

Loop-carried sequences and optionals, and branches returning them, are host values (boxes, see
:mod:`ortgpu.ops.ai_onnx.sequences` and :mod:`ortgpu.ops.ai_onnx.optional`): the bodies pass them on as they are.
Map-typed values are refused with a typed error when the model loads.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ModelError, ShapeError, UnsupportedOpError

from ..._types import SubgraphRunner, numpy_dtype_of
from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register

__all__ = ["If", "Loop", "Scan8", "Scan9", "MAX_LOOP_ITERATIONS", "MAX_SCAN_OUTPUT_BYTES", "declared_output_types"]

#: The most iterations one Loop runs.  Loops run in the CPU interpreter (a few microseconds per body node and
#: iteration), also while a model loads when all their inputs are constants (folding): a trip count like 2**63 - 1
#: with a condition that never turns false would otherwise hang the load.
MAX_LOOP_ITERATIONS = 1_000_000
#: The most bytes a Loop's scan outputs may accumulate (they grow with the iterations, not with any input).
MAX_SCAN_OUTPUT_BYTES = 4 << 30


def _subgraph(attrs: Mapping[str, Any], name: str, op_type: str) -> SubgraphRunner:
    value = attrs.get(name)
    if not isinstance(value, SubgraphRunner):
        raise UnsupportedOpError(f"{op_type}: attribute {name!r} is missing or not a subgraph")
    return value


def _split(
    inputs: Sequence[np.ndarray | None], declared: int, graph: SubgraphRunner, op_type: str
) -> tuple[list[np.ndarray | None], dict[str, np.ndarray]]:
    """The declared inputs, and the trailing outer-scope values by name."""
    names = graph.outer_names
    if len(inputs) != declared + len(names):
        raise ModelError(
            f"{op_type}: got {len(inputs)} inputs; expected {declared} declared ones and {len(names)} outer-scope "
            "values its subgraphs read"
        )
    outer: dict[str, np.ndarray] = {}
    for name, value in zip(names, inputs[declared:]):
        if value is None:
            raise ModelError(f"{op_type}: outer-scope tensor {name!r} has no value")
        outer[name] = value
    return list(inputs[:declared]), outer


def _scalar(value: np.ndarray, what: str) -> Any:
    if value.size != 1:
        raise ShapeError(f"{what} must hold one element; it has shape {list(value.shape)}")
    return value.reshape(-1)[0]


def _declared(graph: SubgraphRunner, index: int) -> tuple[tuple[int, ...], np.dtype[Any]] | None:
    """The static shape and dtype the subgraph declares for its output ``index`` (None: not fully static)."""
    value = graph.graph.output[index]
    tensor = value.type.tensor_type
    if not value.type.HasField("tensor_type") or not tensor.HasField("shape") or tensor.elem_type == 0:
        return None
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
    if any(d is None or d < 0 for d in dims):
        return None
    dtype = numpy_dtype_of(tensor.elem_type)
    if dtype is None:  # a dtype numpy lacks: no declared shape to use
        return None
    return tuple(int(d) for d in dims if d is not None), dtype


def declared_output_types(op_type: str, attrs: Mapping[str, Any]) -> list[tuple[tuple[int, ...], np.dtype[Any]]] | None:
    """The static (shape, dtype) of every output of an ``If`` (both branches declare the same) or of a ``Loop``
    without scan outputs (its body's carried outputs), where the subgraphs declare them all; else None.  The planner
    uses them instead of running the node on zeros to learn its shapes (a long loop would take that long)."""
    if op_type == "If":
        then_branch, else_branch = attrs.get("then_branch"), attrs.get("else_branch")
        if then_branch is None or else_branch is None:
            return None
        found = []
        for index in range(len(then_branch.graph.output)):
            declared = _declared(then_branch, index)
            if declared is None or index >= len(else_branch.graph.output) or _declared(else_branch, index) != declared:
                return None
            found.append(declared)
        return found
    if op_type == "Loop":
        body = attrs.get("body")
        if body is None:
            return None
        carried = len(body.graph.input) - 2
        if carried < 0 or len(body.graph.output) != 1 + carried:
            return None
        found = []
        for index in range(1, 1 + carried):
            declared = _declared(body, index)
            if declared is None:
                return None
            found.append(declared)
        return found
    return None


def _stack(
    parts: list[np.ndarray],
    axis: int,
    info: TensorInfo | None,
    what: str,
    declared: tuple[tuple[int, ...], np.dtype[Any]] | None = None,
) -> np.ndarray:
    """The per-iteration ``parts`` stacked along a new ``axis``.  No part (no iteration ran): an empty tensor
    shaped by the element shape the subgraph ``declared``, else by the planned ``info`` when it is empty."""
    if not parts:
        if declared is not None and 0 <= axis <= len(declared[0]):
            element, dtype = declared
            return np.zeros((*element[:axis], 0, *element[axis:]), dtype=dtype)
        if info is not None and len(info.shape) >= 1 and 0 in info.shape:
            return np.zeros(info.shape, dtype=info.dtype)
        raise ModelError(
            f"{what}: no iteration ran, and the shape of an empty scan output cannot be known here; ortgpu "
            "refuses rather than guess it"
        )
    first = parts[0].shape
    for part in parts:
        if part.shape != first:
            raise ShapeError(
                f"{what}: iterations produced shapes {list(first)} and {list(part.shape)}; they must agree"
            )
    return np.stack(parts, axis=axis)


class _ControlFlow(Operator):
    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        raise NotOnDevice(
            f"{self.op_type}: {self.why_whole}; it runs whole on the CPU (its subgraph node by node in numpy)"
        )

    #: Why the planner could not expand the node into plain nodes (see :mod:`ortgpu.loader._expand_control_flow`).
    why_whole = "control flow"


@register
class If(_ControlFlow):
    """``If``: runs ``then_branch`` or ``else_branch`` by the single-element condition; their outputs are its."""

    op_type = "If"
    since_version = 1
    why_whole = "its condition is computed on the device from data, not known when planning"

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        then_branch = _subgraph(attrs, "then_branch", "If")
        else_branch = _subgraph(attrs, "else_branch", "If")
        declared, outer = _split(inputs, 1, then_branch, "If")
        cond = declared[0]
        if cond is None:
            raise ModelError("If: its condition input is missing")
        branch = then_branch if bool(_scalar(cond, "If's condition")) else else_branch
        results = branch.run([], outer)
        if len(results) < len(outputs):
            raise ModelError(f"If: the {branch.what} has {len(results)} outputs; the node has {len(outputs)}")
        return results[: len(outputs)]


@register
class Loop(_ControlFlow):
    """``Loop``: ``for (i = 0; i < M && cond; ++i)`` over the body; loop-carried values and stacked scan outputs.

    An absent trip count ``M`` means no bound, an absent ``cond`` means true at the start.  The body's condition
    output ends the loop when false even without a ``cond`` input: the spec's pseudo-code calls it ignored then,
    but onnxruntime (and onnx's reference evaluator) stop on it, and ortgpu follows onnxruntime.  Neither ``M``
    nor ``cond``: the loop could only end by its body's condition; it runs as well.
    """

    op_type = "Loop"
    since_version = 1
    why_whole = (
        "its iterations are not known when planning (a trip count or condition computed from data, a body whose "
        "condition depends on data), or unrolling it would exceed ortgpu.loader._expand_control_flow.MAX_EXPANDED_NODES "
        "nodes, or it runs zero times with scan outputs"
    )

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        body = _subgraph(attrs, "body", "Loop")
        carried_count = len(body.graph.input) - 2
        scan_count = len(body.graph.output) - 1 - carried_count
        if carried_count < 0 or scan_count < 0:
            raise ModelError(
                f"Loop: the {body.what} has {len(body.graph.input)} inputs and {len(body.graph.output)} outputs; "
                "it needs (iteration, condition, carried...) and (condition, carried..., scan outputs...)"
            )
        declared, outer = _split(inputs, 2 + carried_count, body, "Loop")
        trip_input, cond_input = declared[0], declared[1]
        carried: list[np.ndarray] = []
        for index, value in enumerate(declared[2:]):
            if value is None:
                raise UnsupportedOpError(
                    f"Loop: loop-carried input {index} is absent; an absent loop-carried value is not supported (pass "
                    "an empty optional value instead)"
                )
            carried.append(value)
        trip = None if trip_input is None else int(_scalar(trip_input, "Loop's trip count M"))
        keep = True if cond_input is None else bool(_scalar(cond_input, "Loop's condition"))
        scans: list[list[np.ndarray]] = [[] for _ in range(scan_count)]
        iteration = 0
        scanned_bytes = 0
        while keep and (trip is None or iteration < trip):
            if iteration >= MAX_LOOP_ITERATIONS:
                raise ModelError(
                    f"Loop: more than {MAX_LOOP_ITERATIONS} iterations (trip count {trip}); ortgpu's CPU interpreter "
                    "stops there (a hostile or runaway loop would run for hours; it may also run while the model "
                    "loads, to fold constants)"
                )
            results = body.run([np.array(iteration, dtype=np.int64), np.array(keep, dtype=np.bool_), *carried], outer)
            keep = bool(_scalar(results[0], "the Loop body's condition output"))
            carried = results[1 : 1 + carried_count]
            for index, value in enumerate(results[1 + carried_count :]):
                scans[index].append(value)
                scanned_bytes += value.nbytes
            if scanned_bytes > MAX_SCAN_OUTPUT_BYTES:
                raise ModelError(
                    f"Loop: its scan outputs grew past {MAX_SCAN_OUTPUT_BYTES} bytes after {iteration + 1} "
                    "iterations; ortgpu refuses rather than exhaust memory"
                )
            iteration += 1
        stacked = [
            _stack(
                parts,
                0,
                outputs[carried_count + index] if carried_count + index < len(outputs) else None,
                f"Loop scan output {index}",
                _declared(body, 1 + carried_count + index),
            )
            for index, parts in enumerate(scans)
        ]
        return (carried + stacked)[: len(outputs)]


def _axis(axis: int, rank: int, what: str) -> int:
    if not -rank <= axis < rank:
        raise ShapeError(f"{what} {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _flags(attrs: Mapping[str, Any], name: str, count: int, what: str) -> list[int]:
    values = [int(v) for v in attrs.get(name, [0] * count)]
    if len(values) != count:
        raise ShapeError(f"Scan: {name} has {len(values)} entries; {what} needs {count}")
    return values


@register
class Scan8(_ControlFlow):
    """``Scan`` at opset 8: batch axis 0, sequence axis 1, optional ``sequence_lens``, input ``directions``.

    Scan outputs keep the iteration order and are padded with zeros past each batch entry's length.
    """

    op_type = "Scan"
    since_version = 8
    why_whole = "Scan-8 (batch axis and sequence_lens) is not expanded into plain nodes"

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        body = _subgraph(attrs, "body", "Scan")
        scan_inputs = int(attrs.get("num_scan_inputs", 0))
        state_count = len(body.graph.input) - scan_inputs
        output_count = len(body.graph.output) - state_count
        if scan_inputs < 1 or state_count < 0 or output_count < 0:
            raise ModelError(f"Scan: num_scan_inputs {scan_inputs} does not fit the {body.what}")
        declared, outer = _split(inputs, 1 + state_count + scan_inputs, body, "Scan")
        lens_input = declared[0]
        values = declared[1:]
        if any(v is None for v in values):
            raise ModelError("Scan: a state or scan input is absent")
        states = [v for v in values[:state_count] if v is not None]
        sequences = [v for v in values[state_count:] if v is not None]
        directions = _flags(attrs, "directions", scan_inputs, "each scan input")
        for sequence in sequences:
            if sequence.ndim < 2 or sequence.shape[:2] != sequences[0].shape[:2]:
                raise ShapeError("Scan: every scan input needs the same (batch, sequence) leading dims")
        for state in states:
            if state.ndim < 1 or state.shape[0] != sequences[0].shape[0]:
                raise ShapeError("Scan: every initial state needs the batch size as its first dim")
        batch, length = sequences[0].shape[:2]
        lens = np.full(batch, length, dtype=np.int64) if lens_input is None else lens_input.astype(np.int64)
        if lens.shape != (batch,) or np.any(lens < 0) or np.any(lens > length):
            raise ShapeError(f"Scan: sequence_lens must be {batch} values in [0, {length}]; got {lens.tolist()}")
        finals: list[list[np.ndarray]] = [[] for _ in range(state_count)]
        scanned: list[list[np.ndarray]] = [[] for _ in range(output_count)]
        for item in range(batch):
            current = [state[item] for state in states]
            count = int(lens[item])
            parts: list[list[np.ndarray]] = [[] for _ in range(output_count)]
            for step in range(count):
                elements = [
                    sequence[item, count - 1 - step if direction else step]
                    for sequence, direction in zip(sequences, directions)
                ]
                results = body.run([*current, *elements], outer)
                current = results[:state_count]
                for index, value in enumerate(results[state_count:]):
                    parts[index].append(value)
            for index, value in enumerate(current):
                finals[index].append(value)
            for index, collected in enumerate(parts):
                info = outputs[state_count + index] if state_count + index < len(outputs) else None
                element_info = TensorInfo((0, *info.shape[2:]), info.dtype) if info is not None else None
                column = _stack(
                    collected, 0, element_info, f"Scan output {index}", _declared(body, state_count + index)
                )
                if count < length:  # shorter sequences are padded with zeros
                    pad = np.zeros((length - count, *column.shape[1:]), dtype=column.dtype)
                    column = np.concatenate([column, pad])
                scanned[index].append(column)
        results_out = [
            _stack(parts, 0, outputs[index] if index < len(outputs) else None, f"Scan final state {index}")
            for index, parts in enumerate(finals)
        ]
        results_out += [
            _stack(
                parts,
                0,
                outputs[state_count + index] if state_count + index < len(outputs) else None,
                f"Scan output {index}",
            )
            for index, parts in enumerate(scanned)
        ]
        return results_out[: len(outputs)]


@register
class Scan9(_ControlFlow):
    """``Scan`` from opset 9: no batch axis; ``scan_input_axes``/``scan_input_directions`` pick and order the
    elements, ``scan_output_axes``/``scan_output_directions`` where and in which order outputs are stacked
    (negative axes from opset 11)."""

    op_type = "Scan"
    since_version = 9
    why_whole = (
        "its length is zero, or unrolling it would exceed ortgpu.loader._expand_control_flow.MAX_EXPANDED_NODES nodes"
    )

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        body = _subgraph(attrs, "body", "Scan")
        scan_inputs = int(attrs.get("num_scan_inputs", 0))
        state_count = len(body.graph.input) - scan_inputs
        output_count = len(body.graph.output) - state_count
        if scan_inputs < 1 or state_count < 0 or output_count < 0:
            raise ModelError(f"Scan: num_scan_inputs {scan_inputs} does not fit the {body.what}")
        declared, outer = _split(inputs, state_count + scan_inputs, body, "Scan")
        if any(v is None for v in declared):
            raise ModelError("Scan: a state or scan input is absent")
        states = [v for v in declared[:state_count] if v is not None]
        sequences = [v for v in declared[state_count:] if v is not None]
        in_axes = _flags(attrs, "scan_input_axes", scan_inputs, "each scan input")
        in_dirs = _flags(attrs, "scan_input_directions", scan_inputs, "each scan input")
        out_axes = _flags(attrs, "scan_output_axes", output_count, "each scan output")
        out_dirs = _flags(attrs, "scan_output_directions", output_count, "each scan output")
        axes = [_axis(axis, seq.ndim, "Scan: scan_input_axes entry") for axis, seq in zip(in_axes, sequences)]
        lengths = {seq.shape[axis] for seq, axis in zip(sequences, axes)}
        if len(lengths) != 1:
            raise ShapeError(f"Scan: the scan inputs have different lengths {sorted(lengths)} along their axes")
        length = lengths.pop()
        current = list(states)
        parts: list[list[np.ndarray]] = [[] for _ in range(output_count)]
        for step in range(length):
            elements = [
                np.take(seq, length - 1 - step if direction else step, axis=axis)
                for seq, axis, direction in zip(sequences, axes, in_dirs)
            ]
            results = body.run([*current, *elements], outer)
            current = results[:state_count]
            for index, value in enumerate(results[state_count:]):
                parts[index].append(value)
        stacked = []
        for index, collected in enumerate(parts):
            info = outputs[state_count + index] if state_count + index < len(outputs) else None
            if out_dirs[index]:
                collected = collected[::-1]
            element = _declared(body, state_count + index)
            if collected:
                rank = collected[0].ndim + 1
            elif element is not None:
                rank = len(element[0]) + 1
            else:
                rank = len(info.shape) if info is not None and info.shape else 1
            axis = _axis(out_axes[index], rank, "Scan: scan_output_axes entry")
            stacked.append(_stack(collected, axis, info, f"Scan output {index}", element))
        return (current + stacked)[: len(outputs)]
