"""Shape propagation and constant folding, shared by the loader (:mod:`ortgpu.loader._model`) and the planner.

Shape inference is onnx's, node by node (``onnx.shape_inference.infer_node_outputs``,
given the constant inputs so shape-carrying tensors propagate; results are cached per
propagation, so repeated layers infer once), plus our own fallback where onnx leaves a
dim unknown although every input shape is concrete: the node's reference runs on zeros
and its result's shape is taken (never for what would be big: :func:`ortgpu.loader._limits.check_shape_probe`).
A node whose inputs are all constants is folded into a constant, within the sizes and the
budget of :mod:`ortgpu.loader._limits`.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ModelError, UnsupportedOpError

from .._host_values import is_sequence_dtype, is_structured_dtype, probe_value
from .._types import TensorInfo
from ..ops import get_operator
from ..ops.ai_onnx.control_flow import declared_output_types
from ._expand_control_flow import EXPANDABLE, Expansion, expand
from ._graph_node import Dim, GraphNode, Shape
from ._limits import FoldBudget, LoadLimits, check_shape_probe, keep_folded, may_fold
from ._node_inference import (
    _apply_operator_shapes,
    _concrete,
    _infer_cached,
    is_concrete,
    public_attrs,
)

__all__ = [
    "Dim",
    "Shape",
    "is_concrete",
    "public_attrs",
    "propagate",
    "SHAPE_INPUT_POSITIONS",
    "value_dependent_inputs",
]


def _constant_node_value(node: GraphNode) -> np.ndarray:
    attrs = node.attrs
    if "value" in attrs:
        return np.asarray(attrs["value"])
    if "sparse_value" in attrs:  # densified when the attribute was read (``_sparse_to_array``)
        return np.asarray(attrs["sparse_value"])
    if "value_float" in attrs:
        return np.array(attrs["value_float"], dtype=np.float32)
    if "value_floats" in attrs:
        return np.array(attrs["value_floats"], dtype=np.float32)
    if "value_int" in attrs:
        return np.array(attrs["value_int"], dtype=np.int64)
    if "value_ints" in attrs:
        return np.array(attrs["value_ints"], dtype=np.int64)
    if "value_string" in attrs:
        return np.array(attrs["value_string"], dtype=object)
    if "value_strings" in attrs:
        return np.array(list(attrs["value_strings"]), dtype=object)
    raise UnsupportedOpError(f"{node.describe()}: this kind of Constant value is not supported (got {sorted(attrs)})")


def _reference(
    node: GraphNode,
    inputs: Sequence[np.ndarray | None],
    output_infos: Sequence[TensorInfo],
) -> list[np.ndarray]:
    operator = get_operator(node.op_type, node.opset, node.domain)
    return operator.reference(inputs, public_attrs(node.attrs), output_infos)


def propagate(
    nodes: Sequence[GraphNode],
    types: dict[str, tuple[Shape, np.dtype[Any]]],
    constants: dict[str, np.ndarray],
    opsets: Mapping[str, int],
    *,
    concrete: bool,
    budget: FoldBudget | None = None,
    expansions: list[Expansion] | None = None,
    _cache: dict[tuple[Any, ...], list[tuple[Shape, np.dtype[Any]] | None]] | None = None,
) -> tuple[list[GraphNode], list[str]]:
    """Infer every tensor's type and fold what is computable; updates ``types`` and ``constants``.

    Returns the nodes that remain (in order) and the names of the folded ones.
    With ``concrete`` every graph input shape is known: a dim onnx cannot infer
    is found by running the node's reference on zeros, and an unresolvable one
    is an error.  Folding creates at most ``budget``'s bytes of constants (default:
    :data:`ortgpu.loader._limits.DEFAULT_MAX_FOLD_BYTES`); nodes it cannot afford stay.

    With ``expansions`` (a list to fill), control flow whose decisions are constants by now is replaced by the
    nodes it runs (:mod:`ortgpu.loader._expand_control_flow`); each replacement is recorded there.
    """
    if budget is None:
        budget = FoldBudget(LoadLimits().max_fold_bytes)
    remaining: list[GraphNode] = []
    folded: list[str] = []
    inference_cache: dict[tuple[Any, ...], list[tuple[Shape, np.dtype[Any]] | None]] = {} if _cache is None else _cache
    found = expansions

    def run(inner: list[GraphNode]) -> tuple[list[GraphNode], list[str]]:
        return propagate(
            inner, types, constants, opsets, concrete=concrete, budget=budget, expansions=found, _cache=inference_cache
        )

    for node in nodes:
        if expansions is not None and node.op_type in EXPANDABLE and node.domain in ("", "ai.onnx"):
            mark = len(expansions)
            expansion = expand(node, types, constants, run)
            if expansion is None:
                del expansions[mark:]  # nested expansions of an attempt that was given up
            else:
                expansions.append(expansion)
                remaining.extend(expansion.nodes)
                folded.extend(expansion.folded)
                continue
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            value = _constant_node_value(node)
            constants[node.outputs[0]] = value
            types[node.outputs[0]] = (tuple(value.shape), value.dtype)
            folded.append(node.name)
            continue
        inferred = _infer_cached(node, types, constants, opsets, inference_cache)
        for name in node.outputs:
            if name and name in inferred:
                types[name] = inferred[name]
        _apply_operator_shapes(node, types)
        present_inputs = [name for name in node.inputs if name]
        if (
            node.op_type == "Shape"
            and node.domain in ("", "ai.onnx")
            and node.inputs[0] in types
            and is_concrete(types[node.inputs[0]][0])
        ):
            full = np.array(_concrete(types[node.inputs[0]][0]), dtype=np.int64)
            rank = len(full)
            start = int(node.attrs.get("start", 0))
            end = node.attrs.get("end")
            start = min(max(start + rank if start < 0 else start, 0), rank)
            stop = rank if end is None else min(max(int(end) + rank if int(end) < 0 else int(end), 0), rank)
            value = full[start:stop].copy()
            constants[node.outputs[0]] = value
            types[node.outputs[0]] = (tuple(value.shape), value.dtype)
            folded.append(node.name)
            continue
        if (
            node.op_type == "Size"
            and node.domain in ("", "ai.onnx")
            and node.inputs[0] in types
            and is_concrete(types[node.inputs[0]][0])
        ):
            # Like Shape: the element count is known without the data, so its consumers fold too.
            value = np.array(math.prod(_concrete(types[node.inputs[0]][0])), dtype=np.int64)
            constants[node.outputs[0]] = value
            types[node.outputs[0]] = ((), value.dtype)
            folded.append(node.name)
            continue
        if present_inputs and all(name in constants for name in present_inputs):
            values = _fold(node, types, constants) if may_fold(node, types, constants, budget) else None
            if values is not None and keep_folded(node, values, budget):
                for name, value in zip(node.outputs, values):
                    if name:
                        constants[name] = value
                        types[name] = (tuple(value.shape), value.dtype)
                folded.append(node.name)
                continue
        if concrete:
            _resolve_unknown_dims(node, types, constants, budget)
        remaining.append(node)
    return remaining, folded


def _output_infos_guess(node: GraphNode, types: Mapping[str, tuple[Shape, np.dtype[Any]]]) -> list[TensorInfo]:
    infos = []
    first_dtype = np.dtype(np.float32)
    for name in node.inputs:
        if name and name in types:
            first_dtype = types[name][1]
            break
    for name in node.outputs:
        if name in types:
            shape, dtype = types[name]
            infos.append(TensorInfo(tuple(d if isinstance(d, int) else 0 for d in shape), dtype))
        else:
            infos.append(TensorInfo((), first_dtype))
    return infos


def _fold(
    node: GraphNode,
    types: Mapping[str, tuple[Shape, np.dtype[Any]]],
    constants: Mapping[str, np.ndarray],
) -> list[np.ndarray] | None:
    inputs = [constants[name] if name else None for name in node.inputs]
    try:
        results = _reference(node, inputs, _output_infos_guess(node, types))
    except ModelError:
        raise
    except Exception:  # noqa: BLE001 - leave the node to run normally, where errors are reported
        return None
    out = []
    for name, value in zip(node.outputs, results):
        array = np.asarray(value)
        if is_structured_dtype(array.dtype):  # a sequence or optional (a box): kept as it is, its dtype says its shapes
            out.append(array)
            continue
        if name in types and types[name][1] != array.dtype:
            array = array.astype(types[name][1])
        out.append(np.asarray(array, order="C"))
    return out


def _resolve_unknown_dims(
    node: GraphNode,
    types: dict[str, tuple[Shape, np.dtype[Any]]],
    constants: Mapping[str, np.ndarray],
    budget: FoldBudget,
) -> None:
    """Find the output shapes onnx left unknown by running the node's reference on its constants and zeros
    (when :func:`ortgpu.loader._limits.check_shape_probe` allows it)."""
    if all(name in types and is_concrete(types[name][0]) for name in node.outputs if name):
        return
    if not all(name in types and is_concrete(types[name][0]) for name in node.inputs if name):
        raise ModelError(
            f"cannot infer the shapes of {node.describe()}: the shapes of its inputs are unknown{budget.note()}"
        )
    if node.domain in ("", "ai.onnx") and node.op_type in ("If", "Loop"):
        declared = declared_output_types(node.op_type, node.attrs)
        if declared is not None and len(declared) >= len(node.outputs):
            for name, found in zip(node.outputs, declared):
                if name:
                    types[name] = found
            return  # what the subgraphs declare: no run on zeros (the executor checks every run's shapes)
    positions = SHAPE_INPUT_POSITIONS.get(node.op_type, ()) if node.domain == "" else ()
    computed = check_shape_probe(node, types, constants, budget, positions)
    if computed is not None:  # a growing op (Range, Tile...): its shape without computing it
        types[node.outputs[0]] = computed
        return
    if _apply_value_shapes(node, types, constants):
        return
    inputs: list[np.ndarray | None] = []
    for name in node.inputs:
        if not name:
            inputs.append(None)
        elif name in constants:
            inputs.append(constants[name])
        elif is_structured_dtype(types[name][1]):
            inputs.append(_zeros_structured(node, name, types[name][1]))
        else:
            shape, dtype = types[name]
            inputs.append(np.zeros(_concrete(shape), dtype=dtype))
    probe = "while learning its output shapes by running it on zeros (onnx's shape inference could not give them)"
    try:
        results = _reference(node, inputs, _output_infos_guess(node, types))
    except ModelError as error:
        raise type(error)(f"{node.describe()}, {probe}: {error}") from error
    except Exception as error:
        raise ModelError(f"cannot infer the output shapes of {node.describe()} ({probe}): {error}") from error
    for name, value in zip(node.outputs, results):
        if name:
            array = np.asarray(value)
            # A sequence output keeps the element shapes the run gave in its dtype; the executor checks every
            # run's element shapes against them (a shape that depends on values is an error, never a guess).
            structured = is_structured_dtype(array.dtype)
            dtype = array.dtype if structured else types[name][1] if name in types else array.dtype
            types[name] = (tuple(array.shape), dtype)


def _apply_value_shapes(
    node: GraphNode, types: dict[str, tuple[Shape, np.dtype[Any]]], constants: Mapping[str, np.ndarray]
) -> bool:
    """Set the outputs' types from the operator's own rule over shapes and known values
    (:meth:`~ortgpu.ops.Operator.output_infos_from_values`), where it has one; whether it did."""
    if any(name and is_structured_dtype(types[name][1]) for name in node.inputs):
        return False
    try:
        operator = get_operator(node.op_type, node.opset, node.domain)
    except UnsupportedOpError:
        return False
    infos = [TensorInfo(_concrete(types[name][0]), types[name][1]) if name else None for name in node.inputs]
    known = {position: constants[name] for position, name in enumerate(node.inputs) if name and name in constants}
    found = operator.output_infos_from_values(infos, public_attrs(node.attrs), known)
    if found is None:
        return False
    for name, info in zip(node.outputs, found):
        if name:
            types[name] = (tuple(int(d) for d in info.shape), np.dtype(info.dtype))
    return True


def _zeros_structured(node: GraphNode, name: str, dtype: np.dtype[Any]) -> np.ndarray:
    """A sequence of zero tensors with the element shapes ``dtype`` records, or an optional in the state it records
    holding zeros (what a probe runs on)."""
    value = probe_value(dtype)
    if value is None:
        what = "sequence" if is_sequence_dtype(dtype) else "optional"
        raise ModelError(
            f"cannot infer the output shapes of {node.describe()}: the element shapes of {what} {name!r} are unknown"
        )
    return value


#: Input positions whose values (not just shapes) decide an operator's output shape.
SHAPE_INPUT_POSITIONS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,),
    "Unsqueeze": (1,),
    "Squeeze": (1,),
    "Slice": (1, 2, 3, 4),
    "Expand": (1,),
    "Tile": (1,),
    "ConstantOfShape": (0,),
    "Range": (0, 1, 2),
    "Split": (1,),
    "Pad": (1, 3),
    "ReduceSum": (1,),
    "ReduceMean": (1,),
    "ReduceMax": (1,),
    "ReduceMin": (1,),
    "ReduceProd": (1,),
    "ReduceL1": (1,),
    "ReduceL2": (1,),
    "ReduceLogSum": (1,),
    "ReduceLogSumExp": (1,),
    "ReduceSumSquare": (1,),
    "Resize": (1, 2, 3),
    "Upsample": (1,),
    "TopK": (1,),
    "OneHot": (1,),
    "CenterCropPad": (1,),
    "Col2Im": (1, 2),
    "MaxUnpool": (2,),
    # Output sizes that depend on the data itself: planned only where those inputs are known (constants, or
    # graph inputs whose values the plan is made for); a value computed on the device is refused, never guessed.
    "NonZero": (0,),
    "Unique": (0,),
    "Compress": (1,),
    "NonMaxSuppression": (0, 1, 2, 3, 4),
    "DFT": (1, 2),  # dft_length, and from opset 20 the axis
    "STFT": (1, 3),
    "BlackmanWindow": (0,),
    "HannWindow": (0,),
    "HammingWindow": (0,),
    "MelWeightMatrix": (0, 1),
    "StringSplit": (0,),  # the number of pieces depends on the text
    "StringNormalizer": (0,),  # stopwords removed from a 1-D input shorten it
    "CumSum": (1,),  # the axis: a kernel per axis, planned for its value
    "CumProd": (1,),
    "AffineGrid": (1,),  # the output size
    # Control flow (ortgpu.ops.ai_onnx.control_flow): the trip count and condition decide a Loop's scan-output length,
    # the condition which branch (and so which shapes) an If gives.
    "Loop": (0, 1),
    "If": (0,),
    # Sequences (ortgpu.ops.ai_onnx.sequences): positions pick which element (and so which shape) a node gives.
    "SequenceAt": (1,),
    "SequenceInsert": (2,),
    "SequenceErase": (1,),
    "SplitToSequence": (1,),
}


#: The same for operators of other domains, by (domain, op type).
DOMAIN_SHAPE_INPUT_POSITIONS: dict[tuple[str, str], tuple[int, ...]] = {
    # present_key/present_value hold max(total_sequence_length, past length) positions
    ("com.microsoft", "GroupQueryAttention"): (6,),
}


def _shape_positions(node: GraphNode) -> tuple[int, ...]:
    if node.domain == "":
        return SHAPE_INPUT_POSITIONS.get(node.op_type, ())
    return DOMAIN_SHAPE_INPUT_POSITIONS.get((node.domain, node.op_type), ())


def value_dependent_inputs(nodes: Sequence[GraphNode], graph_inputs: Sequence[str]) -> frozenset[str]:
    """Graph inputs that flow (through anything but ``Shape``) into a shape-deciding input position."""
    producer = {name: node for node in nodes for name in node.outputs if name}
    pending = [
        node.inputs[position]
        for node in nodes
        for position in _shape_positions(node)
        if position < len(node.inputs) and node.inputs[position]
    ]
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        node = producer.get(name)
        if node is not None and node.op_type not in ("Shape", "Size"):
            pending.extend(n for n in node.inputs if n)
    return frozenset(seen.intersection(graph_inputs))
