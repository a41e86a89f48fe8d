"""A float16 graph's Softmax in float32, ``Cast(float16 -> float32), Softmax, Cast(float32 -> float16)``, as one
Softmax from float16 to float16.

Exporters write this wherever a model asks for ``softmax(x, dtype=torch.float32).to(x.dtype)`` (Hugging Face's eager
attention does, for every head).  The device's float16 Softmax (and LogSoftmax) loads into f32, keeps the maximum and
the sums in f32 and rounds each output once, which is exactly what the three nodes compute (float16 widens to float32
without rounding); one step instead of three writes the scores once in float16 instead of twice in float32 and reads
them once instead of three times.  The middle values must have no other reader and be no graph output.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ._graph_match import GraphMatcher
from ._plan_types import PlannedStep
from ._rewrites import RewriteContext, plan_group
from .loader._model import GraphNode
from .loader._node_inference import public_attrs
from .ops import get_operator

__all__ = ["fold_softmax_casts", "softmax_in_storage_type"]

_SOFTMAXES = ("Softmax", "LogSoftmax")
_HALF, _SINGLE = np.dtype(np.float16), np.dtype(np.float32)


def softmax_in_storage_type(ctx: RewriteContext, nodes: Sequence[GraphNode]) -> PlannedStep | None:
    """The one step of ``nodes`` = ``[Cast to float32, Softmax, Cast to float16]`` (consecutive, checked here by
    their types only: the caller checks that each feeds only the next), or None for any other chain or where the
    float16 Softmax does not plan on the device."""
    if (
        len(nodes) != 3
        or nodes[0].op_type != "Cast"
        or nodes[2].op_type != "Cast"
        or nodes[1].op_type not in _SOFTMAXES
    ):
        return None
    widen, softmax, narrow = nodes
    if widen.outputs[0] != softmax.inputs[0] or softmax.outputs[0] != narrow.inputs[0]:
        return None
    stored, result = ctx.infos.get(widen.inputs[0]), ctx.infos.get(narrow.outputs[0])
    middle = (ctx.infos.get(softmax.inputs[0]), ctx.infos.get(softmax.outputs[0]))
    if stored is None or result is None or stored.dtype != _HALF or result.dtype != _HALF:
        return None
    if any(info is None or info.dtype != _SINGLE for info in middle):
        return None
    step = plan_group(
        ctx,
        nodes,
        get_operator(softmax.op_type, softmax.opset, softmax.domain),
        public_attrs(softmax.attrs),
        (widen.inputs[0],),
        (narrow.outputs[0],),
        f"WGSL kernel, {softmax.op_type} in float16 storage (f32 arithmetic; the Casts around it folded)",
    )
    if step is None or step.op_plan is None or not step.op_plan.kernels:
        return None
    return step


def fold_softmax_casts(ctx: RewriteContext, nodes: Sequence[GraphNode]) -> dict[str, PlannedStep]:
    """The folded steps of ``nodes`` (those another rewrite absorbed are left alone), keyed by each group's last
    node, the narrowing Cast, where the step runs."""
    producers = {out: node for node in nodes for out in node.outputs if out}
    matcher = GraphMatcher(ctx, producers)
    steps: dict[str, PlannedStep] = {}
    for node in nodes:
        if node.op_type not in _SOFTMAXES or node.domain != "" or node.name in ctx.absorbed or not node.inputs:
            continue
        widen = producers.get(node.inputs[0])
        if widen is None or widen.op_type != "Cast" or widen.name in ctx.absorbed:
            continue
        if matcher.only_user(widen.outputs[0]) is not node:
            continue
        narrow = matcher.only_user(node.outputs[0])
        if narrow is None or narrow.op_type != "Cast":
            continue
        step = softmax_in_storage_type(ctx, (widen, node, narrow))
        if step is not None:
            steps[narrow.name] = step
    return steps
