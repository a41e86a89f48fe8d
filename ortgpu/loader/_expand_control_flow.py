"""Control flow whose decisions a plan knows, expanded into plain nodes: it then runs on the device and captures.

A plan is made for concrete input shapes, and for the values of the inputs that decide shapes or branches
(``LoadedModel.value_dependent_inputs``: an ``If`` condition or a ``Loop`` trip count fed by a graph input makes
that input one).  Where, at that point, a control-flow node's decisions are constants, the planner replaces the
node by the nodes it would run (:func:`expand`); they are planned like any other node (WGSL kernels, fusion,
capture).  Otherwise the node stays whole and runs in the CPU interpreter of :mod:`ortgpu.loader._subgraph`.

* ``If`` whose condition is a constant (an initializer, a folded shape function, a value-deciding input):
  the chosen branch, inlined.
* ``Loop`` whose trip count and condition are constants and whose body's condition output folds to a constant
  in every iteration (``cond_out = cond_in``, a constant, or a function of the iteration number): unrolled,
  one iteration after the other (each iteration is propagated before the next, so its condition is known).
  A body whose condition is computed from data (stop at an end-of-sequence token) is not expanded.
* ``Scan`` (opset 9 and later): its length comes from shapes; unrolled, with a ``Gather`` per scan input and
  iteration and the scan outputs stacked by ``Reshape`` + ``Concat``.

Expansion is bounded by :data:`MAX_EXPANDED_NODES` nodes per outermost control-flow node (the nodes of nested
expansions, and of attempts given up, count within it); past that the node stays whole, on the CPU.

Names: the nodes and tensors of an expansion are prefixed with the control-flow node's name and the part they
come from: ``choose/then/``, ``decode/iter3/``; ``get_node_placement`` reports them under those names.
"""

from __future__ import annotations

import contextvars
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import OrtGpuError

from ._graph_node import GraphNode, Shape
from ._subgraph import Subgraph

__all__ = ["EXPANDABLE", "MAX_EXPANDED_NODES", "Expansion", "expand"]

#: Default-domain operators :func:`expand` may replace.
EXPANDABLE = frozenset({"If", "Loop", "Scan"})
#: The most nodes one control-flow node expands into (an unrolled Loop or Scan: iterations x body nodes).
MAX_EXPANDED_NODES = 4096

Types = dict[str, tuple[Shape, np.dtype[Any]]]
#: Propagates nodes with the planner's state (types, constants, budget): returns the remaining and folded nodes.
Propagator = Callable[[list[GraphNode]], tuple[list[GraphNode], list[str]]]


@dataclass(frozen=True)
class Expansion:
    """What a control-flow node became: ``how`` says it (``then branch``, ``3 iterations``), ``prefix`` starts the
    names of its nodes and tensors, ``nodes`` are those left after folding, ``folded`` the ones folded."""

    owner: GraphNode
    how: str
    prefix: str
    nodes: list[GraphNode]
    folded: list[str]


def expand(node: GraphNode, types: Types, constants: dict[str, np.ndarray], run: Propagator) -> Expansion | None:
    """``node`` expanded (its nodes already propagated by ``run``), or None where its decisions are not constants
    here (or the expansion would be too large, or it cannot be written with plain nodes): it then runs whole."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in EXPANDABLE:
        return None
    budget = _BUDGET.get()
    outermost = budget is None
    if budget is None:
        budget = [MAX_EXPANDED_NODES]
    elif budget[0] <= 0:
        return None  # the outermost expansion's budget is spent (nested attempts, given up or not, count)
    token = _BUDGET.set(budget) if outermost else None
    try:
        if node.op_type == "If":
            return _expand_if(node, types, constants, run)
        if node.op_type == "Loop":
            return _expand_loop(node, types, constants, run)
        if node.opset >= 9:
            return _expand_scan(node, types, constants, run)
    except _NotExpanded:
        return None
    except OrtGpuError:
        return None  # what the expansion met (a shape, a fold) is the interpreter's to report when the node runs
    finally:
        if token is not None:
            _BUDGET.reset(token)
    return None


#: The nodes the outermost expansion in progress may still make, over all the expansions nested in it (a nested
#: expansion that is given up has spent its share: a Loop of 1000 iterations around another stops early).
_BUDGET: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("expansion_budget", default=None)


class _NotExpanded(Exception):
    """This node cannot be expanded here: it runs whole."""


def _subgraph(node: GraphNode, name: str) -> Subgraph:
    value = node.attrs.get(name)
    if not isinstance(value, Subgraph):
        raise _NotExpanded
    return value


def _constant_scalar(constants: Mapping[str, np.ndarray], name: str) -> Any:
    value = constants.get(name)
    if value is None or value.dtype == object or value.size != 1:
        raise _NotExpanded
    return value.reshape(-1)[0]


class _Builder:
    """Collects the nodes of one expansion and propagates them as they are made."""

    def __init__(self, owner: GraphNode, types: Types, constants: dict[str, np.ndarray], run: Propagator) -> None:
        self.owner = owner
        self.types = types
        self.constants = constants
        self.run = run
        self.nodes: list[GraphNode] = []
        self.folded: list[str] = []
        self.made = 0

    def fresh(self, name: str) -> str:
        """``name``, checked to be new in this graph (an expansion never overwrites a tensor)."""
        if name in self.types or name in self.constants:
            raise _NotExpanded
        return name

    def constant(self, name: str, value: np.ndarray) -> str:
        name = self.fresh(name)
        self.constants[name] = value
        self.types[name] = (tuple(value.shape), value.dtype)
        return name

    def add(self, nodes: list[GraphNode]) -> None:
        self.made += len(nodes)
        budget = _BUDGET.get()
        if budget is not None:
            budget[0] -= len(nodes)
        if self.made > MAX_EXPANDED_NODES or (budget is not None and budget[0] < 0):
            raise _NotExpanded
        remaining, folded = self.run(nodes)
        self.nodes.extend(remaining)
        self.folded.extend(folded)
        self.made += max(0, len(remaining) - len(nodes))  # what nested expansions added counts too
        if self.made > MAX_EXPANDED_NODES:
            raise _NotExpanded

    def node(self, name: str, op_type: str, inputs: Sequence[str], outputs: Sequence[str], **attrs: Any) -> GraphNode:
        return GraphNode(name, op_type, "", tuple(inputs), tuple(outputs), attrs, self.owner.opset)

    def instantiate(self, graph: Subgraph, prefix: str, bound: Mapping[str, str]) -> list[str]:
        """Add ``graph``'s nodes with its inputs and outer-scope names read from ``bound`` and every name it defines
        under ``prefix``; returns the names holding its outputs."""
        rename = dict(bound)
        for name, value in graph.initializers.items():
            rename[name] = self.constant(prefix + name, value)
        nodes = graph.nodes()
        for inner in nodes:
            for name in inner.outputs:
                if name:
                    rename[name] = self.fresh(prefix + name)
        made = [
            dataclasses.replace(
                inner,
                name=prefix + inner.name,
                inputs=tuple(rename.get(name, name) if name else "" for name in inner.inputs),
                outputs=tuple(rename[name] if name else "" for name in inner.outputs),
            )
            for inner in nodes
        ]
        self.add(made)
        return [rename.get(value.name, value.name) for value in graph.graph.output]

    def identity(self, source: str, target: str, name: str) -> None:
        if target:
            self.add([self.node(name, "Identity", [source], [target])])

    def stack(self, parts: list[str], axis: int, target: str, prefix: str) -> None:
        """``target`` = ``parts`` stacked along a new ``axis`` (each reshaped with a 1 there, then concatenated)."""
        if not target:
            return
        shapes = {self.types[p][0] if p in self.types else None for p in parts}
        if not parts or len(shapes) != 1:
            raise _NotExpanded  # no iteration, or parts that disagree: the interpreter decides (or raises)
        shape = shapes.pop()
        if shape is None or not all(isinstance(d, int) for d in shape) or not 0 <= axis <= len(shape):
            raise _NotExpanded
        dims = [int(d) for d in shape if isinstance(d, int)]
        new_shape = self.constant(f"{prefix}stack_shape", np.array([*dims[:axis], 1, *dims[axis:]], dtype=np.int64))
        reshaped = []
        for index, part in enumerate(parts):
            out = self.fresh(f"{prefix}stack{index}")
            self.add([self.node(f"{prefix}stack{index}", "Reshape", [part, new_shape], [out])])
            reshaped.append(out)
        self.add([self.node(f"{prefix}concat", "Concat", reshaped, [target], axis=axis)])

    def result(self, how: str) -> Expansion:
        return Expansion(self.owner, how, self.owner.name + "/", self.nodes, self.folded)


def _outer(node: GraphNode, graph: Subgraph, declared: int) -> dict[str, str]:
    """The outer-scope names ``graph`` reads, mapped to the node's trailing inputs that carry them."""
    extras = node.inputs[declared:]
    if len(extras) != len(graph.outer_names):
        raise _NotExpanded
    return dict(zip(graph.outer_names, extras))


def _expand_if(node: GraphNode, types: Types, constants: dict[str, np.ndarray], run: Propagator) -> Expansion:
    if not node.inputs or not node.inputs[0]:
        raise _NotExpanded
    chosen = "then" if bool(_constant_scalar(constants, node.inputs[0])) else "else"
    branch = _subgraph(node, f"{chosen}_branch")
    if branch.graph.input:
        raise _NotExpanded
    builder = _Builder(node, types, constants, run)
    outputs = builder.instantiate(branch, f"{node.name}/{chosen}/", _outer(node, branch, 1))
    if len(outputs) < len(node.outputs):
        raise _NotExpanded
    for index, (source, target) in enumerate(zip(outputs, node.outputs)):
        builder.identity(source, target, f"{node.name}/{chosen}/output{index}")
    return builder.result(f"{chosen} branch inlined (its condition is known when planning)")


def _expand_loop(node: GraphNode, types: Types, constants: dict[str, np.ndarray], run: Propagator) -> Expansion:
    body = _subgraph(node, "body")
    if node.opset < 11:
        raise _NotExpanded  # Reshape-based stacking and scan-output rules of current opsets only
    carried_count = len(body.graph.input) - 2
    scan_count = len(body.graph.output) - 1 - carried_count
    if carried_count < 0 or scan_count < 0 or len(node.inputs) < 2 + carried_count:
        raise _NotExpanded
    trip_name, cond_name = node.inputs[0], node.inputs[1]
    trip = int(_constant_scalar(constants, trip_name)) if trip_name else None
    keep = bool(_constant_scalar(constants, cond_name)) if cond_name else True
    carried = list(node.inputs[2 : 2 + carried_count])
    if not all(carried) or any(types.get(name, ((),))[0] is None for name in carried):
        raise _NotExpanded
    outer = _outer(node, body, 2 + carried_count)
    builder = _Builder(node, types, constants, run)
    scans: list[list[str]] = [[] for _ in range(scan_count)]
    iteration = 0
    while keep and (trip is None or iteration < trip):
        prefix = f"{node.name}/iter{iteration}/"
        bound = dict(outer)
        bound[body.graph.input[0].name] = builder.constant(f"{prefix}iteration", np.array(iteration, dtype=np.int64))
        bound[body.graph.input[1].name] = builder.constant(f"{prefix}condition", np.array(keep, dtype=np.bool_))
        for value, name in zip(body.graph.input[2:], carried):
            bound[value.name] = name
        outputs = builder.instantiate(body, prefix, bound)
        keep = bool(_constant_scalar(constants, outputs[0]))  # computed from data: not expandable
        carried = outputs[1 : 1 + carried_count]
        for parts, name in zip(scans, outputs[1 + carried_count :]):
            parts.append(name)
        iteration += 1
    for index, (source, target) in enumerate(zip(carried, node.outputs)):
        builder.identity(source, target, f"{node.name}/output{index}")
    for index, parts in enumerate(scans):
        position = carried_count + index
        if position < len(node.outputs):
            builder.stack(parts, 0, node.outputs[position], f"{node.name}/scan{index}/")
    return builder.result(f"unrolled: {iteration} iterations (its trip count and condition are known when planning)")


def _flags(attrs: Mapping[str, Any], name: str, count: int) -> list[int]:
    values = [int(v) for v in attrs.get(name, [0] * count)]
    if len(values) != count:
        raise _NotExpanded
    return values


def _expand_scan(node: GraphNode, types: Types, constants: dict[str, np.ndarray], run: Propagator) -> Expansion:
    body = _subgraph(node, "body")
    if node.opset < 11:
        raise _NotExpanded
    scan_inputs = int(node.attrs.get("num_scan_inputs", 0))
    state_count = len(body.graph.input) - scan_inputs
    output_count = len(body.graph.output) - state_count
    if scan_inputs < 1 or state_count < 0 or output_count < 0 or len(node.inputs) < state_count + scan_inputs:
        raise _NotExpanded
    states = list(node.inputs[:state_count])
    sequences = list(node.inputs[state_count : state_count + scan_inputs])
    if not all(states) or not all(sequences):
        raise _NotExpanded
    in_axes = _flags(node.attrs, "scan_input_axes", scan_inputs)
    in_dirs = _flags(node.attrs, "scan_input_directions", scan_inputs)
    out_axes = _flags(node.attrs, "scan_output_axes", output_count)
    out_dirs = _flags(node.attrs, "scan_output_directions", output_count)
    axes, lengths = [], set()
    for name, axis in zip(sequences, in_axes):
        shape = types.get(name, (None, None))[0]
        if shape is None or not all(isinstance(d, int) for d in shape) or not -len(shape) <= axis < len(shape):
            raise _NotExpanded
        axis = axis + len(shape) if axis < 0 else axis
        axes.append(axis)
        lengths.add(int(shape[axis]))  # type: ignore[arg-type]
    if len(lengths) != 1:
        raise _NotExpanded
    length = lengths.pop()
    if length == 0:
        raise _NotExpanded  # empty scan outputs: their shapes come from the interpreter's rules
    outer = _outer(node, body, state_count + scan_inputs)
    builder = _Builder(node, types, constants, run)
    parts: list[list[str]] = [[] for _ in range(output_count)]
    for step in range(length):
        prefix = f"{node.name}/iter{step}/"
        bound = dict(outer)
        for value, name in zip(body.graph.input[:state_count], states):
            bound[value.name] = name
        for index, (value, name, axis, reverse) in enumerate(
            zip(body.graph.input[state_count:], sequences, axes, in_dirs)
        ):
            position = length - 1 - step if reverse else step
            where = builder.constant(f"{prefix}index{index}", np.array(position, dtype=np.int64))
            element = builder.fresh(f"{prefix}element{index}")
            builder.add([builder.node(f"{prefix}element{index}", "Gather", [name, where], [element], axis=axis)])
            bound[value.name] = element
        outputs = builder.instantiate(body, prefix, bound)
        states = outputs[:state_count]
        for collected, name in zip(parts, outputs[state_count:]):
            collected.append(name)
    for index, (source, target) in enumerate(zip(states, node.outputs)):
        builder.identity(source, target, f"{node.name}/output{index}")
    for index, collected in enumerate(parts):
        position = state_count + index
        if position >= len(node.outputs) or not node.outputs[position]:
            continue
        if out_dirs[index]:
            collected = collected[::-1]
        element_shape = types.get(collected[0], (None, None))[0]
        if element_shape is None:
            raise _NotExpanded
        rank = len(element_shape) + 1
        axis = out_axes[index]
        if not -rank <= axis < rank:
            raise _NotExpanded
        builder.stack(collected, axis + rank if axis < 0 else axis, node.outputs[position], f"{node.name}/scan{index}/")
    return builder.result(f"unrolled: {length} iterations (its length is known from shapes when planning)")
