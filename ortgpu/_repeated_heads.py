"""Grouped K/V heads repeated by Unsqueeze + Expand + Reshape (HF's ``repeat_kv``), read by the fused attention (and
by the two products of an attention too long for it) without the repeat.

Grouped-query attention exports repeat each key/value head for the query heads that share it: ``[B, Hkv, S, D]``
-> Unsqueeze -> Expand to ``[B, Hkv, rep, S, D]`` -> Reshape to ``[B, Hkv * rep, S, D]``.  The Expand is a broadcast
(stride 0) but the Reshape merges the repeated axis with the head axis, which no single stride expresses, so the
strided views of :meth:`~ortgpu._graph_match.GraphMatcher.view` stop there and the repeat is copied.  Here the
attention's batch is split instead: the head axis ``H`` becomes ``(Hkv, rep)`` in every operand (Q and the output
split it, an axis split is always a view; K and V are read from before the Expand, the ``rep`` axis with stride 0),
so the ``rep`` query heads of a group read its key/value head where it lies (stride 0 along the repeats) and
nothing is copied.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from ortgpu_core._errors import UnsupportedOpError

from ._rewrites import RewriteContext
from ._strided_view import StridedView
from .loader._model import GraphNode
from .ops.ai_onnx.transpose import permutation

__all__ = ["View", "split_repeated_heads"]

#: An operand as the attention reads it: (source tensor, its strided view, scalar factor, the nodes taken).
View = tuple[str, StridedView, float, list[GraphNode]]
#: How a tensor is read by a node, further back (:meth:`~ortgpu._graph_match.GraphMatcher.view`).
Deeper = Callable[[str, GraphNode], "View | None"]


def split_repeated_heads(
    ctx: RewriteContext,
    producers: Mapping[str, GraphNode],
    readers: Sequence[GraphNode],
    views: tuple[View, View, View],
    deeper: Deeper,
) -> tuple[tuple[View, View, View], tuple[int, int, int]] | None:
    """Q, K^T and V (``views``) with the batch axis that K or V repeat split in two, and ``(axis, groups, rep)``;
    None where neither K nor V arrives through a repeat (or the operands do not line up).  ``readers``: the step's
    two products (the only nodes besides the views' own that may read a tensor the split takes); ``deeper``: how the
    repeat's input is read further back (the caller checks that what is taken is read only inside its step)."""
    q, kt, v = views
    lifted = [_lifted(ctx, producers, readers, view, deeper) for view in (kt, v)]
    found = [entry for entry in lifted if entry is not None]
    if not found:
        return None
    split = found[0][1]
    if any(entry[1] != split for entry in found):
        return None
    axis, groups, rep = split
    rank = len(q[1].shape)
    if axis >= rank - 2 or any(len(view[1].shape) != rank for view in views):
        return None  # only a batch axis splits, and only where every operand has the same axes
    result: list[View] = []
    for view, entry in zip((q, kt, v), [None, *lifted]):
        if entry is not None:
            result.append(entry[0])
            continue
        shape = view[1].shape
        if shape[axis] != groups * rep:
            return None
        split_view = view[1].reshape(shape[:axis] + (groups, rep) + shape[axis + 1 :])
        if split_view is None:
            return None
        result.append((view[0], split_view, view[2], view[3]))
    return (result[0], result[1], result[2]), split


def _lifted(
    ctx: RewriteContext, producers: Mapping[str, GraphNode], readers: Sequence[GraphNode], view: View, deeper: Deeper
) -> tuple[View, tuple[int, int, int]] | None:
    """``view`` (K^T or V) read from before an Expand + Reshape repeat of its source, in the split batch; None
    where its source is not such a repeat read only by this view."""
    source, _, factor, nodes = view
    reshape = producers.get(source)
    if reshape is None or reshape.op_type != "Reshape" or reshape.domain != "" or not reshape.inputs:
        return None
    expand = producers.get(reshape.inputs[0])
    if expand is None or expand.op_type != "Expand" or expand.domain != "" or not expand.inputs:
        return None
    members = {node.name for node in nodes} | {node.name for node in readers}
    for tensor, allowed in ((expand.outputs[0], {reshape.name}), (source, members)):
        users = ctx.consumers.get(tensor, [])
        if tensor in ctx.graph_outputs or not users or any(user.name not in allowed for user in users):
            return None
    infos = ctx.infos
    if any(name not in infos for name in (expand.inputs[0], expand.outputs[0], source)):
        return None
    expanded, merged_shape = tuple(infos[expand.outputs[0]].shape), tuple(infos[source].shape)
    axis = next(
        (
            a
            for a in range(len(expanded) - 1)
            if expanded[:a] + (expanded[a] * expanded[a + 1],) + expanded[a + 2 :] == merged_shape
        ),
        None,
    )
    if axis is None:
        return None
    base = deeper(expand.inputs[0], expand)  # the repeat's input, itself read through what comes before it
    if base is None or base[2] != 1.0:
        base = (expand.inputs[0], StridedView.contiguous(infos[expand.inputs[0]].shape), 1.0, [])
    current = base[1].expand(expanded)
    if current is None or current.strides[axis + 1] != 0:
        return None  # not a repeat: the merged inner axis must be the broadcast one
    groups, rep = expanded[axis], expanded[axis + 1]
    position = axis  # where the merged axis is in the view's own axes as the nodes move it
    for node in reversed(nodes):  # forward: from the source to the product
        if node.op_type == "Transpose":
            try:
                perm = tuple(permutation(node.attrs, len(merged_shape)))
            except UnsupportedOpError:
                return None
            lifted: list[int] = []
            for src in perm:
                lifted += [src, src + 1] if src == position else [src + 1 if src > position else src]
            current = current.transpose(lifted)
            position = perm.index(position)
        elif node.op_type not in ("Mul", "Div"):
            return None  # (scalar factors do not move axes; anything else is not lifted here)
    return (base[0], current, factor, nodes + [reshape, expand] + base[3]), (position, groups, rep)
