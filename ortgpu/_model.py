"""Loading an ONNX model: parse, check, infer shapes, fold constants.

:func:`load_model` turns a file (or bytes) into a :class:`LoadedModel`: the
graph as plain :class:`GraphNode` records in topological order, its inputs and
outputs with (possibly symbolic) shapes, its initializers, and every tensor
computable at load time folded into a constant on the CPU with the operators'
numpy ``reference``.  Planning for concrete input shapes
(:mod:`ortgpu._planner`) runs the same propagation again with the shapes
filled in, so ``Shape -> Gather -> Concat -> Reshape`` chains fold completely.

Shape inference is onnx's, node by node (``onnx.shape_inference.infer_node_outputs``,
given the constant inputs so shape-carrying tensors propagate), plus our own
fallback where onnx leaves a dim unknown although every input shape is
concrete: the node's reference runs on zeros and its result's shape is taken.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence, Union

import numpy as np
import onnx
import onnx.checker
import onnx.defs
import onnx.helper
import onnx.numpy_helper
import onnx.shape_inference
from onnx import external_data_helper

from ortgpu_core._errors import InvalidModelError, ModelError, UnsupportedOpError

from ._limits import (
    FoldBudget,
    LoadLimits,
    check_node_count,
    check_shape_probe,
    keep_folded,
    may_fold,
)
from ._limits import check_external_data as _check_external_data
from .ops import TensorInfo, get_operator

__all__ = [
    "Dim",
    "ValueInfo",
    "GraphNode",
    "LoadedModel",
    "load_model",
    "MAX_IR_VERSION",
    "MIN_OPSET",
    "MAX_OPSET",
    "propagate",
    "onnx_dtype_to_numpy",
]

#: Newest IR version and default-domain opset range ortgpu accepts.
MAX_IR_VERSION = 14
MIN_OPSET = 7
MAX_OPSET = 28

#: A dimension: a concrete size, a symbolic name, or unknown.
Dim = Union[int, str, None]
Shape = tuple[Dim, ...]

#: Constants up to this many elements are passed to onnx's shape inference as data.
_DATA_PROPAGATION_LIMIT = 4096
# How much folding may create (per constant, per model) and the node-count limit: ortgpu._limits.

_NUMPY_DTYPES = frozenset(
    np.dtype(name)
    for name in (
        "float16", "float32", "float64", "int8", "int16", "int32", "int64",
        "uint8", "uint16", "uint32", "uint64", "bool",
    )
)


@dataclass(frozen=True)
class ValueInfo:
    """A graph input or output: name, shape (ints, symbolic names or ``None``) and numpy dtype."""

    name: str
    shape: Shape
    dtype: np.dtype[Any]


@dataclass(frozen=True)
class GraphNode:
    """One node of the graph, with attributes as Python values.

    Missing optional inputs are ``""``.  Attribute values: ints, floats,
    ``str`` (decoded UTF-8), lists of those, numpy arrays for tensors.
    """

    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any]
    opset: int

    def describe(self) -> str:
        """How error messages name the node: ``Conv node 'conv1' (opset 17)``."""
        return f"{self.op_type} node {self.name!r} (opset {self.opset})"


@dataclass
class LoadedModel:
    """A checked model ready for planning.

    ``nodes`` are what remains after load-time folding, in topological order;
    ``constants`` holds the initializers plus every folded tensor (by name);
    ``initializers`` only the model's own initializers.  ``types`` maps each
    known tensor name to its inferred ``(shape, dtype)``.
    """

    inputs: list[ValueInfo]
    outputs: list[ValueInfo]
    opsets: dict[str, int]
    initializers: dict[str, np.ndarray]
    constants: dict[str, np.ndarray]
    nodes: list[GraphNode]
    types: dict[str, tuple[Shape, np.dtype[Any]]]
    ir_version: int
    model_dir: str | None = None
    producer: str = ""
    folded_nodes: list[str] = field(default_factory=list)
    #: The limits it was loaded under, and the bytes of constants folding created at load (counted against
    #: ``limits.max_fold_bytes`` together with what each plan folds).
    limits: LoadLimits = field(default_factory=LoadLimits)
    folded_bytes: int = 0
    #: Graph inputs whose *values* decide tensor shapes (a Reshape's shape, Slice bounds,
    #: reduction axes...): a plan is made for their values, not only their shapes.
    value_dependent_inputs: frozenset[str] = frozenset()

    @property
    def input_names(self) -> list[str]:
        return [value.name for value in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [value.name for value in self.outputs]


# ---------------------------------------------------------------------------
# dtypes and attributes


def onnx_dtype_to_numpy(elem_type: int, what: str) -> np.dtype[Any]:
    """The numpy dtype of an ONNX element type, or ``UnsupportedOpError`` naming ``what``."""
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:  # noqa: BLE001 - unknown enum values, strings
        dtype = None
    if dtype is None or dtype not in _NUMPY_DTYPES:
        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type in onnx.TensorProto.DataType.values() else str(elem_type)
        raise UnsupportedOpError(
            f"{what} has element type {name}, which ortgpu does not support "
            "(supported: float16/32/64, int8..int64, uint8..uint64, bool)"
        )
    return dtype


def _attribute_value(attribute: onnx.AttributeProto, node_text: str) -> Any:
    kind = attribute.type
    if kind in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        raise UnsupportedOpError(f"{node_text} has a subgraph attribute {attribute.name!r}; ortgpu runs no control flow")
    if kind == onnx.AttributeProto.TENSOR:
        return _to_array(attribute.t, f"tensor attribute {attribute.name!r} of {node_text}")
    if kind == onnx.AttributeProto.TENSORS:
        return [_to_array(t, f"tensor attribute {attribute.name!r} of {node_text}") for t in attribute.tensors]
    if kind == onnx.AttributeProto.SPARSE_TENSOR:
        raise UnsupportedOpError(f"{node_text} has a sparse tensor attribute {attribute.name!r}")
    value = onnx.helper.get_attribute_value(attribute)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, list):
        return [v.decode("utf-8") if isinstance(v, bytes) else v for v in value]
    return value


def _to_array(tensor: onnx.TensorProto, what: str) -> np.ndarray:
    """``tensor``'s data as a C-contiguous array; its data disagreeing with its shape is an ``InvalidModelError``."""
    try:
        return np.asarray(onnx.numpy_helper.to_array(tensor), order="C")
    except (ValueError, TypeError, OverflowError, MemoryError) as error:
        raise InvalidModelError(
            f"{what} (shape {list(tensor.dims)}) cannot be read: {str(error)[:200]}; its data does not match its "
            "shape and type, the model is corrupt"
        ) from None


def _constant_node_value(node: GraphNode) -> np.ndarray:
    attrs = node.attrs
    if "value" in attrs:
        return np.asarray(attrs["value"])
    if "value_float" in attrs:
        return np.array(attrs["value_float"], dtype=np.float32)
    if "value_floats" in attrs:
        return np.array(attrs["value_floats"], dtype=np.float32)
    if "value_int" in attrs:
        return np.array(attrs["value_int"], dtype=np.int64)
    if "value_ints" in attrs:
        return np.array(attrs["value_ints"], dtype=np.int64)
    raise UnsupportedOpError(f"{node.describe()}: only numeric Constant values are supported (got {sorted(attrs)})")


# ---------------------------------------------------------------------------
# shape propagation and constant folding (shared with the planner)


def _type_proto(shape: Shape, dtype: np.dtype[Any]) -> onnx.TypeProto:
    elem_type = onnx.helper.np_dtype_to_tensor_dtype(dtype)
    return onnx.helper.make_tensor_type_proto(elem_type, list(shape))


def _from_type_proto(type_proto: onnx.TypeProto) -> tuple[Shape, np.dtype[Any]] | None:
    if not type_proto.HasField("tensor_type"):
        return None
    tensor_type = type_proto.tensor_type
    if tensor_type.elem_type == 0:
        return None
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
    except Exception:  # noqa: BLE001
        return None
    if not tensor_type.HasField("shape"):
        return None
    dims: list[Dim] = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        elif dim.HasField("dim_param"):
            dims.append(dim.dim_param)
        else:
            dims.append(None)
    return tuple(dims), dtype


def is_concrete(shape: Shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def _concrete(shape: Shape) -> tuple[int, ...]:
    return tuple(int(d) for d in shape if isinstance(d, int))


def _inference_key(
    node: GraphNode, types: Mapping[str, tuple[Shape, np.dtype[Any]]], constants: Mapping[str, np.ndarray]
) -> tuple[Any, ...] | None:
    """What onnx's inference of ``node`` depends on (None: not worth caching): repeated layers infer once."""
    key: list[Any] = [node.op_type, node.domain, node.opset, tuple(_attribute_bytes(node))]
    data_bytes = 0
    for name in node.inputs:
        value = constants.get(name) if name else None
        data = None
        if value is not None and value.size <= _DATA_PROPAGATION_LIMIT:
            data = (value.dtype.str, value.shape, value.tobytes())
            data_bytes += value.nbytes
        key.append(None if not name else (types.get(name), data))
    return tuple(key) if data_bytes <= 256 and sum(map(len, key[3])) <= 4096 else None


def _attribute_bytes(node: GraphNode) -> list[bytes]:
    return [attribute.SerializeToString() for attribute in _proto_attributes(node)]


def _infer_cached(
    node: GraphNode,
    types: Mapping[str, tuple[Shape, np.dtype[Any]]],
    constants: Mapping[str, np.ndarray],
    opsets: Mapping[str, int],
    cache: dict[tuple[Any, ...], list[tuple[Shape, np.dtype[Any]] | None]],
) -> dict[str, tuple[Shape, np.dtype[Any]]]:
    """:func:`_infer_with_onnx` through ``cache`` (one per propagation: the opsets are fixed), by output position."""
    key = _inference_key(node, types, constants)
    if key is None:
        return _infer_with_onnx(node, types, constants, opsets)
    if key not in cache:
        inferred = _infer_with_onnx(node, types, constants, opsets)
        cache[key] = [inferred.get(name) if name else None for name in node.outputs]
    return {name: found for name, found in zip(node.outputs, cache[key]) if name and found is not None}


def _infer_with_onnx(
    node: GraphNode,
    types: Mapping[str, tuple[Shape, np.dtype[Any]]],
    constants: Mapping[str, np.ndarray],
    opsets: Mapping[str, int],
) -> dict[str, tuple[Shape, np.dtype[Any]]]:
    try:
        schema = onnx.defs.get_schema(node.op_type, node.opset, node.domain)
    except Exception:  # noqa: BLE001 - unknown op: no inference
        return {}
    input_types: dict[str, onnx.TypeProto] = {}
    input_data: dict[str, onnx.TensorProto] = {}
    for name in node.inputs:
        if not name or name in input_types:
            continue
        if name in types:
            shape, dtype = types[name]
            input_types[name] = _type_proto(shape, dtype)
        value = constants.get(name)
        if value is not None and value.size <= _DATA_PROPAGATION_LIMIT:
            input_data[name] = onnx.numpy_helper.from_array(np.asarray(value, order="C"), name)
    proto = onnx.helper.make_node(node.op_type, list(node.inputs), list(node.outputs), domain=node.domain or None)
    proto.attribute.extend(_proto_attributes(node))
    opset_imports = [onnx.helper.make_opsetid(domain, version) for domain, version in opsets.items()]
    try:
        inferred = onnx.shape_inference.infer_node_outputs(schema, proto, input_types, input_data, None, opset_imports)
    except Exception:  # noqa: BLE001 - onnx raises various errors for partial information
        return {}
    result: dict[str, tuple[Shape, np.dtype[Any]]] = {}
    for name, type_proto in inferred.items():
        converted = _from_type_proto(type_proto)
        if converted is not None:
            result[name] = converted
    return result


def _proto_attributes(node: GraphNode) -> list[onnx.AttributeProto]:
    original = node.attrs.get("__proto_attributes__")
    if isinstance(original, tuple):
        return list(original)
    return []


def _reference(
    node: GraphNode,
    inputs: Sequence[np.ndarray | None],
    output_infos: Sequence[TensorInfo],
) -> list[np.ndarray]:
    operator = get_operator(node.op_type, node.opset, node.domain)
    return operator.reference(inputs, public_attrs(node.attrs), output_infos)


def public_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The attributes an operator sees (without the loader's private entries)."""
    return {k: v for k, v in attrs.items() if not k.startswith("__")}


def propagate(
    nodes: Sequence[GraphNode],
    types: dict[str, tuple[Shape, np.dtype[Any]]],
    constants: dict[str, np.ndarray],
    opsets: Mapping[str, int],
    *,
    concrete: bool,
    budget: FoldBudget | None = None,
) -> tuple[list[GraphNode], list[str]]:
    """Infer every tensor's type and fold what is computable; updates ``types`` and ``constants``.

    Returns the nodes that remain (in order) and the names of the folded ones.
    With ``concrete`` every graph input shape is known: a dim onnx cannot infer
    is found by running the node's reference on zeros, and an unresolvable one
    is an error.  Folding creates at most ``budget``'s bytes of constants (default:
    :data:`ortgpu._limits.DEFAULT_MAX_FOLD_BYTES`); nodes it cannot afford stay.
    """
    if budget is None:
        budget = FoldBudget(LoadLimits().max_fold_bytes)
    remaining: list[GraphNode] = []
    folded: list[str] = []
    inference_cache: dict[tuple[Any, ...], list[tuple[Shape, np.dtype[Any]] | None]] = {}
    for node in nodes:
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
    (when :func:`ortgpu._limits.check_shape_probe` allows it)."""
    if all(name in types and is_concrete(types[name][0]) for name in node.outputs if name):
        return
    if not all(name in types and is_concrete(types[name][0]) for name in node.inputs if name):
        raise ModelError(
            f"cannot infer the shapes of {node.describe()}: the shapes of its inputs are unknown{budget.note()}"
        )
    positions = SHAPE_INPUT_POSITIONS.get(node.op_type, ()) if node.domain == "" else ()
    computed = check_shape_probe(node, types, constants, budget, positions)
    if computed is not None:  # a growing op (Range, Tile...): its shape without computing it
        types[node.outputs[0]] = computed
        return
    inputs: list[np.ndarray | None] = []
    for name in node.inputs:
        if not name:
            inputs.append(None)
        elif name in constants:
            inputs.append(constants[name])
        else:
            shape, dtype = types[name]
            inputs.append(np.zeros(_concrete(shape), dtype=dtype))
    try:
        results = _reference(node, inputs, _output_infos_guess(node, types))
    except ModelError:
        raise
    except Exception as error:
        raise ModelError(f"cannot infer the output shapes of {node.describe()}: {error}") from error
    for name, value in zip(node.outputs, results):
        if name:
            array = np.asarray(value)
            dtype = types[name][1] if name in types else array.dtype
            types[name] = (tuple(array.shape), dtype)


#: Input positions whose values (not just shapes) decide an operator's output shape.
SHAPE_INPUT_POSITIONS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Unsqueeze": (1,), "Squeeze": (1,), "Slice": (1, 2, 3, 4), "Expand": (1,),
    "Tile": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2), "Split": (1,), "Pad": (1, 3),
    "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,),
    "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSum": (1,), "ReduceLogSumExp": (1,),
    "ReduceSumSquare": (1,), "Resize": (1, 2, 3), "Upsample": (1,), "TopK": (1,), "OneHot": (1,),
    "CenterCropPad": (1,), "Col2Im": (1, 2),
}


def value_dependent_inputs(nodes: Sequence[GraphNode], graph_inputs: Sequence[str]) -> frozenset[str]:
    """Graph inputs that flow (through anything but ``Shape``) into a shape-deciding input position."""
    producer = {name: node for node in nodes for name in node.outputs if name}
    pending = [
        node.inputs[position]
        for node in nodes
        if node.domain == ""
        for position in SHAPE_INPUT_POSITIONS.get(node.op_type, ())
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


def fold_batch_norms(
    nodes: Sequence[GraphNode],
    constants: dict[str, np.ndarray],
    types: dict[str, tuple[Shape, np.dtype[Any]]],
    graph_outputs: Sequence[str],
) -> tuple[list[GraphNode], list[str]]:
    """Fold inference BatchNormalization into the Conv that feeds it (weights scaled per channel).

    Applies when the Conv's weight (and bias) and the BatchNormalization's
    parameters are float32 constants and the Conv's output feeds only the
    BatchNormalization.  Returns the new node list and the names of the removed nodes.
    """
    consumers: dict[str, int] = {}
    for node in nodes:
        for name in node.inputs:
            if name:
                consumers[name] = consumers.get(name, 0) + 1
    producer = {name: node for node in nodes for name in node.outputs if name}
    replaced: dict[str, GraphNode] = {}
    removed: set[str] = set()
    for node in nodes:
        if node.op_type != "BatchNormalization" or node.domain != "" or len(node.inputs) != 5:
            continue
        if int(node.attrs.get("training_mode", 0)) or any(node.outputs[1:]):
            continue
        conv = producer.get(node.inputs[0])
        if conv is None or conv.op_type != "Conv" or conv.domain != "" or conv.name in replaced:
            continue
        x_name = node.inputs[0]
        if consumers.get(x_name, 0) != 1 or x_name in graph_outputs:
            continue
        params = [constants.get(name) for name in node.inputs[1:]]
        weight = constants.get(conv.inputs[1]) if len(conv.inputs) > 1 else None
        bias_name = conv.inputs[2] if len(conv.inputs) > 2 else ""
        bias = constants.get(bias_name) if bias_name else None
        if weight is None or any(p is None for p in params) or (bias_name and bias is None):
            continue
        if weight.dtype != np.float32 or any(p is not None and p.dtype != np.float32 for p in params):
            continue
        scale, beta, mean, var = (np.asarray(p, dtype=np.float64).reshape(-1) for p in params if p is not None)
        channels = weight.shape[0]
        if not all(v.shape == (channels,) for v in (scale, beta, mean, var)):
            continue
        factor = scale / np.sqrt(var + float(node.attrs.get("epsilon", 1e-5)))
        conv_bias = np.zeros(channels) if bias is None else np.asarray(bias, dtype=np.float64).reshape(-1)
        new_weight = (weight.astype(np.float64) * factor.reshape((-1,) + (1,) * (weight.ndim - 1))).astype(np.float32)
        new_bias = ((conv_bias - mean) * factor + beta).astype(np.float32)
        weight_name = _fresh_name(f"{conv.name}::bn_folded_weight", constants)
        constants[weight_name] = new_weight
        bias_out = _fresh_name(f"{conv.name}::bn_folded_bias", constants)
        constants[bias_out] = new_bias
        types[weight_name] = (tuple(new_weight.shape), new_weight.dtype)
        types[bias_out] = (tuple(new_bias.shape), new_bias.dtype)
        replaced[conv.name] = GraphNode(
            conv.name, "Conv", "", (conv.inputs[0], weight_name, bias_out), (node.outputs[0],), conv.attrs, conv.opset
        )
        removed.add(node.name)
    result = [replaced.get(node.name, node) for node in nodes if node.name not in removed]
    return result, sorted(removed)


def _fresh_name(base: str, taken: Mapping[str, object]) -> str:
    name, index = base, 0
    while name in taken:
        index += 1
        name = f"{base}_{index}"
    return name


# ---------------------------------------------------------------------------
# loading


def _parse(path_or_bytes: str | os.PathLike[str] | bytes | onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    if isinstance(path_or_bytes, onnx.ModelProto):
        return path_or_bytes, None
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        data = bytes(path_or_bytes)
        source = "the model bytes"
        model_dir = None
    else:
        path = os.fspath(path_or_bytes)
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError as error:
            raise InvalidModelError(f"cannot read the model file {path!r}: {error}") from error
        source = f"the model file {path!r}"
        model_dir = os.path.dirname(os.path.abspath(path))
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as error:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise InvalidModelError(
            f"{source} is not a valid ONNX protobuf ({error}); it may be truncated or corrupt: "
            "re-download or re-export it"
        ) from error
    if not model.HasField("graph"):
        raise InvalidModelError(
            f"{source} has no graph: it is empty, truncated or not an ONNX model; re-download or re-export it"
        )
    return model, model_dir


def _check_versions(model: onnx.ModelProto) -> dict[str, int]:
    if model.ir_version > MAX_IR_VERSION:
        raise InvalidModelError(
            f"the model's IR version {model.ir_version} is newer than ortgpu supports (up to {MAX_IR_VERSION}); "
            "re-export it with an older onnx or upgrade ortgpu"
        )
    if model.ir_version < 3:
        raise InvalidModelError(f"the model's IR version {model.ir_version} is too old (need at least 3); re-export it")
    opsets: dict[str, int] = {}
    for entry in model.opset_import:
        domain = "" if entry.domain == "ai.onnx" else entry.domain
        opsets[domain] = int(entry.version)
    default = opsets.get("")
    if default is None:
        raise InvalidModelError("the model imports no default-domain (ai.onnx) opset; re-export it")
    if not MIN_OPSET <= default <= MAX_OPSET:
        raise UnsupportedOpError(
            f"the model uses ai.onnx opset {default}; ortgpu supports opsets {MIN_OPSET}..{MAX_OPSET}: "
            "convert it with onnx.version_converter"
        )
    return opsets


def _graph_nodes(graph: onnx.GraphProto, opsets: Mapping[str, int]) -> list[GraphNode]:
    nodes = []
    used_names: set[str] = set()
    for index, proto in enumerate(graph.node):
        domain = "" if proto.domain == "ai.onnx" else proto.domain
        name = proto.name or f"{proto.op_type}_{index}"
        while name in used_names:
            name = f"{name}_{index}"
        used_names.add(name)
        if domain not in opsets:
            raise InvalidModelError(f"node {name!r} ({proto.op_type}) uses domain {domain!r}, which the model does not import")
        opset = opsets[domain]
        text = f"{proto.op_type} node {name!r} (opset {opset})"
        attrs: dict[str, Any] = {a.name: _attribute_value(a, text) for a in proto.attribute}
        attrs["__proto_attributes__"] = tuple(proto.attribute)
        nodes.append(
            GraphNode(name, proto.op_type, domain, tuple(proto.input), tuple(proto.output), attrs, opset)
        )
    return _topological(nodes, graph)


def _topological(nodes: list[GraphNode], graph: onnx.GraphProto) -> list[GraphNode]:
    available = {v.name for v in graph.input} | {t.name for t in graph.initializer} | {""}
    producers = {}
    for node in nodes:
        for name in node.outputs:
            producers[name] = node.name
    ordered: list[GraphNode] = []
    pending = list(nodes)
    while pending:
        progressed = []
        rest = []
        for node in pending:
            if all(name in available or name not in producers for name in node.inputs):
                progressed.append(node)
                available.update(node.outputs)
            else:
                rest.append(node)
        if not progressed:
            raise InvalidModelError(
                f"the graph has a cycle through node {rest[0].name!r} ({rest[0].op_type}); the model is corrupt"
            )
        ordered.extend(progressed)
        pending = rest
    for node in ordered:
        for name in node.inputs:
            if name and name not in available:
                raise InvalidModelError(f"node {node.name!r} ({node.op_type}) reads {name!r}, which nothing produces")
    return ordered


def _value_info(value: onnx.ValueInfoProto, what: str) -> ValueInfo:
    if not value.type.HasField("tensor_type"):
        raise UnsupportedOpError(f"{what} {value.name!r} is not a tensor (sequences, maps and optionals are not supported)")
    dtype = onnx_dtype_to_numpy(value.type.tensor_type.elem_type, f"{what} {value.name!r}")
    dims: list[Dim] = []
    if value.type.tensor_type.HasField("shape"):
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
            elif dim.HasField("dim_param"):
                dims.append(dim.dim_param)
            else:
                dims.append(None)
    return ValueInfo(value.name, tuple(dims), dtype)


def _check_supported(nodes: Sequence[GraphNode]) -> None:
    problems = []
    for node in nodes:
        try:
            get_operator(node.op_type, node.opset, node.domain)
        except UnsupportedOpError as error:
            problems.append(f"{node.describe()}: {error}")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise UnsupportedOpError("the model uses operators ortgpu does not implement: " + "; ".join(problems[:5]) + more)


def load_model(
    path_or_bytes: str | os.PathLike[str] | bytes | onnx.ModelProto,
    *,
    max_fold_bytes: int | None = None,
    max_nodes: int | None = None,
) -> LoadedModel:
    """Load, check and pre-process an ONNX model.

    Raises :class:`InvalidModelError` for malformed files (truncated,
    failing onnx's checker, external data outside the model's folder) and
    :class:`UnsupportedOpError` for opsets, operators or dtypes ortgpu lacks.

    ``max_nodes``: a model with more nodes is a :class:`ModelError`.  ``max_fold_bytes``: the most bytes of
    constants that constant folding creates for this model (at load and in each plan together); once spent,
    larger foldable nodes stay and run.  When not given: the environment variables ``ORTGPU_MAX_NODES`` and
    ``ORTGPU_MAX_FOLD_BYTES``, else :data:`ortgpu._limits.DEFAULT_MAX_NODES` (100000) and
    :data:`~ortgpu._limits.DEFAULT_MAX_FOLD_BYTES` (256 MiB).
    """
    limits = LoadLimits.resolve(max_fold_bytes=max_fold_bytes, max_nodes=max_nodes)
    model, model_dir = _parse(path_or_bytes)
    check_node_count(len(model.graph.node), limits)
    opsets = _check_versions(model)
    if _check_external_data(model, model_dir):
        assert model_dir is not None
        try:
            external_data_helper.load_external_data_for_model(model, model_dir)
        except Exception as error:  # noqa: BLE001
            raise InvalidModelError(f"cannot read the model's external data: {error}") from error
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else "invalid model"
        raise InvalidModelError(f"the model fails onnx's checker: {first}; fix or re-export the model") from error
    except ValueError as error:  # protobuf too large for the in-memory checker
        if "2GB" not in str(error) and "2 GB" not in str(error):
            raise InvalidModelError(f"the model fails onnx's checker: {error}") from error
    graph = model.graph
    initializers: dict[str, np.ndarray] = {}
    for tensor in graph.initializer:
        onnx_dtype_to_numpy(tensor.data_type, f"initializer {tensor.name!r}")
        initializers[tensor.name] = _to_array(tensor, f"initializer {tensor.name!r}")
    if graph.sparse_initializer:
        raise UnsupportedOpError("the model has sparse initializers, which ortgpu does not support")
    nodes = _graph_nodes(graph, opsets)
    _check_supported([n for n in nodes if not (n.op_type == "Constant" and n.domain == "")])
    inputs = [_value_info(v, "graph input") for v in graph.input if v.name not in initializers]
    outputs = [_value_info(v, "graph output") for v in graph.output]
    types: dict[str, tuple[Shape, np.dtype[Any]]] = {}
    for value in inputs:
        types[value.name] = (value.shape, value.dtype)
    for name, array in initializers.items():
        types[name] = (tuple(array.shape), array.dtype)
    constants = dict(initializers)
    budget = FoldBudget(limits.max_fold_bytes)
    remaining, folded = propagate(nodes, types, constants, opsets, concrete=False, budget=budget)
    remaining, folded_norms = fold_batch_norms(remaining, constants, types, [v.name for v in outputs])
    folded += folded_norms
    outputs = [_refine_output(value, types) for value in outputs]
    return LoadedModel(
        inputs=inputs,
        outputs=outputs,
        opsets=opsets,
        initializers=initializers,
        constants=constants,
        nodes=remaining,
        types=types,
        ir_version=int(model.ir_version),
        model_dir=model_dir,
        producer=model.producer_name,
        folded_nodes=folded,
        limits=limits,
        folded_bytes=budget.spent,
        value_dependent_inputs=value_dependent_inputs(remaining, [v.name for v in inputs]),
    )


def _refine_output(value: ValueInfo, types: Mapping[str, tuple[Shape, np.dtype[Any]]]) -> ValueInfo:
    if value.name not in types:
        return value
    shape, _ = types[value.name]
    if not value.shape and shape:
        return ValueInfo(value.name, shape, value.dtype)
    if len(shape) == len(value.shape):
        merged = tuple(d if isinstance(d, int) or i is None else i for d, i in zip(value.shape, shape))
        merged = tuple(i if isinstance(i, int) and not isinstance(d, int) else d for d, i in zip(merged, shape))
        return ValueInfo(value.name, merged, value.dtype)
    return value
