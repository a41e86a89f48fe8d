"""Planning a loaded model for concrete input shapes.

:func:`plan_model` turns a :class:`~ortgpu.loader._model.LoadedModel` and one input
shape signature into an :class:`~ortgpu._plan_types.ExecutionPlan`: every
tensor's shape (folding what the shapes make constant), a check of every
tensor against the device's limits before anything is allocated, one
:class:`~ortgpu.ops.OpPlan` per step (or CPU placement), and the memory plan.
This module orchestrates; the jobs live in their own modules:

* :mod:`ortgpu._plan_types`: the plan's records (:class:`ExecutionPlan`, :class:`PlannedStep`, :class:`PlannedTensor`);
* :mod:`ortgpu._rewrites`: the graph rewrites applied when fusing (BatchNormalization folded into Conv, fused
  epilogues, GELU, folded Transposes); :mod:`ortgpu._attention_fusion`: attention as one flash kernel;
  :mod:`ortgpu._norm_fusion`: RMSNorm and LayerNorm as one row kernel; :mod:`ortgpu._elementwise_fusion`: connected
  elementwise steps as one kernel; :mod:`ortgpu._sibling_projections`: projections of one input as one product;
  :mod:`ortgpu._output_transposes`: a Transpose after a MatMul folded into its store;
* :mod:`ortgpu._memory_plan`: where each tensor lives, and buffer slots shared by liveness.

The plan is device-independent apart from the :class:`DeviceCaps` it was made
for; :class:`~ortgpu._executor.DeviceProgram` instantiates it on a device.
Callers cache plans per input-shape signature.
"""

from __future__ import annotations

from typing import Any, Hashable, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import DtypeError, ModelError, ShapeError, UnsupportedOpError

from ._attention_fusion import fuse_attentions
from ._elementwise_fusion import fuse_elementwise
from ._four_bit import widen_four_bit_constants
from ._host_values import (
    OPTIONAL_REASON,
    SEQUENCE_REASON,
    element_dtype_of,
    element_shapes_of,
    is_optional_dtype,
    is_sequence_dtype,
    optional_element_dtype,
    optional_present,
    optional_type_name,
    sequence_dtype,
    value_dtype_matches,
)
from ._input_transposes import fold_input_transposes
from ._memory_plan import plan_memory, uploaded_constants
from ._norm_fusion import fuse_norms
from ._output_transposes import fold_output_transposes
from ._plan_types import ExecutionPlan, Placement, PlacementRow, PlannedStep, PlannedTensor, constant_digest
from ._rewrites import (
    FUSABLE_PRODUCERS,
    FoldContext,
    RewriteContext,
    fold_batch_norms,
    fold_transposes,
    foldable_transposes,
    fuse_epilogue,
    plan_node,
)
from ._sibling_projections import merge_sibling_projections
from ._softmax_casts import fold_softmax_casts
from .loader._expand_control_flow import Expansion
from .loader._limits import FoldBudget
from .loader._model import GraphNode, LoadedModel
from .loader._propagate import Shape, is_concrete, propagate, public_attrs
from .ops import DeviceCaps, TensorInfo, get_operator
from .ops._runner import padded_size

__all__ = [
    "Placement",
    "PlannedStep",
    "PlannedTensor",
    "ExecutionPlan",
    "plan_model",
    "FUSABLE_PRODUCERS",
    "HOST_REASON",
]

#: Why a node that reads or writes a string tensor runs on the CPU.
HOST_REASON = "string tensors live on the host"


def _is_host(info: TensorInfo | None) -> bool:
    """Whether a tensor lives on the host only: strings (numpy object arrays) never go to the device."""
    return info is not None and info.dtype == object


def _tensor_info(name: str, types: Mapping[str, tuple[Shape, np.dtype[Any]]], node: GraphNode | None) -> TensorInfo:
    if name not in types:
        where = f" ({node.describe()})" if node is not None else ""
        raise ModelError(f"cannot infer the type of tensor {name!r}{where}")
    shape, dtype = types[name]
    if not is_concrete(shape):
        where = f" produced by {node.describe()}" if node is not None else ""
        raise ModelError(f"cannot infer a concrete shape for tensor {name!r}{where}: got {shape}")
    if any(d < 0 for d in shape if isinstance(d, int)):
        where = f" produced by {node.describe()}" if node is not None else ""
        raise ShapeError(f"tensor {name!r}{where} has a negative dimension in its shape {shape}; the model is invalid")
    return TensorInfo(tuple(int(d) for d in shape if isinstance(d, int)), dtype)


def _check_size(name: str, info: TensorInfo, caps: DeviceCaps, what: str) -> None:
    if _is_host(info):
        return  # never on the device
    limits = caps.limits
    for limit_name, limit in (
        ("max_buffer_size", limits.max_buffer_size),
        ("max_storage_buffer_binding_size", limits.max_storage_buffer_binding_size),
    ):
        if padded_size(info.nbytes) > limit:
            raise ShapeError(
                f"tensor {name!r} ({what}) has shape {info.shape} and dtype {info.dtype.name}: "
                f"{info.nbytes} bytes exceed the device's {limit_name} ({limit}); "
                "use smaller input shapes (batch, sequence length, image size) or a device with larger limits"
            )


def _input_infos(
    model: LoadedModel, input_shapes: Mapping[str, Sequence[int]], input_dtypes: Mapping[str, Any] | None
) -> dict[str, TensorInfo]:
    infos = {}
    for value in model.inputs:
        if value.name not in input_shapes:
            raise ModelError(f"no shape given for model input {value.name!r} (expected shape {value.shape})")
        shape = tuple(int(d) for d in input_shapes[value.name])
        if any(d < 0 for d in shape):
            raise ShapeError(f"input {value.name!r}: negative dimension in shape {shape}")
        if value.shape and len(value.shape) != len(shape):
            raise ShapeError(f"input {value.name!r} has rank {len(value.shape)} {value.shape}; got shape {shape}")
        for declared, given in zip(value.shape, shape):
            if isinstance(declared, int) and declared != given:
                raise ShapeError(f"input {value.name!r} expects shape {value.shape}; got {shape}")
        dtype = value.dtype
        if input_dtypes is not None and value.name in input_dtypes:
            given_dtype = np.dtype(input_dtypes[value.name])
            if given_dtype != dtype:
                raise DtypeError(f"input {value.name!r} expects dtype {dtype.name}; got {given_dtype.name}")
            if is_sequence_dtype(dtype):
                # A sequence input: the given dtype carries this run's element shapes (the plan is for them).
                if not is_sequence_dtype(given_dtype) or element_shapes_of(given_dtype) is None:
                    raise ModelError(f"input {value.name!r} is a sequence: plan it with its element shapes")
                if element_dtype_of(given_dtype) not in (None, element_dtype_of(dtype)):
                    raise DtypeError(
                        f"input {value.name!r} is a sequence of {element_dtype_of(dtype)}; got elements of "
                        f"{element_dtype_of(given_dtype)}"
                    )
                dtype = sequence_dtype(element_dtype_of(dtype), element_shapes_of(given_dtype))
            elif is_optional_dtype(dtype):
                # An optional input: the given dtype carries this run's state (empty or present, element shapes).
                if not is_optional_dtype(given_dtype) or optional_present(given_dtype)[0] is None:
                    raise ModelError(f"input {value.name!r} is an optional: plan it with its value's state")
                if optional_present(given_dtype)[0] and not value_dtype_matches(
                    optional_element_dtype(dtype), optional_element_dtype(given_dtype)
                ):
                    raise DtypeError(
                        f"input {value.name!r} is an {optional_type_name(dtype)}; got an "
                        f"{optional_type_name(given_dtype)}"
                    )
                dtype = given_dtype
        infos[value.name] = TensorInfo(shape, dtype)
    unknown = set(input_shapes) - {v.name for v in model.inputs}
    if unknown:
        raise ModelError(f"unknown model input(s) {sorted(unknown)}; the model's inputs are {model.input_names}")
    return infos


def _constant_key(name: str, value: np.ndarray, model: LoadedModel, digests: Mapping[str, str]) -> Hashable:
    """An initializer's name, or a computed constant's name, dtype, shape and digest (``digests``: those a rewrite
    computed once and keeps, so a new plan does not hash them again)."""
    if name in model.initializers and model.initializers[name] is value:
        return ("initializer", name)
    digest = digests.get(name) or constant_digest(value)
    return ("folded", name, value.dtype.str, value.shape, digest)


# ---------------------------------------------------------------------------


def _plan(
    model: LoadedModel,
    caps: DeviceCaps,
    input_infos: dict[str, TensorInfo],
    input_values: Mapping[str, np.ndarray],
    allow_cpu: bool,
    fuse: bool,
) -> ExecutionPlan:
    types: dict[str, tuple[Shape, np.dtype[Any]]] = {}
    for name, (shape, dtype) in model.types.items():
        if name in model.constants:
            types[name] = (shape, dtype)
    for name, info in input_infos.items():
        types[name] = (info.shape, info.dtype)
    constants = dict(model.constants)
    for name, info in input_infos.items():  # before folding: nothing is computed for inputs that cannot fit
        _check_size(name, info, caps, "model input")
    for name in model.value_dependent_inputs:
        if name not in input_values:
            raise ModelError(
                f"the shapes of this model depend on the value of input {name!r} (it feeds a shape, axes or "
                "bounds input); pass its value to plan for it"
            )
        value = np.asarray(np.asarray(input_values[name], dtype=input_infos[name].dtype), order="C")
        if value.shape != input_infos[name].shape:
            raise ShapeError(f"the value of input {name!r} has shape {value.shape}, not {input_infos[name].shape}")
        constants[name] = value
    output_names = model.output_names
    nodes, folded = list(model.nodes), list(model.folded_nodes)
    if fuse:
        fold = FoldContext(constants, types, frozenset(output_names), model.rewrite_cache)
        nodes, folded_norms = fold_batch_norms(nodes, fold)
        folded += folded_norms
    # Folding shares the model's budget with the load (what the load folded is still held).
    budget = FoldBudget(model.limits.max_fold_bytes, spent=model.folded_bytes)
    expansions: list[Expansion] = []
    nodes, folded_here = propagate(
        nodes, types, constants, model.opsets, concrete=True, budget=budget, expansions=expansions
    )
    folded += folded_here
    # 4-bit constants (kept as loaded so folding reads them exactly) in the layouts the kernels read.
    nodes = widen_four_bit_constants(nodes, types, constants, model.rewrite_cache)
    consumers: dict[str, list[GraphNode]] = {}
    for node in nodes:
        for name in node.inputs:
            if name:
                consumers.setdefault(name, []).append(node)
    for name in output_names:
        if name not in types and name not in input_infos:
            raise ModelError(f"graph output {name!r} is produced by no node")
    infos = _checked_infos(nodes, input_infos, output_names, types, constants, caps)
    digests: dict[str, str] = {}  # of the constants a rewrite computed and keeps
    ctx = RewriteContext(caps, types, constants, infos, consumers, set(output_names))
    steps = _plan_steps(ctx, nodes, allow_cpu, fuse)
    if fuse:
        steps = fold_output_transposes(steps, ctx)  # first: a product storing transposed reads nothing strided
        steps = fold_input_transposes(steps, ctx)
        steps = fuse_elementwise(steps, ctx.graph_outputs, caps, constants)
        steps = merge_sibling_projections(steps, caps, constants, infos, model.rewrite_cache, digests)
    memory = plan_memory(steps, input_infos, output_names, infos, constants, caps)
    used_constants, uploaded = uploaded_constants(memory, constants)
    uploaded = {name for name in uploaded if used_constants[name].dtype != object}  # strings stay on the host
    placement = _placement(memory.steps, expansions)
    return ExecutionPlan(
        caps=caps,
        input_infos=dict(input_infos),
        output_infos={name: memory.tensors[name].info for name in output_names},
        steps=memory.steps,
        tensors=memory.tensors,
        slot_sizes=memory.slot_sizes,
        constants=used_constants,
        constant_keys={name: _constant_key(name, used_constants[name], model, digests) for name in sorted(uploaded)},
        output_copies=memory.output_copies,
        placement=placement,
        folded_nodes=folded,
    )


def _placement(steps: Sequence[PlannedStep], expansions: Sequence[Expansion]) -> list[PlacementRow]:
    """Where each node runs: every step's nodes; a control-flow node the plan expanded, before its nodes (on the
    device when they all are); the nodes inside a control-flow node that runs whole, after it (on the CPU; their
    last field names that node)."""
    rows: list[PlacementRow] = []
    for step in steps:
        for node_name, op_type in zip(step.node_names, step.op_types):
            rows.append((node_name, op_type, str(step.placement), step.reason, ""))
            if step.placement == "cpu" and step.operator is not None and step.op_types == (op_type,):
                rows.extend(_subgraph_rows(node_name, op_type, step.attrs))
    for expansion in sorted(expansions, key=lambda e: -len(e.prefix)):  # nested ones first: outer rows go above
        mine = [index for index, row in enumerate(rows) if row[0].startswith(expansion.prefix)]
        if not mine:
            continue  # everything it ran was folded into constants
        where = "webgpu" if all(rows[index][2] == "webgpu" for index in mine) else "cpu"
        owner = expansion.owner
        reason = f"{expansion.how}; its nodes are listed as {expansion.prefix!r}..."
        rows.insert(mine[0], (owner.name, owner.op_type, where, reason, ""))
    return rows


def _subgraph_rows(owner: str, op_type: str, attrs: Mapping[str, Any], top: str = "") -> list[PlacementRow]:
    """Rows for the nodes of the subgraphs of a control-flow node that runs whole on the CPU (nested included);
    ``top``: the outermost such node (the one the plan runs whole)."""
    from .loader._subgraph import Subgraph

    top = top or owner
    rows: list[PlacementRow] = []
    for attribute, value in attrs.items():
        if not isinstance(value, Subgraph):
            continue
        part = attribute.removesuffix("_branch")
        for inner in value.nodes():
            name = f"{owner}/{part}/{inner.name}"
            reason = f"inside {op_type} node {owner!r} ({attribute}), which runs on the CPU"
            rows.append((name, inner.op_type, "cpu", reason, top))
            rows.extend(_subgraph_rows(name, inner.op_type, inner.attrs, top))
    return rows


def _checked_infos(
    nodes: Sequence[GraphNode],
    input_infos: Mapping[str, TensorInfo],
    output_names: Sequence[str],
    types: Mapping[str, tuple[Shape, np.dtype[Any]]],
    constants: Mapping[str, np.ndarray],
    caps: DeviceCaps,
) -> dict[str, TensorInfo]:
    """Every tensor's info, checked against the device limits before anything is allocated."""
    infos: dict[str, TensorInfo] = dict(input_infos)
    for node in nodes:
        for index, name in enumerate(node.outputs):
            if name:
                info = _tensor_info(name, types, node)
                _check_size(name, info, caps, f"output {index} of {node.describe()}")
                infos[name] = info
    for name in output_names:
        if name in constants:
            infos[name] = TensorInfo(tuple(constants[name].shape), constants[name].dtype)
            _check_size(name, infos[name], caps, "constant graph output")
    for node in nodes:
        for name in node.inputs:
            if name and name in constants and name not in infos:
                info = TensorInfo(tuple(constants[name].shape), constants[name].dtype)
                _check_size(name, info, caps, f"constant input of {node.describe()}")
                infos[name] = info
    return infos


def _plan_steps(ctx: RewriteContext, nodes: Sequence[GraphNode], allow_cpu: bool, fuse: bool) -> list[PlannedStep]:
    """The steps, in order: each node alone, or (``fuse``) a fused group the rewrites of :mod:`ortgpu._rewrites` make."""
    steps: list[PlannedStep] = []
    absorbed = ctx.absorbed
    cpu_problems: list[str] = []
    # A fused step runs where its last node was: an epilogue's extra input (a residual) may be
    # produced after the producer node, never after the last node of the group.
    delayed: dict[str, PlannedStep] = {}
    delayed_groups: dict[str, list[PlannedStep]] = {}  # a pattern's steps, run in order at its last node
    # Transposes read only by a MatMul are folded into it (its loads follow the permuted strides); each one is
    # planned after all, at the MatMul, if the MatMul cannot take it.
    folds = foldable_transposes(ctx, nodes) if fuse else {}
    folded = {t.name for pending in folds.values() for t, _ in pending.values()}
    # Attention groups (Q.K^T, scale, mask, Softmax, .V) and RMSNorm/LayerNorm groups become one step at their last
    # node's place.
    patterns: dict[str, list[PlannedStep]] = {}
    if fuse:
        patterns = {**fuse_attentions(ctx, nodes, folds), **{k: [v] for k, v in fuse_norms(ctx, nodes).items()}}
    for last, group in patterns.items():
        for member in group:
            absorbed.update(member.node_names)
        delayed_groups[last] = group
    if fuse:  # then a float16 graph's Cast, Softmax, Cast outside them as one Softmax in float16
        for last, softmax_step in fold_softmax_casts(ctx, nodes).items():
            absorbed.update(softmax_step.node_names)
            delayed_groups[last] = [softmax_step]
    for node in nodes:
        if node.name in absorbed:
            if node.name in delayed:
                steps.append(delayed.pop(node.name))
            steps.extend(delayed_groups.pop(node.name, []))
            continue
        if node.name in folded:
            continue  # planned with (or, failing that, just before) the MatMul that reads it
        operator = get_operator(node.op_type, node.opset, node.domain)
        attrs = public_attrs(node.attrs)
        step = None
        if node.name in folds:
            transposes = folds[node.name]
            step = fold_transposes(ctx, node, transposes, operator, attrs)
            if step is None:  # the MatMul could not take them: the transposes run as their own steps
                for transpose, _ in transposes.values():
                    own = plan_node(
                        ctx,
                        transpose,
                        get_operator(transpose.op_type, transpose.opset, ""),
                        public_attrs(transpose.attrs),
                    )
                    if own.placement == "cpu":
                        cpu_problems.append(f"{transpose.describe()}: {own.reason}")
                    steps.append(own)
            elif len(step.node_names) > 1 + len(transposes):  # (MatMul, *transposes, *epilogue nodes)
                absorbed.update(step.node_names[1:])
                delayed[step.node_names[-1]] = step
                continue
            else:
                steps.append(step)
                continue
        if fuse and node.op_type in FUSABLE_PRODUCERS and node.domain == "":
            step = fuse_epilogue(ctx, node, operator, attrs)
            if step is not None:
                absorbed.update(step.node_names[1:])
                delayed[step.node_names[-1]] = step
                continue
        if step is None:
            step = _host_step(ctx, node, operator, attrs) or plan_node(ctx, node, operator, attrs)
        if step.placement == "cpu":
            cpu_problems.append(f"{node.describe()}: {step.reason}")
        steps.append(step)
    if cpu_problems and not allow_cpu:
        raise UnsupportedOpError(
            "these nodes cannot run on the WebGPU device (allow_cpu=False): " + "; ".join(cpu_problems)
        )
    return steps


def _host_step(ctx: RewriteContext, node: GraphNode, operator: Any, attrs: Mapping[str, Any]) -> PlannedStep | None:
    """The CPU step of a node that reads or writes a string tensor (those live on the host), else None.  The
    operator's ``plan`` is not asked: no kernel could bind such a tensor."""
    input_infos = ctx.infos_of(node.inputs)
    output_infos = tuple(ctx.infos[name] if name else TensorInfo((0,), np.dtype(np.float32)) for name in node.outputs)
    if not any(_is_host(info) for info in input_infos + output_infos):
        return None
    infos = [info for info in input_infos + output_infos if info is not None]
    sequences = any(is_sequence_dtype(info.dtype) for info in infos)
    optionals = any(is_optional_dtype(info.dtype) for info in infos)
    return PlannedStep(
        (node.name,),
        (node.op_type,),
        "cpu",
        OPTIONAL_REASON if optionals else SEQUENCE_REASON if sequences else HOST_REASON,
        operator,
        attrs,
        tuple(node.inputs),
        tuple(node.outputs),
        input_infos,
        output_infos,
        None,
    )


def plan_model(
    model: LoadedModel,
    input_shapes: Mapping[str, Sequence[int]],
    caps: DeviceCaps,
    *,
    input_dtypes: Mapping[str, Any] | None = None,
    input_values: Mapping[str, np.ndarray] | None = None,
    allow_cpu: bool = True,
    fuse: bool = True,
) -> ExecutionPlan:
    """Plan ``model`` for the given input shapes on a device with ``caps``.

    Raises :class:`ShapeError` when a tensor would not fit the device (before
    any allocation), :class:`UnsupportedOpError` naming the nodes that must
    run on the CPU when ``allow_cpu`` is false, :class:`ModelError` when a
    shape cannot be inferred.  ``input_values`` gives the values of
    ``model.value_dependent_inputs`` (required for those): the plan is valid
    only for those values, so callers key their plan cache by them too.
    ``fuse``: apply the graph rewrites of :mod:`ortgpu._rewrites` (BatchNormalization folded into Conv, fused
    epilogues, folded Transposes); False plans every node as its own step.
    """
    input_infos = _input_infos(model, input_shapes, input_dtypes)
    return _plan(model, caps, input_infos, input_values or {}, allow_cpu, fuse)
