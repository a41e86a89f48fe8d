"""The RMSNorm rewrite: root-mean-square normalisation as exporters write it, planned as one row kernel.

HF's ``LlamaRMSNorm`` (and T5's, Qwen2's, Mistral's...) exports as::

    p = Pow(x, 2)
    m = ReduceMean(p, last axis, keepdims)
    s = Sqrt(Add(m, eps))
    r = Reciprocal(s) | Div(1, s)
    y = Mul(x, r)                      then any number of Casts to float
    y = Mul(y, weight)                 the weight broadcast along the last axis

with every intermediate read only by the next node.  The group becomes one step of ONNX ``RMSNormalization``
(axis -1, that epsilon) at the final Mul's place; where that operator cannot be planned the nodes are planned one
by one.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ._graph_match import GraphMatcher
from ._plan_types import PlannedStep
from ._rewrites import RewriteContext
from .loader._model import GraphNode
from .ops import NotOnDevice, get_operator

__all__ = ["fuse_rms_norms"]


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


def _match(ctx: RewriteContext, matcher: GraphMatcher, power: GraphNode) -> PlannedStep | None:
    if len(power.inputs) != 2 or matcher.scalar(power.inputs[1]) != 2.0:
        return None
    x = power.inputs[0]
    info = ctx.infos.get(x)
    if info is None or info.dtype != np.float32 or not info.shape:
        return None
    group = [power]
    mean = matcher.only_user(power.outputs[0])
    if mean is None or not _last_axis_mean(matcher, mean, len(info.shape)):
        return None
    add = matcher.only_user(mean.outputs[0])
    if add is None or add.op_type != "Add" or len(add.inputs) != 2:
        return None
    epsilon = matcher.scalar(add.inputs[1] if add.inputs[0] == mean.outputs[0] else add.inputs[0])
    root = matcher.only_user(add.outputs[0])
    if epsilon is None or epsilon < 0 or root is None or root.op_type != "Sqrt":
        return None
    inverse = matcher.only_user(root.outputs[0])
    if inverse is None or not (
        inverse.op_type == "Reciprocal"
        or (
            inverse.op_type == "Div"
            and inverse.inputs[1] == root.outputs[0]
            and matcher.scalar(inverse.inputs[0]) == 1.0
        )
    ):
        return None
    scaled = matcher.only_user(inverse.outputs[0])
    if scaled is None or scaled.op_type != "Mul" or sorted(scaled.inputs) != sorted((x, inverse.outputs[0])):
        return None
    group += [mean, add, root, inverse, scaled]
    current = scaled.outputs[0]
    last = matcher.only_user(current)
    while last is not None and matcher.is_float_cast(last, current):
        group.append(last)
        current = last.outputs[0]
        last = matcher.only_user(current)
    if last is None or last.op_type != "Mul" or len(last.inputs) != 2 or last.inputs[0] == last.inputs[1]:
        return None
    weight = last.inputs[1] if last.inputs[0] == current else last.inputs[0]
    weight_info, out_info = ctx.infos.get(weight), ctx.infos.get(last.outputs[0])
    if weight_info is None or out_info is None or out_info.shape != info.shape:
        return None
    if weight_info.dtype != np.float32 or tuple(weight_info.shape) not in ((info.shape[-1],), (1,)):
        return None
    group.append(last)
    operator = get_operator("RMSNormalization", 23, "")
    attrs = {"axis": -1, "epsilon": epsilon}
    inputs = (x, weight)
    input_infos = ctx.infos_of(inputs)
    try:
        op_plan = operator.plan(input_infos, (out_info,), attrs, ctx.caps, ctx.constants_of(inputs))
    except NotOnDevice:
        return None
    return PlannedStep(
        tuple(node.name for node in group),
        tuple(node.op_type for node in group),
        "webgpu",
        "WGSL kernel, fused RMS normalization (one row kernel)",
        operator,
        attrs,
        inputs,
        (last.outputs[0],),
        input_infos,
        (out_info,),
        op_plan,
    )


def fuse_rms_norms(ctx: RewriteContext, nodes: Sequence[GraphNode]) -> dict[str, PlannedStep]:
    """The fused RMSNorm steps of ``nodes``, keyed by the name of each group's last node (where the step runs)."""
    producers = {out: node for node in nodes for out in node.outputs if out}
    matcher = GraphMatcher(ctx, producers)
    steps: dict[str, PlannedStep] = {}
    for node in nodes:
        if node.op_type == "Pow" and node.domain == "" and node.name not in ctx.absorbed:
            step = _match(ctx, matcher, node)
            if step is not None:
                steps[step.node_names[-1]] = step
    return steps
