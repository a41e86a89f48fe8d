"""The normalisation rewrites: RMSNorm and LayerNorm as exporters write them out, each planned as one row kernel.

HF's ``LlamaRMSNorm`` (and T5's, Qwen2's, Mistral's...) exports as::

    p = Pow(x, 2)
    m = ReduceMean(p, last axis, keepdims)
    s = Sqrt(Add(m, eps))
    r = Reciprocal(s) | Div(1, s)
    y = Mul(x, r)                      then any number of Casts to float
    y = Mul(y, weight)                 the weight broadcast along the last axis

with every intermediate read only by the next node.  The group becomes one step of ONNX ``RMSNormalization``
(axis -1, that epsilon) at the final Mul's place.  LayerNorm exported before opset 17 (``x - mean``, its squared mean
``+ eps``, ``Sqrt``, the division, ``* gamma`` and ``+ beta``) becomes one ``LayerNormalization`` step likewise.
Where the operator cannot be planned the nodes are planned one by one.

Graphs in float16 (``model.half()``) take the same rewrites: tensors float16 or float32, scalars either too.  A
float16 model's RMSNorm computes in float32 between a Cast of float16 x to float32 (absorbed into the group when
only the group reads that copy) and a Cast back to float16 before the weight: the kernel rounds the normalised value
to float16 before the scale where X or Y is float16, so a chain that rounds otherwise stays unfused.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ._graph_match import GraphMatcher
from ._plan_types import PlannedStep
from ._rewrites import RewriteContext, plan_group
from .loader._model import GraphNode
from .ops import TensorInfo, get_operator

__all__ = ["fuse_norms"]

#: the element types of the tensors the rewrites take (each kernel loads into f32 and computes there)
_FLOATS = (np.dtype(np.float32), np.dtype(np.float16))
#: ONNX element types of a Cast between them: TensorProto.FLOAT, TensorProto.FLOAT16
_CAST_TO: dict[int, np.dtype[Any]] = {1: np.dtype(np.float32), 10: np.dtype(np.float16)}


def _scalar(matcher: GraphMatcher, name: str) -> float | None:
    """A finite scalar constant of float32 or float16 (a float16 graph's exponents and epsilons are float16)."""
    value = matcher.ctx.constants.get(name)
    if value is None or value.size != 1 or value.dtype not in _FLOATS:
        return None
    number = float(value.reshape(()))
    return number if np.isfinite(number) else None


def _float_cast(matcher: GraphMatcher, node: GraphNode, operand: str) -> np.dtype[Any] | None:
    """The type a Cast from float32 or float16 ``operand`` to float32 or float16 makes, else None."""
    info = matcher.ctx.infos.get(operand)
    if node.op_type != "Cast" or info is None or info.dtype not in _FLOATS:
        return None
    return _CAST_TO.get(int(node.attrs.get("to", 0)))


def _widening_cast(matcher: GraphMatcher, name: str, readers: Sequence[GraphNode]) -> GraphNode | None:
    """The Cast making ``name`` from float16 when ``readers`` are all that read it (each once), else None."""
    cast = matcher.producers.get(name)
    if cast is None or cast.domain != "" or cast.name in matcher.ctx.absorbed or len(cast.inputs) != 1:
        return None
    source = matcher.ctx.infos.get(cast.inputs[0])
    users = matcher.ctx.consumers.get(name, [])
    if (
        source is None
        or source.dtype != np.float16
        or _float_cast(matcher, cast, cast.inputs[0]) != np.float32
        or name in matcher.ctx.graph_outputs
        or sorted(user.name for user in users) != sorted(reader.name for reader in readers)
    ):
        return None
    return cast


def _last_axis_mean(matcher: GraphMatcher, node: GraphNode, rank: int) -> bool:
    """Whether ``node`` is a ReduceMean over the last axis only, keeping it."""
    if node.op_type != "ReduceMean" or int(node.attrs.get("keepdims", 1)) != 1:
        return False
    if len(node.inputs) > 1 and node.inputs[1]:
        value = matcher.ctx.constants.get(node.inputs[1])
        axes = None if value is None else [int(a) for a in np.asarray(value).reshape(-1)]
    else:
        raw = node.attrs.get("axes")
        axes = None if raw is None else [int(a) for a in raw]
    return axes is not None and len(axes) == 1 and axes[0] % rank == rank - 1


def _plus_epsilon_root(matcher: GraphMatcher, mean: GraphNode) -> tuple[GraphNode, GraphNode, float] | None:
    """``Sqrt(Add(mean, eps))`` after ``mean`` (eps a non-negative scalar constant): the Add, the Sqrt and eps."""
    add = matcher.only_user(mean.outputs[0])
    if add is None or add.op_type != "Add" or len(add.inputs) != 2:
        return None
    epsilon = _scalar(matcher, add.inputs[1] if add.inputs[0] == mean.outputs[0] else add.inputs[0])
    root = matcher.only_user(add.outputs[0])
    if epsilon is None or epsilon < 0 or root is None or root.op_type != "Sqrt":
        return None
    return add, root, epsilon


def _match(ctx: RewriteContext, matcher: GraphMatcher, power: GraphNode) -> PlannedStep | None:
    if len(power.inputs) != 2 or _scalar(matcher, power.inputs[1]) != 2.0:
        return None
    x = power.inputs[0]
    info = ctx.infos.get(x)
    if info is None or info.dtype not in _FLOATS or not info.shape:
        return None
    group = [power]
    mean = matcher.only_user(power.outputs[0])
    if mean is None or not _last_axis_mean(matcher, mean, len(info.shape)):
        return None
    found = _plus_epsilon_root(matcher, mean)
    if found is None:
        return None
    add, root, epsilon = found
    inverse = matcher.only_user(root.outputs[0])
    if inverse is None or not (
        inverse.op_type == "Reciprocal"
        or (
            inverse.op_type == "Div"
            and inverse.inputs[1] == root.outputs[0]
            and _scalar(matcher, inverse.inputs[0]) == 1.0
        )
    ):
        return None
    scaled = matcher.only_user(inverse.outputs[0])
    if scaled is None or scaled.op_type != "Mul" or sorted(scaled.inputs) != sorted((x, inverse.outputs[0])):
        return None
    group += [mean, add, root, inverse, scaled]
    current = scaled.outputs[0]
    rounded = [info.dtype]  # the types the normalised value passes through: the narrowest rounds it
    last = matcher.only_user(current)
    while last is not None and (to := _float_cast(matcher, last, current)) is not None:
        group.append(last)
        rounded.append(to)
        current = last.outputs[0]
        last = matcher.only_user(current)
    if last is None or last.op_type != "Mul" or len(last.inputs) != 2 or last.inputs[0] == last.inputs[1]:
        return None
    weight = last.inputs[1] if last.inputs[0] == current else last.inputs[0]
    weight_info, out_info = ctx.infos.get(weight), ctx.infos.get(last.outputs[0])
    if weight_info is None or out_info is None or out_info.shape != info.shape:
        return None
    if weight_info.dtype not in _FLOATS or tuple(weight_info.shape) not in ((info.shape[-1],), (1,)):
        return None
    # the kernel rounds the normalised value to float16 where X or Y is float16 (rounded starts with X's type)
    if any(dtype == np.float16 for dtype in rounded) != (np.float16 in (info.dtype, out_info.dtype)):
        return None
    group.append(last)
    cast = _widening_cast(matcher, x, (power, scaled)) if out_info.dtype == np.float16 else None
    if cast is not None:  # x's float32 copy only feeds the group: the kernel reads the float16 x itself
        group.insert(0, cast)
        x = cast.inputs[0]
    return _norm_step(ctx, "RMSNormalization", 23, group, (x, weight), last, epsilon, "RMS")


def _is_square(matcher: GraphMatcher, node: GraphNode, operand: str) -> bool:
    """``node`` is ``operand ** 2`` (Pow by the constant 2, or Mul of it by itself)."""
    if node.op_type == "Pow":
        return len(node.inputs) == 2 and node.inputs[0] == operand and _scalar(matcher, node.inputs[1]) == 2.0
    return node.op_type == "Mul" and tuple(node.inputs) == (operand, operand)


def _match_layer_norm(ctx: RewriteContext, matcher: GraphMatcher, mean: GraphNode) -> PlannedStep | None:
    """LayerNorm written out (exports before opset 17): ``d = x - ReduceMean(x)``, ``ReduceMean(d ** 2)``, ``+ eps``,
    ``Sqrt``, ``d / that``, ``* gamma``, ``[+ beta]``, every reduction over the last axis only."""
    x = mean.inputs[0] if mean.inputs else ""
    info = ctx.infos.get(x)
    if (
        info is None
        or info.dtype not in _FLOATS
        or not info.shape
        or not _last_axis_mean(matcher, mean, len(info.shape))
    ):
        return None
    sub = matcher.only_user(mean.outputs[0])
    if sub is None or sub.op_type != "Sub" or tuple(sub.inputs) != (x, mean.outputs[0]):
        return None
    centred = sub.outputs[0]
    users = list({user.name: user for user in matcher.ctx.consumers.get(centred, [])}.values())  # Mul(d, d) once
    if centred in ctx.graph_outputs or len(users) != 2 or any(user.name in ctx.absorbed for user in users):
        return None
    square = next((user for user in users if _is_square(matcher, user, centred)), None)
    divide = next((user for user in users if user is not square), None)
    if square is None or divide is None or divide.op_type != "Div" or divide.inputs[0] != centred:
        return None
    variance = matcher.only_user(square.outputs[0])
    if variance is None or not _last_axis_mean(matcher, variance, len(info.shape)):
        return None
    found = _plus_epsilon_root(matcher, variance)
    if found is None or divide.inputs[1] != found[1].outputs[0]:
        return None
    add, root, epsilon = found
    if matcher.only_user(root.outputs[0]) is not divide:
        return None
    group = [mean, sub, square, variance, add, root, divide]
    scale = matcher.only_user(divide.outputs[0])
    gamma = _vector_operand(ctx, scale, divide.outputs[0], "Mul", info)
    if scale is None or gamma is None:
        return None
    group.append(scale)
    last, inputs = scale, [x, gamma]
    shift = matcher.only_user(scale.outputs[0])
    beta = _vector_operand(ctx, shift, scale.outputs[0], "Add", info)
    if shift is not None and beta is not None:
        group.append(shift)
        last = shift
        inputs.append(beta)
    out_info = ctx.infos.get(last.outputs[0])
    if out_info is None or out_info.shape != info.shape:
        return None
    return _norm_step(ctx, "LayerNormalization", 17, group, tuple(inputs), last, epsilon, "layer")


def _vector_operand(
    ctx: RewriteContext, node: GraphNode | None, operand: str, op_type: str, x: TensorInfo
) -> str | None:
    """The other input of ``node`` (an ``op_type`` with ``operand``) when it is a vector of x's type and width."""
    if node is None or node.op_type != op_type or len(node.inputs) != 2 or node.inputs[0] == node.inputs[1]:
        return None
    other = node.inputs[1] if node.inputs[0] == operand else node.inputs[0]
    info = ctx.infos.get(other)
    if info is None or info.dtype != x.dtype or tuple(info.shape) != (x.shape[-1],):
        return None
    return other


def _norm_step(
    ctx: RewriteContext,
    op_type: str,
    opset: int,
    group: Sequence[GraphNode],
    inputs: tuple[str, ...],
    last: GraphNode,
    epsilon: float,
    kind: str,
) -> PlannedStep | None:
    return plan_group(
        ctx,
        group,
        get_operator(op_type, opset, ""),
        {"axis": -1, "epsilon": epsilon},
        inputs,
        (last.outputs[0],),
        f"WGSL kernel, fused {kind} normalization (one row kernel)",
    )


def fuse_norms(ctx: RewriteContext, nodes: Sequence[GraphNode]) -> dict[str, PlannedStep]:
    """The fused RMSNorm and LayerNorm steps of ``nodes``, keyed by the name of each group's last node (where the
    step runs)."""
    producers = {out: node for node in nodes for out in node.outputs if out}
    matcher = GraphMatcher(ctx, producers)
    steps: dict[str, PlannedStep] = {}
    taken: set[str] = set()
    for node in nodes:
        if node.domain != "" or node.name in ctx.absorbed or node.name in taken:
            continue
        step = None
        if node.op_type == "Pow":
            step = _match(ctx, matcher, node)
        elif node.op_type == "ReduceMean":
            step = _match_layer_norm(ctx, matcher, node)
        if step is not None and not set(step.node_names) & taken:
            taken.update(step.node_names)
            steps[step.node_names[-1]] = step
    return steps
