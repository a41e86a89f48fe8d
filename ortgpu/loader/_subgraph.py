"""A CPU interpreter for the subgraphs of control-flow operators (``If``, ``Loop``, ``Scan``, ``SequenceMap``).

How subgraphs reach an operator
-------------------------------
The loader (:mod:`ortgpu.loader._model`, through :func:`_attribute_value`) turns a ``GRAPH`` attribute of an
``If``/``Loop``/``Scan`` node of the default domain into a :class:`Subgraph` (to the operator, an
:class:`ortgpu._types.SubgraphRunner`): the ``onnx.GraphProto`` itself, the model's opsets, and the body's nodes
checked and converted once (an operator ortgpu lacks, or an attribute it cannot hold, is refused when the model
loads).
Subgraph attributes of other operators (and ``GRAPHS`` lists) stay refused with a typed error.

Outer-scope names: a body may read tensors of the enclosing graphs by name.  The executor hands a node only its
declared inputs, so the loader appends the outer-scope names the node's subgraphs read (:func:`outer_names`, in
first-read order, nested subgraphs included) to the node's inputs, after its declared ones.  The planner's
liveness and the executor then see them as ordinary inputs, and the operator finds their values at the end of its
``inputs`` (``Subgraph.outer_names`` says which name each is; every subgraph of a node lists the node's full set).
This interpreter follows the same convention for control-flow nodes nested in a body.

Running a body
--------------
:meth:`Subgraph.run` runs the nodes in order through the operators' numpy ``reference``.  Output infos come from
onnx's shape inference on the actual input values (shapes are known as the body runs, node by node); where it
leaves a dim unknown, the reference runs with a guess and again with the shapes it produced (both runs must
agree).  Everything the interpreter cannot do raises a typed :class:`ortgpu_core._errors.ModelError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
import onnx.helper

from ortgpu_core._errors import InvalidModelError, ModelError, OrtGpuError, ShapeError, UnsupportedOpError

from .._host_values import element_type_of_proto, is_structured_box
from .._types import SubgraphRunner, TensorInfo, onnx_dtype_to_numpy
from ..ops import Operator, get_operator
from ._graph_node import GraphNode, _effective_opset, _sparse_to_array, _to_array
from ._node_inference import _apply_operator_shapes, _infer_with_onnx

__all__ = ["CONTROL_FLOW_OPS", "Subgraph", "count_nodes", "outer_names", "free_names", "is_control_flow"]

#: Default-domain operators whose subgraph attributes ortgpu runs (on the CPU).
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})

#: Inputs up to this many elements are given to onnx's shape inference as data (shape tensors, axes, scalars),
#: and are part of its cache key.
_DATA_LIMIT = 64
#: Cached inference results per subgraph (distinct input shapes and small data).
_CACHE_ENTRIES = 1024


def is_control_flow(op_type: str, domain: str) -> bool:
    return domain in ("", "ai.onnx") and op_type in CONTROL_FLOW_OPS


def _attribute_graphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    graphs: list[onnx.GraphProto] = []
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            graphs.append(attribute.g)
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            graphs.extend(attribute.graphs)
    return graphs


def free_names(graph: onnx.GraphProto) -> list[str]:
    """The names ``graph``'s nodes (nested subgraphs included) read that ``graph`` does not define, in first-read
    order: the outer-scope tensors it needs."""
    defined = {value.name for value in graph.input} | {tensor.name for tensor in graph.initializer} | {""}
    defined.update(sparse.values.name for sparse in graph.sparse_initializer)
    defined.update(name for node in graph.node for name in node.output)
    found: dict[str, None] = {}
    for node in graph.node:
        for name in node.input:
            if name not in defined:
                found.setdefault(name)
        for nested in _attribute_graphs(node):
            for name in free_names(nested):
                if name not in defined:
                    found.setdefault(name)
    for value in graph.output:  # a body may return an outer tensor unchanged
        if value.name not in defined:
            found.setdefault(value.name)
    return list(found)


def outer_names(node: onnx.NodeProto) -> tuple[str, ...]:
    """The outer-scope names the subgraphs of ``node`` read, in first-read order (its trailing extra inputs)."""
    found: dict[str, None] = {}
    for graph in _attribute_graphs(node):
        for name in free_names(graph):
            found.setdefault(name)
    return tuple(found)


def count_nodes(graph: onnx.GraphProto) -> int:
    """Nodes of ``graph`` and of every subgraph nested in it (what node-count limits count)."""
    total = 0
    pending = [graph]
    while pending:
        current = pending.pop()
        total += len(current.node)
        for node in current.node:
            pending.extend(_attribute_graphs(node))
    return total


def _attribute_value(
    attribute: onnx.AttributeProto,
    node_text: str,
    op_type: str = "",
    domain: str = "",
    opsets: Mapping[str, int] | None = None,
    outer: Sequence[str] = (),
) -> Any:
    """An attribute as a Python value.  A ``GRAPH`` attribute of ``If``/``Loop``/``Scan`` (given the model's
    ``opsets`` and the node's ``outer``-scope extra inputs) becomes a :class:`ortgpu.loader._subgraph.Subgraph`; other
    subgraph attributes are refused."""
    kind = attribute.type
    if kind == onnx.AttributeProto.GRAPH and opsets is not None and is_control_flow(op_type, domain):
        return Subgraph.build(attribute.g, opsets, f"{attribute.name} of {node_text}", outer)
    if kind in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        raise UnsupportedOpError(
            f"{node_text} has a subgraph attribute {attribute.name!r}; ortgpu runs no control flow"
            + (f" other than {', '.join(sorted(CONTROL_FLOW_OPS))}" if kind == onnx.AttributeProto.GRAPH else "")
        )
    if kind == onnx.AttributeProto.TENSOR:
        return _to_array(attribute.t, f"tensor attribute {attribute.name!r} of {node_text}")
    if kind == onnx.AttributeProto.TENSORS:
        return [_to_array(t, f"tensor attribute {attribute.name!r} of {node_text}") for t in attribute.tensors]
    if kind == onnx.AttributeProto.SPARSE_TENSOR:
        return _sparse_to_array(attribute.sparse_tensor, f"sparse tensor attribute {attribute.name!r} of {node_text}")
    value = onnx.helper.get_attribute_value(attribute)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, list):
        return [v.decode("utf-8") if isinstance(v, bytes) else v for v in value]
    return value


@dataclass(eq=False)
class _Step:
    node: GraphNode
    operator: Operator | None  # None: a Constant (its value is ``constant``)
    attrs: dict[str, Any]
    constant: np.ndarray | None = None
    extras: tuple[str, ...] = ()


@dataclass(eq=False)
class Subgraph(SubgraphRunner):
    """A subgraph attribute value: the graph, the opsets its nodes run at, and its checked nodes.

    ``outer_names``: the outer-scope names the owning node passes as its trailing extra inputs, in order (see
    the module docstring).  ``what`` names it in error messages (``body of Loop node 'loop' (opset 13)``).
    """

    graph: onnx.GraphProto
    opsets: Mapping[str, int]
    what: str
    outer_names: tuple[str, ...] = ()
    _steps: list[_Step] = field(default_factory=list, repr=False)
    _initializers: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    _infer_cache: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, graph: onnx.GraphProto, opsets: Mapping[str, int], what: str, names: Sequence[str] = ()) -> Subgraph:
        """Check and convert ``graph``'s nodes (nested subgraphs included); typed errors for what ortgpu lacks."""
        subgraph = cls(graph, dict(opsets), what, tuple(names))
        for tensor in graph.initializer:
            onnx_dtype_to_numpy(tensor.data_type, f"initializer {tensor.name!r} of the {what}", constant=True)
            subgraph._initializers[tensor.name] = _to_array(tensor, f"initializer {tensor.name!r} of the {what}")
        for sparse in graph.sparse_initializer:
            label = f"sparse initializer {sparse.values.name!r} of the {what}"
            onnx_dtype_to_numpy(sparse.values.data_type, label, constant=True)
            subgraph._initializers[sparse.values.name] = _sparse_to_array(sparse, label)
        for value in list(graph.input) + list(graph.output):
            kind = value.type.WhichOneof("value")
            if kind == "sequence_type" and value.type.sequence_type.elem_type.HasField("tensor_type"):
                continue  # a sequence of tensors: a host value (ortgpu.ops.ai_onnx.sequences), as in the main graph
            if kind == "optional_type":
                # An optional tensor or sequence: a host value (ortgpu.ops.ai_onnx.optional); other elements are refused.
                element_type_of_proto(value.type.optional_type.elem_type, f"{value.name!r} of the {what}")
                continue
            if kind not in (None, "tensor_type"):
                raise UnsupportedOpError(
                    f"the {what} has input or output {value.name!r} of type {kind}; ortgpu runs subgraphs on "
                    "tensors, sequences of tensors and optionals of those only (no maps)"
                )
        for index, proto in enumerate(graph.node):
            domain = "" if proto.domain == "ai.onnx" else proto.domain
            name = proto.name or f"{proto.op_type}_{index}"
            if domain not in opsets:
                raise InvalidModelError(
                    f"node {name!r} ({proto.op_type}) of the {what} uses domain {domain!r}, which the model does "
                    "not import"
                )
            text = f"{proto.op_type} node {name!r} (opset {opsets[domain]}) in the {what}"
            try:
                opset = _effective_opset(proto.op_type, domain, opsets[domain])
            except UnsupportedOpError as error:
                raise UnsupportedOpError(f"{text}: {error}") from None
            extras = outer_names(proto) if is_control_flow(proto.op_type, domain) else ()
            attrs: dict[str, Any] = {
                a.name: _attribute_value(a, text, proto.op_type, domain, opsets, extras) for a in proto.attribute
            }
            node_attrs = dict(attrs)
            node_attrs["__proto_attributes__"] = tuple(proto.attribute)
            node = GraphNode(
                name, proto.op_type, domain, tuple(proto.input) + extras, tuple(proto.output), node_attrs, opset
            )
            if proto.op_type == "Constant" and domain == "":
                subgraph._steps.append(_Step(node, None, attrs, constant=_constant_value(attrs, text)))
                continue
            try:
                operator = get_operator(proto.op_type, opset, domain)
            except UnsupportedOpError as error:
                raise UnsupportedOpError(f"{text}: {error}") from None
            subgraph._steps.append(_Step(node, operator, attrs, extras=extras))
        return subgraph

    @property
    def initializers(self) -> Mapping[str, np.ndarray]:
        """The graph's own initializers, by name."""
        return self._initializers

    def nodes(self) -> list[GraphNode]:
        """The graph's nodes, checked and converted (Constant nodes included), in order; a nested control-flow
        node carries the outer-scope names its subgraphs read as trailing inputs."""
        return [step.node for step in self._steps]

    def run(self, inputs: Sequence[np.ndarray], outer: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The graph's outputs for values of its inputs (in order) and of the outer-scope names it reads."""
        if len(inputs) != len(self.graph.input):
            raise ModelError(f"the {self.what} has {len(self.graph.input)} inputs; it was given {len(inputs)} values")
        env: dict[str, np.ndarray] = dict(outer)
        env.update(self._initializers)
        for value, array in zip(self.graph.input, inputs):
            env[value.name] = array
        for step in self._steps:
            node = step.node
            if step.constant is not None:
                env[node.outputs[0]] = step.constant
                continue
            assert step.operator is not None
            values: list[np.ndarray | None] = []
            for name in node.inputs:
                if not name:
                    values.append(None)
                elif name in env:
                    values.append(env[name])
                else:
                    raise InvalidModelError(f"{node.describe()} in the {self.what} reads {name!r}, which is undefined")
            results = self._run_node(step, values)
            for name, result in zip(node.outputs, results):
                if name:
                    env[name] = result
        outputs = []
        for value in self.graph.output:
            if value.name not in env:
                raise InvalidModelError(f"the {self.what} never computes its output {value.name!r}")
            outputs.append(env[value.name])
        return outputs

    def _run_node(self, step: _Step, values: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        node = step.node
        operator = step.operator
        assert operator is not None
        inferred = self._infer(step, values)
        first_dtype = next((v.dtype for v in values if v is not None), np.dtype(np.float32))
        guesses: list[TensorInfo] = []
        known = True
        for name in node.outputs:
            found = inferred.get(name) if name else None
            if found is None:
                known = False
                guesses.append(TensorInfo((), first_dtype))
                continue
            shape, dtype = found
            if not all(isinstance(d, int) for d in shape):
                known = False
            guesses.append(TensorInfo(tuple(d if isinstance(d, int) else 0 for d in shape), dtype))
        try:
            results = [np.asarray(r) for r in operator.reference(values, step.attrs, guesses)]
            if not known and not is_control_flow(node.op_type, node.domain):
                # Unknown dims: run again with the shapes (and dtypes) the first run produced; both must agree.
                # (Control flow reads no output infos but for empty scan outputs: it runs once.)
                actual = [
                    TensorInfo(tuple(r.shape), guess.dtype if inferred.get(name) else r.dtype)
                    for name, guess, r in zip(node.outputs, guesses, results)
                ]
                again = [np.asarray(r) for r in operator.reference(values, step.attrs, actual)]
                if [r.shape for r in again] != [r.shape for r in results]:
                    raise ModelError(
                        f"cannot run {node.describe()} in the {self.what}: its output shapes cannot be determined"
                    )
                results, guesses = again, actual
        except OrtGpuError as error:  # typed already: say where in the subgraph it happened
            raise type(error)(f"in the {self.what}: {error}") from error
        except (ValueError, IndexError, TypeError, ArithmeticError) as error:
            raise ShapeError(f"{node.describe()} in the {self.what} failed: {str(error)[:300]}") from error
        except Exception as error:  # noqa: BLE001 - whatever else a reference raises: typed, with its reason
            raise ModelError(
                f"{node.describe()} in the {self.what} failed: {type(error).__name__}: {str(error)[:300]}"
            ) from error
        out = []
        for info, result, name in zip(guesses, results, node.outputs):
            if name and inferred.get(name) and tuple(result.shape) != info.shape and known:
                raise ModelError(
                    f"{node.describe()} in the {self.what} produced shape {result.shape}; shape inference said "
                    f"{info.shape}"
                )
            dtype = info.dtype if name and inferred.get(name) else result.dtype
            out.append(np.asarray(result, dtype=dtype) if result.dtype != dtype else result)
        return out

    def _infer(self, step: _Step, values: Sequence[np.ndarray | None]) -> dict[str, Any]:
        """onnx's shape inference of ``step`` for these input values (cached by input shapes and small data)."""
        node = step.node
        if any(is_structured_box(value) for value in values):
            # onnx would read a sequence or an optional (an object box) as a string tensor: the node's run decides
            return {}
        key: list[Any] = [id(step)]
        types: dict[str, Any] = {}
        constants: dict[str, np.ndarray] = {}
        for name, value in zip(node.inputs, values):
            if value is None:
                key.append(None)
                continue
            types[name] = (tuple(value.shape), value.dtype)
            small = value.size <= _DATA_LIMIT
            if small:
                constants[name] = value
            data = (tuple(value.reshape(-1).tolist()) if value.dtype == object else value.tobytes()) if small else None
            key.append((value.dtype.str, value.shape, data))
        cache_key = tuple(key)
        cached = self._infer_cache.get(cache_key)
        if cached is not None:
            return cached
        inferred = _infer_with_onnx(node, types, constants, self.opsets)
        types.update(inferred)
        _apply_operator_shapes(node, types)
        result = {name: types[name] for name in node.outputs if name and name in inferred}
        if len(self._infer_cache) < _CACHE_ENTRIES:
            self._infer_cache[cache_key] = result
        return result


def _constant_value(attrs: Mapping[str, Any], text: str) -> np.ndarray:
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
    raise UnsupportedOpError(f"{text}: only numeric Constant values are supported (got {sorted(attrs)})")
