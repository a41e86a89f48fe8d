"""The attention rewrite: scaled dot-product attention as exported, planned as one flash-attention kernel.

Exporters write attention as a handful of nodes; the ones recognised here (torch's
``F.scaled_dot_product_attention``, HF eager attention, ``nn.MultiheadAttention``, and what any graph writes the
same way) all reduce to::

    S = MatMul(Q', K')                 Q' = Q read through data-movement nodes and scalar Muls, K' likewise (K^T)
    S = S * c | S / c | Cast(S, float) any number of them
    S = Add(S, mask)                   at most one, the mask broadcast to S (not S broadcast to it)
    S = S * c | S / c | Cast(S, float) c > 0 (they scale the mask too)
    P = Softmax(S, last axis)
    P = Cast(P, float)                 any number of them
    Y = MatMul(P, V')                  V' = V read through data-movement nodes

where every intermediate of the chain from Q.K^T to the final MatMul has that one consumer and is no graph output.
The group becomes one step of :class:`~ortgpu.ops._fused_attention.FusedAttention` at the place of the final MatMul
(every input it reads is produced before that).  Q, K^T and V are read in place through the data-movement nodes
before them (Transpose, Reshape, Squeeze, Unsqueeze, Flatten, Identity, a Gather of one index, Split, a Slice of
constant bounds), one strided view each (:meth:`~ortgpu._graph_match.GraphMatcher.view`), scalar factors folded
into the logit and mask scales; where the three are split from one packed projection (``nn.MultiheadAttention``'s
Gathers, timm's Split), they are read from the projection itself, past the split's shared nodes.  A node is taken
into the step only where nothing outside it reads its outputs (a Split whose other part is read elsewhere runs as
its own step, and the views start after it).  A Transpose that is the product's only reader (the heads merged
back) is written through: the step stores each element where the Transpose would. Grouped K/V heads work where they
arrive as a broadcast batch axis, through an Expand (stride 0), or repeated by Unsqueeze + Expand + Reshape (HF's
``repeat_kv``: the head axis is split into groups and repeats, :mod:`ortgpu._repeated_heads`, and the repeat is not
copied). Where the kernel cannot be planned (dtype, workgroup storage, the driver's loop budget) or would be slower
(more scores per head than :data:`~ortgpu.ops._fused_attention.FUSE_MAX_SCORES`), the two products run as steps
reading the same views, the Softmax folded into the second's loads (:func:`_unfused_reading_views`); where they cannot
either, the nodes are planned one by one.

"float" is float32 or float16: a float16 export (``model.half()``) has the same nodes with float16 tensors and
scalars, and often Casts to float32 and back around the Softmax (``softmax(..., dtype=torch.float32)``); the kernel
computes in f32 whichever the graph stores, so those Casts fold away like the others (a float16 rounding fewer).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from ._graph_match import GraphMatcher
from ._plan_types import PlannedStep
from ._repeated_heads import View, split_repeated_heads
from ._rewrites import RewriteContext, TransposeFolds, plan_node
from ._softmax_casts import softmax_in_storage_type
from .loader._model import GraphNode
from .loader._node_inference import public_attrs
from .ops import NotOnDevice, TensorInfo, get_operator
from .ops._fused_attention import FusedAttention
from .ops._output_layout import store_permutation
from .ops._tiling import c_strides
from .ops.ai_onnx.matmul import MatMul
from .ops.ai_onnx.transpose import permutation

__all__ = ["fuse_attentions"]

_FLOATS = (np.dtype(np.float32), np.dtype(np.float16))
_FLOAT_TYPES = (1, 10)  # TensorProto.FLOAT, TensorProto.FLOAT16


class _Matcher(GraphMatcher):
    """:class:`GraphMatcher` reading float16 graphs too: float16 scalar factors, Casts between the float types."""

    def scalar(self, name: str) -> float | None:
        value = self.ctx.constants.get(name)
        if value is None or value.size != 1 or value.dtype != np.float16:
            return super().scalar(name)
        number = float(value.reshape(()))
        return number if np.isfinite(number) else None

    def is_float_cast(self, node: GraphNode, operand: str) -> bool:
        info = self.ctx.infos.get(operand)
        return (
            node.op_type == "Cast"
            and int(node.attrs.get("to", 0)) in _FLOAT_TYPES
            and info is not None
            and info.dtype in _FLOATS
        )


def _match(ctx: RewriteContext, matcher: GraphMatcher, first: GraphNode, folded: set[str]) -> list[PlannedStep] | None:
    """The steps of the attention that starts at MatMul ``first`` (Q.K^T): the fused step, or where the kernel
    does not take it, the two or more of :func:`_unfused_reading_views`; None when neither.  ``folded``: the Transposes
    that later MatMuls read through (never written through here)."""
    if len(first.inputs) != 2 or not first.outputs or first.inputs[0] == first.inputs[1]:
        return None
    current = first.outputs[0]
    scores = ctx.infos.get(current)
    if scores is None or scores.dtype not in _FLOATS or len(scores.shape) < 2:
        return None
    logit_scale, bias_scale, mask = 1.0, 1.0, ""
    chain: list[GraphNode] = []
    while True:
        user = matcher.only_user(current)
        if user is None:
            return None
        out = ctx.infos.get(user.outputs[0]) if user.outputs else None
        if out is None or out.shape != scores.shape or out.dtype not in _FLOATS:
            return None
        factor = matcher.factor(user, current)
        if user.op_type == "Softmax":
            axis = int(user.attrs.get("axis", -1 if user.opset >= 13 else 1))
            if axis % len(scores.shape) != len(scores.shape) - 1:
                return None
            chain.append(user)
            current = user.outputs[0]
            break
        if factor is not None:
            if mask and factor <= 0:
                return None
            logit_scale *= factor
            bias_scale *= factor if mask else 1.0
        elif user.op_type == "Add" and not mask and len(user.inputs) == 2:
            mask = user.inputs[1] if user.inputs[0] == current else user.inputs[0]
            info = ctx.infos.get(mask)
            if info is None or info.dtype not in _FLOATS:
                return None
        elif not matcher.is_float_cast(user, current):
            return None
        chain.append(user)
        current = user.outputs[0]
    last = matcher.only_user(current)
    while last is not None and matcher.is_float_cast(last, current):  # softmax(..., dtype=float32) exports a Cast
        chain.append(last)
        current = last.outputs[0]
        last = matcher.only_user(current)
    if last is None or last.op_type != "MatMul" or len(last.inputs) != 2 or last.inputs[0] != current:
        return None
    operands = _operand_views(ctx, matcher, first, last)
    if operands is None:
        return None
    split = split_repeated_heads(ctx, matcher.producers, (first, last), operands, matcher.view)
    if split is not None and not _read_outside(ctx, (first, last), split[0]):
        operands = split[0]
    else:
        split = None
    q, kt, v = operands
    inputs = (q[0], kt[0], v[0], mask)
    input_infos = ctx.infos_of(inputs)
    output, out_perm, tail = _written_through(ctx, matcher, last, folded)
    output_infos = (ctx.infos[output],)
    views = tuple((view.shape, view.strides, view.offset) for view in (q[1], kt[1], v[1]))
    attrs: dict[str, object] = {"_views": views, "_logit_scale": logit_scale * q[2] * kt[2], "_bias_scale": bias_scale}
    if out_perm is not None:
        attrs["_out_perm"] = out_perm
    if split is not None:
        attrs["_batch_split"] = split[1]
    operator = FusedAttention()
    try:
        op_plan = operator.plan(input_infos, output_infos, attrs, ctx.caps, ctx.constants_of(inputs))
    except NotOnDevice:
        return _unfused_reading_views(
            ctx,
            (first, chain, last),
            operands,
            (mask, logit_scale, bias_scale),
            tail,
            None if split is None else split[1],
        )
    group = list({node.name: node for node in q[3][::-1] + kt[3][::-1]}.values())  # shared nodes once
    group += [first] + chain + [node for node in v[3][::-1] if node not in group] + [last] + tail
    return [
        PlannedStep(
            tuple(node.name for node in group),
            tuple(node.op_type for node in group),
            "webgpu",
            "WGSL kernel, fused attention (flash: online softmax, tiles in workgroup memory)",
            operator,
            attrs,
            inputs,
            (output,),
            input_infos,
            output_infos,
            op_plan,
        )
    ]


def _view_of(view: View) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    return view[1].shape, view[1].strides, view[1].offset


def _unfused_reading_views(
    ctx: RewriteContext,
    nodes: tuple[GraphNode, list[GraphNode], GraphNode],
    operands: tuple[View, View, View],
    scales: tuple[str, float, float],
    tail: list[GraphNode],
    split: tuple[int, int, int] | None = None,
) -> list[PlannedStep] | None:
    """An attention the fused kernel does not take (too long) as two steps: the scores ``Q.K^T`` (scales and mask
    in its epilogue), then ``softmax(S).V`` (written through the heads' merge Transpose where that keeps the last
    axis last), the Softmax folded into that product's loads (MatMul's ``_softmax_a``: the probabilities are never
    stored), the products reading Q, K^T and V in place (``_input_views``) as the fused kernel would have: the
    copies of a packed projection's split and of the head Reshapes/Transposes are gone.  Where the second product
    cannot read the softmax so (one row: the GEMV), the Softmax runs as a step between them.  Casts that change the type
    (a float16 export's ``softmax(..., dtype=float32).to(float16)``) run as steps of their own around the Softmax,
    the scores product writing the type its chain rounds to first, where the Softmax does not fold (a float16
    ``Cast``/``Softmax``/``Cast`` sandwich folds whole: :func:`_softmax_alone`).  None where a scale or mask follows such a Cast
    (the epilogue could not round between them), or a step does not plan on the device.  ``split``: the head axis
    as ``(axis, groups, rep)`` where K and V heads are repeated (:mod:`._repeated_heads`): both products run over the
    split axes (K and V read with stride 0 along the repeats, the scores, the mask and the output viewed split,
    the same bytes)."""
    first, chain, last = nodes
    mask, logit_scale, bias_scale = scales
    q, kt, v = operands
    at = [node.op_type for node in chain].index("Softmax")
    softmax, before, after = chain[at], chain[:at], chain[at + 1 :]

    def rounds(node: GraphNode) -> bool:
        return node.op_type == "Cast" and ctx.infos[node.inputs[0]].dtype != ctx.infos[node.outputs[0]].dtype

    # Casts that change nothing are skipped; from the first that rounds, the nodes run as their own steps.
    cut = next((index for index, node in enumerate(before) if rounds(node)), len(before))
    if any(node.op_type != "Cast" for node in before[cut:]):
        return None
    after_rounds = any(rounds(node) for node in after)
    own_steps = before[cut:] + [softmax] + (after if after_rounds else [])
    before, after = before[:cut], ([] if after_rounds else after)
    logit = logit_scale * q[2] * kt[2]
    # S = Q.K^T * logit + mask * bias_scale, as the chain computed it
    epilogue: list[tuple[object, ...]] = []
    if mask:
        if logit != bias_scale:
            epilogue.append(("scale", logit / bias_scale))
        epilogue.append(("add", 2))
        if bias_scale != 1.0:
            epilogue.append(("scale", bias_scale))
    elif logit != 1.0:
        epilogue.append(("scale", logit))
    scores_out = own_steps[0].inputs[0]
    scores_in = (q[0], kt[0]) + ((mask,) if mask else ())
    scores_attrs = {"_input_views": (_view_of(q), _view_of(kt)), "_epilogue": tuple(epilogue)}
    split_infos: dict[str, TensorInfo] = {}  # the mask as the split product reads it
    probabilities_view = None
    if split is not None:
        axis, groups, rep = split
        if mask:
            mask_info = _split_heads(ctx.infos[mask], axis, groups, rep, len(ctx.infos[scores_out].shape))
            if mask_info is None:
                return None
            split_infos[mask] = mask_info
        probabilities = _split_heads(ctx.infos[own_steps[-1].outputs[0]], axis, groups, rep)
        assert probabilities is not None
        probabilities_view = (probabilities.shape, c_strides(probabilities.shape), 0)
    out_perm = None
    output = last.outputs[0]
    if tail:
        perm = _written_perm(ctx, last, tail[0])
        try:
            if split is not None:
                perm = _split_permutation(perm, split[0])
            out_perm = store_permutation(perm, len(perm))
        except ValueError:
            out_perm = None
        if out_perm is not None:
            output = tail[0].outputs[0]
        else:
            tail = []
    mix_attrs: dict[str, object] = {"_input_views": (probabilities_view, _view_of(v))}
    if out_perm is not None:
        mix_attrs["_output_perm"] = out_perm
    operator = MatMul()
    steps = []
    mixes = [((own_steps[-1].outputs[0], v[0]), mix_attrs)]
    if _softmax_alone(ctx, own_steps):  # first choice: the Softmax folded into the second product's loads
        mixes.insert(0, ((scores_out, v[0]), {**mix_attrs, "_softmax_a": True}))
    for choices, out in (([(scores_in, scores_attrs)], scores_out), (mixes, output)):
        for inputs, attrs in choices:
            input_infos = tuple(split_infos.get(name, ctx.infos[name]) for name in inputs)
            output_infos = (ctx.infos[out],)
            try:
                op_plan = operator.plan(input_infos, output_infos, attrs, ctx.caps, ctx.constants_of(list(inputs)))
            except (NotOnDevice, UnsupportedOpError):
                continue
            steps.append((inputs, attrs, out, input_infos, output_infos, op_plan))
            break
        else:
            return None
    middle: list[PlannedStep] = []
    if not steps[1][1].get("_softmax_a"):
        folded = softmax_in_storage_type(ctx, own_steps)
        middle = (
            [folded]
            if folded is not None
            else [
                plan_node(ctx, node, get_operator(node.op_type, node.opset, node.domain), public_attrs(node.attrs))
                for node in own_steps
            ]
        )
    if any(step.placement != "webgpu" for step in middle):
        return None
    front = list({node.name: node for node in q[3][::-1] + kt[3][::-1]}.values()) + [first] + before
    back = ([] if middle else own_steps) + after + [node for node in v[3][::-1] if node not in front] + [last] + tail
    planned = []
    for group, (inputs, attrs, out, input_infos, output_infos, op_plan) in zip((front, back), steps):
        planned.append(
            PlannedStep(
                tuple(node.name for node in group),
                tuple(node.op_type for node in group),
                "webgpu",
                "WGSL kernel, an attention's product reading its operands in place",
                operator,
                attrs,
                tuple(inputs),
                (out,),
                input_infos,
                output_infos,
                op_plan,
            )
        )
    return [planned[0], *middle, planned[1]]


def _softmax_alone(ctx: RewriteContext, nodes: Sequence[GraphNode]) -> bool:
    """Whether ``nodes`` (consecutive, each feeding only the next) compute a Softmax of the scores in their own type
    and nothing else: the Softmax alone, or float16 scores widened to float32 for it and the probabilities narrowed
    back (the folded loads compute in f32 and round nothing: a float16 rounding fewer, as in the fused kernel)."""
    if len(nodes) == 1:
        return nodes[0].op_type == "Softmax"
    if len(nodes) != 3 or [node.op_type for node in nodes] != ["Cast", "Softmax", "Cast"]:
        return False
    types = [ctx.infos[name].dtype for name in (nodes[0].inputs[0], nodes[1].inputs[0], nodes[2].outputs[0])]
    return types == [np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float16)]


def _split_heads(info: TensorInfo, axis: int, groups: int, rep: int, rank: int | None = None) -> TensorInfo | None:
    """``info`` (broadcast against a product of rank ``rank``, its own by default) with axis ``axis`` of that product
    split into ``(groups, rep)``: the same bytes under the shape the split product reads; None where the axis is
    neither 1 nor ``groups * rep`` long."""
    shape = tuple(info.shape)
    shape = (1,) * ((rank or len(shape)) - len(shape)) + shape
    if len(shape) <= axis:
        return None
    parts = {1: (1, 1), groups * rep: (groups, rep)}.get(shape[axis])
    if parts is None:
        return None
    return TensorInfo(shape[:axis] + parts + shape[axis + 1 :], info.dtype)


def _split_permutation(perm: Sequence[int], axis: int) -> tuple[int, ...]:
    """``perm`` of a product whose axis ``axis`` is split in two, as a permutation of the split axes."""
    split: list[int] = []
    for p in perm:
        split += [axis, axis + 1] if p == axis else [p if p < axis else p + 1]
    return tuple(split)


def _written_perm(ctx: RewriteContext, last: GraphNode, transpose: GraphNode) -> tuple[int, ...]:
    return tuple(permutation(transpose.attrs, len(ctx.infos[last.outputs[0]].shape)))


def _operand_views(
    ctx: RewriteContext, matcher: GraphMatcher, first: GraphNode, last: GraphNode
) -> tuple[View, View, View] | None:
    """How the step reads Q, K^T and V (:meth:`GraphMatcher.view`), taking only nodes read inside the step: a Split
    whose other parts are read elsewhere stays a step of its own; V carries no factor (the kernel takes none). Where Q,
    K and V come from one packed projection, they are all read from it, past the split's shared nodes, if that takes
    more."""
    stop: frozenset[str] = frozenset()
    for _ in range(4):  # each round stops before the nodes read outside; the views only get shorter
        q = matcher.view(first.inputs[0], first, stop=stop)
        kt = matcher.view(first.inputs[1], first, stop=stop)
        v = matcher.view(last.inputs[1], last, stop=stop)
        if q is None or kt is None or v is None:
            return None
        outside = _read_outside(ctx, (first, last), (q, kt, v))
        if v[2] != 1.0:  # V scaled on the way (a factor on a shared packed projection): the factor stays a step
            outside |= {node.name for node in v[3] if node.op_type in ("Mul", "Div")}
        if not outside:
            break
        stop |= outside
    else:
        return None
    shared = frozenset(node.name for view in (q, kt, v) for node in view[3])
    if shared:
        wq = matcher.view(first.inputs[0], first, shared, stop)
        wk = matcher.view(first.inputs[1], first, shared, stop)
        wv = matcher.view(last.inputs[1], last, shared, stop)
        if (
            wq is not None
            and wk is not None
            and wv is not None
            and wv[2] == 1.0
            and not _read_outside(ctx, (first, last), (wq, wk, wv))
        ):
            widened = {node.name for view in (wq, wk, wv) for node in view[3]}
            if shared < widened:  # (a view that stops earlier, where a Reshape would copy, is no gain)
                return wq, wk, wv
    return q, kt, v


def _read_outside(ctx: RewriteContext, products: Sequence[GraphNode], views: Sequence[View]) -> frozenset[str]:
    """The nodes the operands' views absorb that something outside the step reads (a graph output, a node other than
    its two products and the views' nodes, or the step itself: one view's source produced inside another view):
    they cannot be taken into it."""
    members = {node.name for view in views for node in view[3]} | {node.name for node in products}
    sources = {view[0] for view in views}  # read by the step itself: their producers must still run
    outside = set()
    for view in views:
        for node in view[3]:
            for output in node.outputs:
                if (
                    output in ctx.graph_outputs
                    or output in sources
                    or any(user.name not in members for user in ctx.consumers.get(output, []))
                ):
                    outside.add(node.name)
    return frozenset(outside)


def _written_through(
    ctx: RewriteContext, matcher: GraphMatcher, last: GraphNode, folded: set[str]
) -> tuple[str, tuple[int, ...] | None, list[GraphNode]]:
    """Where the attention's output goes: (tensor, permutation, nodes).  A Transpose that is the only reader of the
    product (the heads moved back next to each other, as every exporter writes before the output projection) is
    written through: the kernel stores each element where the Transpose would put it, and the copy disappears."""
    product = last.outputs[0]
    user = matcher.only_user(product)
    if (
        user is None
        or user.op_type != "Transpose"
        or user.name in folded
        or not user.outputs
        or user.outputs[0] not in ctx.infos
    ):
        return product, None, []
    rank = len(ctx.infos[product].shape)
    try:
        perm = tuple(permutation(user.attrs, rank))
    except UnsupportedOpError:
        return product, None, []
    return user.outputs[0], perm, [user]


def fuse_attentions(
    ctx: RewriteContext, nodes: Sequence[GraphNode], folds: TransposeFolds
) -> dict[str, list[PlannedStep]]:
    """The attention steps of ``nodes``, keyed by the name of each group's last node (where the steps run): one fused
    step, or two (the Softmax folded into the second product) or more where the fused kernel does not take it.

    ``folds`` are the Transposes the planner would fold into MatMuls: a group takes those of its two MatMuls
    (or is not formed), so no Transpose is left both folded and unplanned.
    """
    producers = {out: node for node in nodes for out in node.outputs if out}
    matcher = _Matcher(ctx, producers)
    steps: dict[str, list[PlannedStep]] = {}
    taken: set[str] = set()
    folded_anywhere = {t.name for fold in folds.values() for t, _ in fold.values()}
    for node in nodes:
        if node.op_type != "MatMul" or node.domain != "" or node.name in taken:
            continue
        group = _match(ctx, matcher, node, folded_anywhere)
        if group is None:
            continue
        members = {name for step in group for name in step.node_names}
        last = group[-1].node_names[-1]
        products = [name for step in group for name, op in zip(step.node_names, step.op_types) if op == "MatMul"]
        folded = {t.name for index in products for t, _ in folds.get(index, {}).values()}
        if not folded <= members or members & taken:
            continue
        taken |= members
        steps[last] = group
    return steps
