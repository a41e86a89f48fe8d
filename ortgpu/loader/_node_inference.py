"""One node's output types: onnx's shape inference of the node, and the operators' own shape rules.

Shape propagation over a whole graph (:mod:`ortgpu.loader._propagate`) and the subgraph interpreter
(:mod:`ortgpu.loader._subgraph`) both infer node by node with these.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import onnx
import onnx.defs
import onnx.helper
import onnx.numpy_helper
import onnx.shape_inference

from ortgpu_core._errors import ModelError, UnsupportedOpError

from .._host_values import is_structured_dtype
from .._types import TensorInfo, numpy_dtype_of
from ..ops import get_operator
from ._graph_node import Dim, GraphNode, Shape

__all__ = ["is_concrete", "public_attrs"]

#: Constants up to this many elements are passed to onnx's shape inference as data.
_DATA_PROPAGATION_LIMIT = 4096


def _type_proto(shape: Shape, dtype: np.dtype[Any]) -> onnx.TypeProto:
    elem_type = onnx.helper.np_dtype_to_tensor_dtype(dtype)
    return onnx.helper.make_tensor_type_proto(elem_type, list(shape))


def _from_type_proto(type_proto: onnx.TypeProto) -> tuple[Shape, np.dtype[Any]] | None:
    if not type_proto.HasField("tensor_type"):
        return None
    tensor_type = type_proto.tensor_type
    if tensor_type.elem_type == 0:
        return None
    dtype = numpy_dtype_of(tensor_type.elem_type)
    if dtype is None:
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
    if any(name and name in types and is_structured_dtype(types[name][1]) for name in node.inputs):
        # onnx would read a sequence or an optional (an object-dtype host value here) as a string tensor: its outputs are
        # learnt by running the node (see _resolve_unknown_dims), never from a wrong inference.
        return {}
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
    declared = list(node.inputs)
    # Control flow: the outer-scope names a body reads ride as trailing extra inputs (see ortgpu.loader._subgraph); onnx
    # knows them only as outer-scope values, so they stay out of the node and keep their types in input_types.
    outer = next((tuple(v.outer_names) for v in node.attrs.values() if hasattr(v, "outer_names")), ())
    if outer and len(declared) >= len(outer) and tuple(declared[-len(outer) :]) == outer:
        declared = declared[: -len(outer)]
    proto = onnx.helper.make_node(node.op_type, declared, list(node.outputs), domain=node.domain or None)
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
    attributes = list(original) if isinstance(original, tuple) else []
    if node.op_type == "STFT" and node.domain == "" and not any(a.name == "onesided" for a in attributes):
        # onnx's STFT inference reads a missing onesided as 0; the spec's default (and the reference's) is 1.
        attributes.append(onnx.helper.make_attribute("onesided", 1))
    return attributes


def public_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The attributes an operator sees (without the loader's private entries)."""
    return {k: v for k, v in attrs.items() if not k.startswith("__")}


def _apply_operator_shapes(node: GraphNode, types: dict[str, tuple[Shape, np.dtype[Any]]]) -> None:
    """Where every input shape is known and the operator has its own shape rule (see
    :meth:`~ortgpu.ops.Operator.output_shapes`), its shapes replace onnx's inferred ones."""
    infos: list[TensorInfo | None] = []
    for name in node.inputs:
        if not name:
            infos.append(None)
        elif name in types and is_concrete(types[name][0]):
            infos.append(TensorInfo(_concrete(types[name][0]), types[name][1]))
        else:
            return
    try:
        operator = get_operator(node.op_type, node.opset, node.domain)
    except UnsupportedOpError:
        return
    try:
        shapes = operator.output_shapes(infos, public_attrs(node.attrs))
    except ModelError:
        raise
    except Exception:  # noqa: BLE001 - invalid attributes (a zero stride...): reported where the node is planned
        return
    if shapes is None:
        return
    for name, shape in zip(node.outputs, shapes):
        if name and name in types:
            types[name] = (tuple(shape), types[name][1])
