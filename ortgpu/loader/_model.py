"""Loading an ONNX model: parse, check, infer shapes, fold constants.

:func:`load_model` turns a file (or bytes) into a :class:`LoadedModel`: the
graph as plain :class:`GraphNode` records in topological order, its inputs and
outputs with (possibly symbolic) shapes, its initializers, and every tensor
computable at load time folded into a constant on the CPU with the operators'
numpy ``reference``.  Planning for concrete input shapes
(:mod:`ortgpu._planner`) runs the same propagation again with the shapes
filled in, so ``Shape -> Gather -> Concat -> Reshape`` chains fold completely.
Graph rewrites (BatchNormalization folded into Conv, fused epilogues) are the
planner's (:mod:`ortgpu._rewrites`), so ``fuse=False`` plans the graph as loaded.

Control flow (``If``/``Loop``/``Scan``): their subgraph attributes become :class:`ortgpu.loader._subgraph.Subgraph`
values, and the outer-scope tensors the subgraphs read are appended to the node's inputs after its declared ones
(see :mod:`ortgpu.loader._subgraph`); other operators' subgraph attributes are refused.  Node-count limits count the
nodes of subgraphs too.

Shape inference and folding live in :mod:`ortgpu.loader._propagate` (shared with the
planner); the limits a hostile model meets (node count, folding budget, external
data checks) in :mod:`ortgpu.loader._limits`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Hashable, Mapping, Sequence

import numpy as np
import onnx
import onnx.checker
import onnx.defs
import onnx.helper
import onnx.numpy_helper
from onnx import external_data_helper

from ortgpu_core._errors import InvalidModelError, UnsupportedOpError

from .._host_values import element_type_of_proto, is_structured_dtype, optional_dtype, sequence_dtype
from .._types import onnx_dtype_to_numpy
from ..ops import get_operator
from ._graph_node import (
    MAX_IR_VERSION,
    MAX_OPSET,
    MIN_OPSET,
    Dim,
    GraphNode,
    Shape,
    _effective_opset,
    _sparse_to_array,
    _to_array,
)
from ._limits import FoldBudget, LoadLimits, check_node_count
from ._limits import check_external_data as _check_external_data
from ._propagate import (
    SHAPE_INPUT_POSITIONS,
    is_concrete,
    propagate,
    public_attrs,
    value_dependent_inputs,
)
from ._subgraph import _attribute_value, count_nodes, is_control_flow, outer_names

__all__ = [
    "Dim",
    "ValueInfo",
    "GraphNode",
    "LoadedModel",
    "load_model",
    "MAX_IR_VERSION",
    "MIN_OPSET",
    "MAX_OPSET",
    # re-exported from ortgpu._types, ortgpu.loader._graph_node and ortgpu.loader._propagate
    "onnx_dtype_to_numpy",
    "Shape",
    "is_concrete",
    "propagate",
    "public_attrs",
    "SHAPE_INPUT_POSITIONS",
    "value_dependent_inputs",
]

# Shapes are propagated and constants folded in ortgpu.loader._propagate; how much folding may create (per
# constant, per model) and the node-count limit: ortgpu.loader._limits.


@dataclass(frozen=True)
class ValueInfo:
    """A graph input or output: name, shape (ints, symbolic names or ``None``) and numpy dtype."""

    name: str
    shape: Shape
    dtype: np.dtype[Any]
    #: False for a graph output the model gives no type (its dtype then comes from inference).
    typed: bool = True
    #: False where neither the model nor inference gives a rank (``shape`` is then ``()`` and says nothing).
    ranked: bool = True


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
    #: The model's metadata as onnxruntime's ``ModelMetadata`` has it (producer_name, graph_name, domain,
    #: description, graph_description, version, custom_metadata_map).
    metadata: dict[str, Any] = field(default_factory=dict)
    folded_nodes: list[str] = field(default_factory=list)
    #: The limits it was loaded under, and the bytes of constants folding created at load (counted against
    #: ``limits.max_fold_bytes`` together with what each plan folds).
    limits: LoadLimits = field(default_factory=LoadLimits)
    folded_bytes: int = 0
    #: Graph inputs whose *values* decide tensor shapes (a Reshape's shape, Slice bounds,
    #: reduction axes...): a plan is made for their values, not only their shapes.
    value_dependent_inputs: frozenset[str] = frozenset()
    #: Tensors the planner's rewrites computed from this model's constants (BatchNormalization folded into Conv
    #: weights), kept for its next plans (:class:`ortgpu._rewrites.FoldContext`).
    rewrite_cache: dict[Hashable, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def input_names(self) -> list[str]:
        return [value.name for value in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [value.name for value in self.outputs]


# ---------------------------------------------------------------------------
# dtypes and attributes


# ---------------------------------------------------------------------------
# loading


def _parse(path_or_bytes: str | os.PathLike[str] | bytes | onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    if isinstance(path_or_bytes, onnx.ModelProto):
        # Loading edits the proto (initializer overrides, external data read in, IR 3 inputs listed, and the
        # checker's temporary placeholders, which another thread loading the same proto would see): work on a
        # private copy so that the caller's proto is never changed, even for a moment.
        model = onnx.ModelProto()
        model.CopyFrom(path_or_bytes)
        return model, None
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
        if not opsets:
            raise InvalidModelError("the model imports no opset; re-export it")
        return opsets  # only other domains (ai.onnx.ml, preview training...): each node is checked for its own
    if not 1 <= default <= MAX_OPSET:
        raise UnsupportedOpError(
            f"the model uses ai.onnx opset {default}; ortgpu supports opsets {MIN_OPSET}..{MAX_OPSET} (and older "
            "ones for operators unchanged since): convert it with onnx.version_converter"
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
            raise InvalidModelError(
                f"node {name!r} ({proto.op_type}) uses domain {domain!r}, which the model does not import"
            )
        opset = opsets[domain]
        text = f"{proto.op_type} node {name!r} (opset {opset})"
        try:
            opset = _effective_opset(proto.op_type, domain, opset)
        except UnsupportedOpError as error:
            raise UnsupportedOpError(f"{text}: {error}") from None
        # Control flow: the outer-scope names its subgraphs read become trailing extra inputs (ortgpu.loader._subgraph).
        extras = outer_names(proto) if is_control_flow(proto.op_type, domain) else ()
        attrs: dict[str, Any] = {
            a.name: _attribute_value(a, text, proto.op_type, domain, opsets, extras) for a in proto.attribute
        }
        attrs["__proto_attributes__"] = tuple(proto.attribute)
        inputs = tuple(proto.input) + extras
        nodes.append(GraphNode(name, proto.op_type, domain, inputs, tuple(proto.output), attrs, opset))
    return _topological(nodes, graph)


def _topological(nodes: list[GraphNode], graph: onnx.GraphProto) -> list[GraphNode]:
    """The nodes in an order where each follows the producers of its inputs (the given order when it already is
    one: onnx's checker requires that, but is skipped for models over 2 GB).  Linear time."""
    available = {v.name for v in graph.input} | {t.name for t in graph.initializer} | {""}
    available.update(s.values.name for s in graph.sparse_initializer)
    produced = {name for node in nodes for name in node.outputs}
    missing: dict[int, int] = {}  # node index -> how many distinct produced inputs it still waits for
    waiting: dict[str, list[int]] = {}
    ordered: list[GraphNode] = []
    ready: list[int] = []

    def emit(index: int) -> None:
        ready.append(index)
        while ready:
            node = nodes[ready.pop()]
            ordered.append(node)
            for name in node.outputs:
                if name in available:
                    continue
                available.add(name)
                for waiter in waiting.pop(name, ()):
                    missing[waiter] -= 1
                    if missing[waiter] == 0:
                        ready.append(waiter)

    for index, node in enumerate(nodes):
        wanted = {name for name in node.inputs if name not in available and name in produced}
        missing[index] = len(wanted)
        for name in wanted:
            waiting.setdefault(name, []).append(index)
        if not wanted:
            emit(index)
    if len(ordered) != len(nodes):
        emitted = {id(node) for node in ordered}
        stuck = next(node for node in nodes if id(node) not in emitted)
        raise InvalidModelError(
            f"the graph has a cycle through node {stuck.name!r} ({stuck.op_type}); the model is corrupt"
        )
    for node in ordered:
        for name in node.inputs:
            if name and name not in available:
                raise InvalidModelError(f"node {node.name!r} ({node.op_type}) reads {name!r}, which nothing produces")
    return ordered


def _value_info(value: onnx.ValueInfoProto, what: str) -> ValueInfo:
    if what == "graph output" and not _has_type(value):
        # Loader tolerance (as onnxruntime): an output without a type takes the one shape inference gives it.
        return ValueInfo(value.name, (), np.dtype(np.float32), typed=False, ranked=False)
    if value.type.HasField("sequence_type"):
        # A sequence of tensors: a host value (see ortgpu.ops.ai_onnx.sequences); its element dtype is recorded, the
        # element shapes come with each run's value.
        element = value.type.sequence_type.elem_type
        if not element.HasField("tensor_type") or element.tensor_type.elem_type == 0:
            raise UnsupportedOpError(
                f"{what} {value.name!r} is a sequence of {element.WhichOneof('value') or 'untyped values'}; ortgpu "
                "supports sequences of typed tensors only"
            )
        elem_dtype = onnx_dtype_to_numpy(element.tensor_type.elem_type, f"{what} {value.name!r}")
        return ValueInfo(value.name, (), sequence_dtype(np.dtype(elem_dtype)))
    if value.type.HasField("optional_type"):
        # An optional tensor or sequence: a host value (see ortgpu.ops.ai_onnx.optional); whether it holds an element, and
        # the element's shapes, come with each run's value.
        held_type = value.type.optional_type.elem_type
        held = element_type_of_proto(held_type, f"{what} {value.name!r}")
        declared: tuple[int | None, ...] | None = None
        if held_type.HasField("tensor_type") and held_type.tensor_type.HasField("shape"):
            # A declared element shape (None: a dynamic dim), checked against each run's tensor.
            declared = tuple(
                int(d.dim_value) if d.HasField("dim_value") and d.dim_value >= 0 else None
                for d in held_type.tensor_type.shape.dim
            )
        return ValueInfo(value.name, (), optional_dtype(held, None, declared))
    if not value.type.HasField("tensor_type"):
        raise UnsupportedOpError(f"{what} {value.name!r} is not a tensor (maps are not supported)")
    dtype = onnx_dtype_to_numpy(value.type.tensor_type.elem_type, f"{what} {value.name!r}")
    dims: list[Dim] = []
    if not value.type.tensor_type.HasField("shape"):
        return ValueInfo(value.name, (), dtype, ranked=False)  # any rank: inference may tell
    if value.type.tensor_type.HasField("shape"):
        for index, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value >= 0:
                dims.append(int(dim.dim_value))
            elif dim.HasField("dim_value"):
                # Old exporters wrote -1 for "any size": a symbol of its own (it constrains nothing else).
                dims.append(f"{value.name}?{index}")
            elif dim.HasField("dim_param"):
                dims.append(dim.dim_param)
            else:
                dims.append(None)
    return ValueInfo(value.name, tuple(dims), dtype)


def _has_type(value: onnx.ValueInfoProto) -> bool:
    """Whether ``value`` declares a type (a tensor's element type counts only when set)."""
    kind = value.type.WhichOneof("value")
    return kind is not None and not (kind == "tensor_type" and value.type.tensor_type.elem_type == 0)


class _OutputsFilledForChecker:
    """Within the block, graph outputs without a type or shape carry a placeholder (float, unknown rank) so that
    onnx's checker, which requires both, checks the rest of the model; onnxruntime accepts such outputs and so
    does ortgpu (their types and shapes come from inference).  The placeholders are removed on exit (the proto is
    the loader's private copy, see ``_parse``)."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self._graph = graph
        self._typed: list[onnx.ValueInfoProto] = []
        self._shaped: list[onnx.ValueInfoProto] = []

    def __enter__(self) -> None:
        for value in self._graph.output:
            if not _has_type(value):
                value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
                self._typed.append(value)
            if value.type.HasField("tensor_type") and not value.type.tensor_type.HasField("shape"):
                value.type.tensor_type.shape.SetInParent()
                self._shaped.append(value)

    def __exit__(self, *exc: object) -> None:
        for value in self._shaped:
            value.type.tensor_type.ClearField("shape")
        for value in self._typed:
            value.ClearField("type")


class _ContributedNodesHiddenFromChecker:
    """Within the block, the top graph's default-domain nodes of operators that onnx does not define at the model's
    opset but ortgpu implements there sit in a private domain, which onnx's checker leaves alone.  onnxruntime
    registers some of its contributed operators in the default domain (``SimplifiedLayerNormalization``, and
    ``LayerNormalization`` before opset 17: its transformer optimizer writes both) and loads such models; onnx's checker
    refuses them.  The nodes and the opset imports are restored on exit."""

    _DOMAIN = "ortgpu.checker.contributed"

    def __init__(self, model: onnx.ModelProto, opset: int) -> None:
        self._model = model
        self._opset = opset
        self._moved: list[tuple[onnx.NodeProto, str]] = []

    def __enter__(self) -> None:
        for node in self._model.graph.node:
            if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type, self._opset, ""):
                try:
                    get_operator(node.op_type, self._opset, "")
                except UnsupportedOpError:
                    continue  # refused below with the reason
                self._moved.append((node, node.domain))
        if self._moved:
            for node, _ in self._moved:
                node.domain = self._DOMAIN
            self._model.opset_import.append(onnx.helper.make_opsetid(self._DOMAIN, 1))

    def __exit__(self, *exc: object) -> None:
        if self._moved:
            del self._model.opset_import[-1]
            for node, domain in self._moved:
                node.domain = domain


def _check_supported(nodes: Sequence[GraphNode]) -> None:
    problems = []
    for node in nodes:
        try:
            get_operator(node.op_type, node.opset, node.domain)
        except UnsupportedOpError as error:
            problems.append(f"{node.describe()}: {error}")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise UnsupportedOpError(
            "the model uses operators ortgpu does not implement: " + "; ".join(problems[:5]) + more
        )


def _list_initializers_as_inputs(graph: onnx.GraphProto) -> None:
    listed = {v.name for v in graph.input}
    for tensor in graph.initializer:
        if tensor.name not in listed:
            graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))


def _apply_overrides(
    model: onnx.ModelProto,
    initializers: Mapping[str, np.ndarray],
    free_dims: Mapping[str, int],
    free_denotations: Mapping[str, int] | None = None,
) -> None:
    """Replace initializers and fix symbolic input dimensions (SessionOptions' overrides), before checking."""
    if initializers:
        present = {t.name: i for i, t in enumerate(model.graph.initializer)}
        unknown = sorted(set(initializers) - set(present))
        if unknown:
            raise InvalidModelError(
                f"initializer overrides {unknown} name no initializer of the model; its initializers are "
                f"{sorted(present)[:20]}"
            )
        for name, array in initializers.items():
            old = model.graph.initializer[present[name]]
            new = onnx.numpy_helper.from_array(np.asarray(array), name)
            if new.data_type != old.data_type or list(new.dims) != list(old.dims):
                raise InvalidModelError(
                    f"initializer override {name!r} has type {new.data_type} and shape {list(new.dims)}; the model's "
                    f"has type {old.data_type} and shape {list(old.dims)}"
                )
            old.CopyFrom(new)
    denotations = free_denotations or {}
    for value in model.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_value"):
                continue
            if dim.HasField("dim_param") and dim.dim_param in free_dims:
                dim.dim_value = int(free_dims[dim.dim_param])
            elif dim.denotation and dim.denotation in denotations:
                dim.dim_value = int(denotations[dim.denotation])


def load_model(
    path_or_bytes: str | os.PathLike[str] | bytes | onnx.ModelProto,
    *,
    max_fold_bytes: int | None = None,
    max_nodes: int | None = None,
    initializer_overrides: Mapping[str, np.ndarray] | None = None,
    free_dimension_overrides: Mapping[str, int] | None = None,
    free_denotation_overrides: Mapping[str, int] | None = None,
    overridable_as_inputs: bool = False,
) -> LoadedModel:
    """Load, check and pre-process an ONNX model.

    ``initializer_overrides`` (name -> array) replace the model's initializers of those names (onnxruntime's
    ``SessionOptions.add_initializer`` / ``add_external_initializers``); ``free_dimension_overrides`` (dim_param ->
    size) fix the graph inputs' symbolic dimensions of those names (``add_free_dimension_override_by_name``).
    ``overridable_as_inputs``: initializers also listed as graph inputs (IR >= 4, onnxruntime's overridable
    initializers) are loaded as plain graph inputs, not constants, so that a run can feed them (LoRA adapters).

    Raises :class:`InvalidModelError` for malformed files (truncated,
    failing onnx's checker, external data outside the model's folder) and
    :class:`UnsupportedOpError` for opsets, operators or dtypes ortgpu lacks.

    ``max_nodes``: a model with more nodes is a :class:`ModelError`.  ``max_fold_bytes``: the most bytes of
    constants that constant folding creates for this model (at load and in each plan together); once spent,
    larger foldable nodes stay and run.  When not given: the environment variables ``ORTGPU_MAX_NODES`` and
    ``ORTGPU_MAX_FOLD_BYTES``, else :data:`ortgpu.loader._limits.DEFAULT_MAX_NODES` (100000) and
    :data:`~ortgpu.loader._limits.DEFAULT_MAX_FOLD_BYTES` (256 MiB).
    """
    limits = LoadLimits.resolve(max_fold_bytes=max_fold_bytes, max_nodes=max_nodes)
    model, model_dir = _parse(path_or_bytes)
    check_node_count(count_nodes(model.graph), limits)  # subgraph nodes count too
    opsets = _check_versions(model)
    # Before external data: an override may replace an initializer whose data file is not there (onnxruntime's
    # add_external_initializers).
    _apply_overrides(
        model, initializer_overrides or {}, free_dimension_overrides or {}, free_denotation_overrides or {}
    )
    if _check_external_data(model, model_dir):
        assert model_dir is not None
        try:
            external_data_helper.load_external_data_for_model(model, model_dir)
        except Exception as error:  # noqa: BLE001
            raise InvalidModelError(f"cannot read the model's external data: {error}") from error
    if model.ir_version < 4:
        # IR 3 requires every initializer to be a graph input too; onnxruntime loads such models anyway, reading an
        # initializer that is not listed as a constant.  List the missing ones so onnx's checker accepts the model:
        # they are constants either way (inputs below leave initializers out).
        _list_initializers_as_inputs(model.graph)
    try:
        with _OutputsFilledForChecker(model.graph), _ContributedNodesHiddenFromChecker(model, opsets.get("", 0)):
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
        onnx_dtype_to_numpy(tensor.data_type, f"initializer {tensor.name!r}", constant=True)
        initializers[tensor.name] = _to_array(tensor, f"initializer {tensor.name!r}")
    for sparse in graph.sparse_initializer:
        name = sparse.values.name
        onnx_dtype_to_numpy(sparse.values.data_type, f"sparse initializer {name!r}", constant=True)
        initializers[name] = _sparse_to_array(sparse, f"sparse initializer {name!r}")
    if overridable_as_inputs and model.ir_version >= 4:
        for value in graph.input:
            initializers.pop(value.name, None)
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
        metadata={
            "producer_name": model.producer_name,
            "graph_name": graph.name,
            "domain": model.domain,
            "description": model.doc_string,
            "graph_description": graph.doc_string,
            "version": int(model.model_version),
            "custom_metadata_map": {p.key: p.value for p in model.metadata_props},
        },
        folded_nodes=folded,
        limits=limits,
        folded_bytes=budget.spent,
        value_dependent_inputs=value_dependent_inputs(remaining, [v.name for v in inputs]),
    )


def _refine_output(value: ValueInfo, types: Mapping[str, tuple[Shape, np.dtype[Any]]]) -> ValueInfo:
    if value.name not in types:
        if not value.typed:
            raise InvalidModelError(
                f"graph output {value.name!r} has no type and none can be inferred; give it a type in the model"
            )
        return value
    if is_structured_dtype(value.dtype):
        return value  # a sequence or an optional: its element shapes come with each run
    shape, inferred_dtype = types[value.name]
    if not value.typed:
        value = ValueInfo(value.name, value.shape, inferred_dtype, ranked=value.ranked)
    if not value.ranked or (not value.shape and shape):
        return ValueInfo(value.name, shape, value.dtype)
    if len(shape) == len(value.shape):
        merged = tuple(d if isinstance(d, int) or i is None else i for d, i in zip(value.shape, shape))
        merged = tuple(i if isinstance(i, int) and not isinstance(d, int) else d for d, i in zip(merged, shape))
        return ValueInfo(value.name, merged, value.dtype)
    return value
