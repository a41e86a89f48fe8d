"""The graph rewrites the planner applies when it fuses (``plan_model(..., fuse=True)``).

Each rewrite is a function over an explicit context, never over planner state:

* :func:`fold_batch_norms` (a :class:`FoldContext`, before shape propagation): inference BatchNormalization
  folded into the Conv that feeds it (the Conv's weights and bias scaled per channel).
* :func:`fuse_epilogue` (a :class:`RewriteContext`, like the rest): the elementwise nodes after a MatMul, Gemm
  or Conv (bias or residual Add, Relu, Clip, Sigmoid, scalar Mul/Div, Gelu) ride on it as its fused epilogue
  (``attrs["_epilogue"]``); :func:`match_gelu` recognises the erf GELU exporters write as six nodes.
* :func:`foldable_transposes` and :func:`fold_transposes`: a Transpose read only by a MatMul is folded into it
  (``attrs["_input_perms"]``: the MatMul's loads follow the permuted strides).

:func:`plan_node` plans one node as it is, the step a rewrite falls back to.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Hashable, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from ._plan_types import Placement, PlannedStep
from .loader._model import GraphNode
from .loader._propagate import Shape
from .ops import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .ops.ai_onnx.transpose import permutation

__all__ = [
    "step_readers",
    "FUSABLE_PRODUCERS",
    "FoldContext",
    "RewriteContext",
    "fold_batch_norms",
    "fold_transposes",
    "foldable_transposes",
    "fuse_epilogue",
    "match_gelu",
    "plan_node",
]

#: Operators that accept a fused elementwise epilogue (``attrs["_epilogue"]``).
FUSABLE_PRODUCERS = frozenset({"MatMul", "Gemm", "Conv"})
#: Inputs of each fusable op before its epilogue's extra inputs (absent optional ones padded with "").
_ARITY = {"MatMul": 2, "Gemm": 3, "Conv": 3}
_EPILOGUE_UNARY = {"Relu": ("relu",), "Gelu": ("gelu",), "Sigmoid": ("sigmoid",)}

#: Transposes to fold: MatMul node name -> {input index: (the Transpose feeding it, its perm)}.
TransposeFolds = dict[str, dict[int, tuple[GraphNode, tuple[int, ...]]]]


@dataclass
class FoldContext:
    """What a rewrite before shape propagation reads and extends.

    ``constants`` and ``types`` gain the tensors the rewrite computes; ``graph_outputs`` are never rewritten
    away; ``cache`` keeps computed tensors for the next plan of the same model (the model's
    :attr:`~ortgpu.loader._model.LoadedModel.rewrite_cache`), so plans for other input shapes share them.
    """

    constants: dict[str, np.ndarray]
    types: dict[str, tuple[Shape, np.dtype[Any]]]
    graph_outputs: frozenset[str]
    cache: dict[Hashable, Any] = field(default_factory=dict)


@dataclass
class RewriteContext:
    """What the step rewrites read: the device, every tensor's (concrete) type and info, the constants' values,
    each tensor's consuming nodes and the graph outputs.  ``absorbed`` is the one thing they share as they go:
    the nodes already taken into a fused step (the planner adds to it)."""

    caps: DeviceCaps
    types: Mapping[str, tuple[Shape, np.dtype[Any]]]
    constants: Mapping[str, np.ndarray]
    infos: Mapping[str, TensorInfo]
    consumers: Mapping[str, list[GraphNode]]
    graph_outputs: set[str]
    absorbed: set[str] = field(default_factory=set)

    def infos_of(self, names: Sequence[str]) -> tuple[TensorInfo | None, ...]:
        return tuple(self.infos[name] if name else None for name in names)

    def constants_of(self, names: Sequence[str]) -> dict[int, np.ndarray]:
        return {i: self.constants[name] for i, name in enumerate(names) if name and name in self.constants}


# ---------------------------------------------------------------------------
# one node, as it is


def step_readers(steps: Sequence[PlannedStep]) -> dict[str, list[int]]:
    """Each tensor the planned ``steps`` read -> the indices of the steps reading it (once each, in order)."""
    readers: dict[str, list[int]] = {}
    for index, step in enumerate(steps):
        for name in set(step.inputs):
            if name:
                readers.setdefault(name, []).append(index)
    return readers


def plan_node(ctx: RewriteContext, node: GraphNode, operator: Operator, attrs: Mapping[str, Any]) -> PlannedStep:
    """The step running ``node`` alone: its operator's kernels, or the CPU when the operator says NotOnDevice."""
    input_infos = ctx.infos_of(node.inputs)
    output_infos = tuple(ctx.infos[name] if name else TensorInfo((0,), np.dtype(np.float32)) for name in node.outputs)
    try:
        op_plan: OpPlan | None = operator.plan(
            input_infos, output_infos, attrs, ctx.caps, ctx.constants_of(node.inputs)
        )
        placement: Placement = "webgpu"
        reason = "WGSL kernel" if op_plan is not None and op_plan.kernels else "no kernel needed (alias or empty)"
    except NotOnDevice as why:
        op_plan = None
        placement = "cpu"
        reason = str(why) or "no WebGPU kernel"
    return PlannedStep(
        (node.name,),
        (node.op_type,),
        placement,
        reason,
        operator,
        attrs,
        tuple(node.inputs),
        tuple(node.outputs),
        input_infos,
        output_infos,
        op_plan,
    )


def plan_group(
    ctx: RewriteContext,
    group: Sequence[GraphNode],
    operator: Operator,
    attrs: Mapping[str, Any],
    inputs: tuple[str, ...],
    outputs: tuple[str, ...],
    reason: str,
) -> PlannedStep | None:
    """The step running the nodes of ``group`` as one ``operator`` from ``inputs`` to ``outputs``, or None where the
    operator says NotOnDevice (the caller then plans the nodes as they are)."""
    input_infos = ctx.infos_of(inputs)
    output_infos = tuple(ctx.infos[name] for name in outputs)
    try:
        op_plan = operator.plan(input_infos, output_infos, attrs, ctx.caps, ctx.constants_of(inputs))
    except NotOnDevice:
        return None
    return PlannedStep(
        tuple(node.name for node in group),
        tuple(node.op_type for node in group),
        "webgpu",
        reason,
        operator,
        attrs,
        inputs,
        outputs,
        input_infos,
        output_infos,
        op_plan,
    )


# ---------------------------------------------------------------------------
# BatchNormalization into Conv


def fold_batch_norms(nodes: Sequence[GraphNode], ctx: FoldContext) -> tuple[list[GraphNode], list[str]]:
    """Fold inference BatchNormalization into the Conv that feeds it (weights scaled per channel).

    Applies when the Conv's weight (and bias) and the BatchNormalization's
    parameters are float32 constants (or a float16 weight and bias, whose Conv computes in float16, with float16 or
    float32 parameters) and the Conv's output feeds only the BatchNormalization.  Returns the new node list and the
    names of the removed nodes.
    """
    constants, types = ctx.constants, ctx.types
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
        if consumers.get(x_name, 0) != 1 or x_name in ctx.graph_outputs:
            continue
        params = [constants.get(name) for name in node.inputs[1:]]
        weight = constants.get(conv.inputs[1]) if len(conv.inputs) > 1 else None
        bias_name = conv.inputs[2] if len(conv.inputs) > 2 else ""
        bias = constants.get(bias_name) if bias_name else None
        if weight is None or any(p is None for p in params) or (bias_name and bias is None):
            continue
        half = weight.dtype == np.float16 and (bias is None or bias.dtype == np.float16)
        # float32 folds float32 parameters only; a float16 Conv may have float32 ones too (BatchNormalization-15's
        # T1/T2): the fold computes in float64 and stores the Conv's own float16 either way
        accepted = (np.float16, np.float32) if half else (np.float32,)
        if (weight.dtype != np.float32 and not half) or any(p is not None and p.dtype not in accepted for p in params):
            continue
        folded = _folded_conv_bn(node, weight, bias, params, ctx.cache)
        if folded is None:
            continue
        new_weight, new_bias = folded
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


def _folded_conv_bn(
    node: GraphNode,
    weight: np.ndarray,
    bias: np.ndarray | None,
    params: Sequence[np.ndarray | None],
    cache: dict[Hashable, Any],
) -> tuple[np.ndarray, np.ndarray] | None:
    """The Conv weight and bias with BatchNormalization ``node`` (parameters ``params``) folded in, or None when
    the parameters are not one value per output channel, or when a float16 fold would overflow (the unfolded nodes
    may not).  Computed in float64 and stored in the weight's dtype (float32, or float16 for a float16 Conv).  Kept
    in ``cache`` while its sources are the same arrays."""
    sources = (weight, bias, *params)
    key = ("batch_norm_fold", node.name)
    cached = cache.get(key)
    if cached is not None and len(cached[0]) == len(sources) and all(a is b for a, b in zip(cached[0], sources)):
        return cached[1]  # type: ignore[no-any-return]
    scale, beta, mean, var = (np.asarray(p, dtype=np.float64).reshape(-1) for p in params if p is not None)
    channels = weight.shape[0]
    if not all(v.shape == (channels,) for v in (scale, beta, mean, var)):
        return None
    factor = scale / np.sqrt(var + float(node.attrs.get("epsilon", 1e-5)))
    conv_bias = np.zeros(channels) if bias is None else np.asarray(bias, dtype=np.float64).reshape(-1)
    wide_weight = weight.astype(np.float64) * factor.reshape((-1,) + (1,) * (weight.ndim - 1))
    wide_bias = (conv_bias - mean) * factor + beta
    if weight.dtype == np.float16 and not all(np.abs(a).max(initial=0.0) <= 65504.0 for a in (wide_weight, wide_bias)):
        return None
    new_weight, new_bias = wide_weight.astype(weight.dtype), wide_bias.astype(weight.dtype)
    cache[key] = (sources, (new_weight, new_bias))
    return new_weight, new_bias


def _fresh_name(base: str, taken: Mapping[str, object]) -> str:
    name, index = base, 0
    while name in taken:
        index += 1
        name = f"{base}_{index}"
    return name


# ---------------------------------------------------------------------------
# fused epilogues


def epilogue_step(
    node: GraphNode,
    produced: str,
    types: Mapping[str, tuple[Shape, np.dtype[Any]]],
    constants: Mapping[str, np.ndarray],
    output_shape: tuple[int, ...],
    extra_index: int,
) -> tuple[tuple[Any, ...], str | None] | None:
    """The epilogue step for ``node`` applied to ``produced``, and the extra input it needs, or None."""
    if node.domain != "":
        return None
    if node.op_type in _EPILOGUE_UNARY:
        if node.op_type == "Gelu" and str(node.attrs.get("approximate", "none")) != "none":
            return None
        return _EPILOGUE_UNARY[node.op_type], None
    if node.op_type == "Clip":
        if node.opset < 11:
            lo = float(node.attrs.get("min", -np.inf))
            hi = float(node.attrs.get("max", np.inf))
        else:
            bounds: list[float] = []
            for position, default in ((1, -np.inf), (2, np.inf)):
                name = node.inputs[position] if len(node.inputs) > position else ""
                if not name:
                    bounds.append(default)
                elif name in constants and constants[name].size == 1:
                    bounds.append(float(constants[name].reshape(())))
                else:
                    return None
            lo, hi = bounds
        return ("clip", lo, hi), None
    if node.op_type in ("Mul", "Div") and len(node.inputs) == 2 and node.inputs[0] != node.inputs[1]:
        # x * c, c * x or x / c with a scalar float constant c: ("scale", c) (x / c as x * (1 / c)).
        other = node.inputs[1] if node.inputs[0] == produced else node.inputs[0]
        if node.op_type == "Div" and node.inputs[0] != produced:
            return None
        factor = _scalar_constant(other, constants)
        out_shape = types.get(node.outputs[0], ((), None))[0]
        if factor is None or tuple(out_shape) != output_shape:
            return None
        if node.op_type == "Div":
            if factor == 0.0:
                return None
            factor = float(np.float32(1.0) / np.float32(factor))
        if not np.isfinite(factor):
            return None
        return ("scale", factor), None
    if node.op_type == "Add" and len(node.inputs) == 2:
        other = node.inputs[1] if node.inputs[0] == produced else node.inputs[0]
        if node.inputs[0] == node.inputs[1]:
            return None
        out_shape = types.get(node.outputs[0], ((), None))[0]
        if tuple(out_shape) != output_shape:
            return None  # the add broadcasts the product: not an epilogue
        return ("add", extra_index), other
    return None


def _scalar_constant(name: str, constants: Mapping[str, np.ndarray]) -> float | None:
    """The value of a one-element float32 constant, else None."""
    value = constants.get(name)
    if value is None or value.size != 1 or value.dtype != np.float32:
        return None
    number = float(value.reshape(()))
    return number if np.isfinite(number) else None


def _is_constant(name: str, constants: Mapping[str, np.ndarray], expected: float) -> bool:
    value = _scalar_constant(name, constants)
    return value is not None and abs(value - expected) <= 1e-6 * abs(expected)


_SQRT2 = float(np.sqrt(2.0))


def fuse_epilogue(
    ctx: RewriteContext, node: GraphNode, operator: Operator, attrs: Mapping[str, Any]
) -> PlannedStep | None:
    """``node`` (a fusable producer) with the chain of elementwise nodes after it as its epilogue, or None when
    no node follows that can ride on it (or the operator does not take the epilogue)."""
    current = node.outputs[0]
    output_info = ctx.infos[current]
    if output_info.dtype not in (np.float32, np.float16):  # the epilogue computes in f32 and stores either
        return None
    inputs = list(node.inputs) + [""] * max(0, _ARITY.get(node.op_type, 0) - len(node.inputs))
    epilogue: list[tuple[Any, ...]] = []
    group = [node]
    while True:
        users = ctx.consumers.get(current, [])
        if current in ctx.graph_outputs:
            break
        if len(users) == 2 and not any(user.name in ctx.absorbed for user in users):
            gelu = match_gelu(ctx, current, users, output_info)
            if gelu is None:
                break
            epilogue.append(("gelu",))
            group.extend(gelu)
            current = gelu[-1].outputs[0]
            continue
        if len(users) != 1:
            break
        user = users[0]
        if user.name in ctx.absorbed:
            break  # already the epilogue of another producer (the other side of a residual Add)
        if sum(1 for name in user.inputs if name == current) != 1:
            break
        found = epilogue_step(user, current, ctx.types, ctx.constants, output_info.shape, len(inputs))
        if found is None:
            break
        step_spec, extra = found
        if extra is not None:
            info = ctx.infos.get(extra)
            if info is None or info.dtype != output_info.dtype:
                break
            inputs.append(extra)
        if ctx.infos[user.outputs[0]].dtype != output_info.dtype:
            break
        epilogue.append(step_spec)
        group.append(user)
        current = user.outputs[0]
    if not epilogue:
        return None
    fused_attrs = dict(attrs)
    fused_attrs["_epilogue"] = tuple(epilogue)
    input_infos = ctx.infos_of(inputs)
    output_infos = (ctx.infos[current],) + tuple(ctx.infos[name] for name in node.outputs[1:] if name)
    try:
        op_plan = operator.plan(input_infos, output_infos, fused_attrs, ctx.caps, ctx.constants_of(inputs))
    except NotOnDevice:
        return None
    except (UnsupportedOpError, KeyError, TypeError, ValueError, AssertionError):
        return None  # the operator does not take this epilogue: run the nodes one by one
    return PlannedStep(
        tuple(n.name for n in group),
        tuple(n.op_type for n in group),
        "webgpu",
        "WGSL kernel, fused epilogue " + "+".join(str(s[0]) for s in epilogue),
        operator,
        fused_attrs,
        tuple(inputs),
        (current,) + tuple(node.outputs[1:]),
        input_infos,
        output_infos,
        op_plan,
    )


def match_gelu(
    ctx: RewriteContext, x: str, users: Sequence[GraphNode], output_info: TensorInfo
) -> list[GraphNode] | None:
    """The nodes of the exported erf GELU of ``x`` (its two consumers start it), the final Mul last; else None.

    Recognised: ``u = Div(x, sqrt 2)`` or ``Mul(x, 1 / sqrt 2)``; ``e = Erf(u)``; ``a = Add(e, 1)``; then
    ``0.5 * x * a`` as ``Mul(Mul(x, a), 0.5)``, ``Mul(Mul(x, 0.5), a)`` or ``Mul(Mul(a, 0.5), x)`` (operands
    of each Mul in either order).  Every intermediate has this one consumer and is no graph output, and
    every tensor keeps the shape and dtype of ``x``.
    """
    constants = ctx.constants

    def only_user(name: str) -> GraphNode | None:
        found = ctx.consumers.get(name, [])
        if name in ctx.graph_outputs or len(found) != 1 or found[0].domain != "":
            return None
        node = found[0]
        info = ctx.infos.get(node.outputs[0]) if node.outputs else None
        if info is None or info.shape != output_info.shape or info.dtype != output_info.dtype:
            return None
        return node

    def other_input(node: GraphNode, name: str) -> str | None:
        if len(node.inputs) != 2 or node.inputs[0] == node.inputs[1] or name not in node.inputs:
            return None
        return node.inputs[1] if node.inputs[0] == name else node.inputs[0]

    def is_scale(node: GraphNode) -> bool:  # x / sqrt2 or x * (1 / sqrt2)
        if node.op_type == "Div" and len(node.inputs) == 2 and node.inputs[0] == x:
            return _is_constant(node.inputs[1], constants, _SQRT2)
        if node.op_type == "Mul":
            other = other_input(node, x)
            return other is not None and _is_constant(other, constants, 1.0 / _SQRT2)
        return False

    scale = [u for u in users if is_scale(u)]
    if len(scale) != 1:
        return None
    rest = [u for u in users if u is not scale[0]][0]
    if not all(len(u.outputs) == 1 and u.domain == "" and ctx.infos.get(u.outputs[0]) is not None for u in users):
        return None
    erf = only_user(scale[0].outputs[0])
    if erf is None or erf.op_type != "Erf":
        return None
    add = only_user(erf.outputs[0])
    if add is None or add.op_type != "Add":
        return None
    one = other_input(add, erf.outputs[0])
    if one is None or not _is_constant(one, constants, 1.0):
        return None
    a = add.outputs[0]
    head = [scale[0], erf, add]
    if rest.op_type != "Mul" or ctx.infos[rest.outputs[0]].shape != output_info.shape:
        return None
    # rest consumes x: Mul(x, a) -> Mul(., 0.5); Mul(x, 0.5) -> Mul(., a); or Mul(a, 0.5) -> Mul(., x).
    partner = other_input(rest, x)
    if partner is None:
        return None
    mul_a = only_user(a)
    if partner == a:
        if mul_a is not rest:
            return None
        last = only_user(rest.outputs[0])
        half = None if last is None or last.op_type != "Mul" else other_input(last, rest.outputs[0])
        if last is None or half is None or not _is_constant(half, constants, 0.5):
            return None
        return head + [rest, last]
    if _is_constant(partner, constants, 0.5):
        last = only_user(rest.outputs[0])
        if last is None or last.op_type != "Mul" or mul_a is not last or other_input(last, rest.outputs[0]) != a:
            return None
        return head + [rest, last]
    if mul_a is not None and mul_a.op_type == "Mul" and mul_a.outputs[0] == partner:
        half = other_input(mul_a, a)
        if half is not None and _is_constant(half, constants, 0.5) and only_user(partner) is rest:
            return head + [mul_a, rest]
    return None


# ---------------------------------------------------------------------------
# Transposes into MatMul


def foldable_transposes(ctx: RewriteContext, nodes: Sequence[GraphNode]) -> TransposeFolds:
    """MatMul node name -> {input index: (the Transpose feeding it, its perm)} for every Transpose whose output
    only that MatMul reads, once, as a float32 operand of rank >= 2 (not a graph output, not a constant)."""
    folds: TransposeFolds = {}
    for node in nodes:
        if node.op_type != "Transpose" or node.domain != "" or not node.outputs or not node.inputs:
            continue
        out, source = node.outputs[0], node.inputs[0]
        users = ctx.consumers.get(out, [])
        if out in ctx.graph_outputs or len(users) != 1 or source in ctx.constants:
            continue
        user = users[0]
        if user.op_type != "MatMul" or user.domain != "" or list(user.inputs[:2]).count(out) != 1:
            continue
        info = ctx.infos.get(source)
        if info is None or info.dtype not in (np.float32, np.float16) or len(info.shape) < 2:
            continue
        try:
            perm = tuple(permutation(node.attrs, len(info.shape)))
        except UnsupportedOpError:
            continue  # planned as its own step, which reports the bad perm
        if perm == tuple(range(len(perm))):
            continue
        folds.setdefault(user.name, {})[list(user.inputs[:2]).index(out)] = (node, perm)
    return folds


def fold_transposes(
    ctx: RewriteContext,
    node: GraphNode,
    transposes: Mapping[int, tuple[GraphNode, tuple[int, ...]]],
    operator: Operator,
    attrs: Mapping[str, Any],
) -> PlannedStep | None:
    """MatMul ``node`` reading the sources of ``transposes`` through ``_input_perms`` (with its epilogue, if
    any); None if it cannot run so on the device."""
    inputs = list(node.inputs)
    perms: list[tuple[int, ...] | None] = [None, None]
    for index, (transpose, perm) in transposes.items():
        perms[index] = perm
        inputs[index] = transpose.inputs[0]
    folded_node = dataclasses.replace(node, inputs=tuple(inputs))
    folded_attrs = dict(attrs)
    folded_attrs["_input_perms"] = tuple(perms)
    step = fuse_epilogue(ctx, folded_node, operator, folded_attrs)
    if step is None:
        step = plan_node(ctx, folded_node, operator, folded_attrs)
        if step.placement != "webgpu":
            return None
    names = tuple(t.name for t, _ in transposes.values())
    return dataclasses.replace(
        step,
        node_names=step.node_names[:1] + names + step.node_names[1:],
        op_types=step.op_types[:1] + ("Transpose",) * len(names) + step.op_types[1:],
        reason=f"{step.reason}, folded input transpose{'s' if len(names) > 1 else ''} {', '.join(map(repr, names))}",
    )
