"""Transposes folded into the MatMul before them: the product is stored where the Transpose would have put it.

An attention left unfused (longer than the fused kernel takes) ends with ``scores @ V`` of shape ``[B, H, S, D]``
and a Transpose to ``[B, S, H, D]`` before the heads are merged by a Reshape: a copy kernel over the whole output
every layer.  :func:`fold_output_transposes` gives such a MatMul the attribute ``_output_perm`` instead, and its
kernel stores each element at its transposed place (:mod:`ortgpu.ops._output_layout`); the Reshape after it is then
an alias, as it would have been of the Transpose's output.

It runs on the planned steps, before the elementwise fusion (which would take the Transpose into a copy kernel):
a step that is one MatMul on the device (any epilogue; its extra inputs are read in the product's layout, as
before), whose one output is read by nothing but one Transpose step and is no graph output, takes the Transpose
when its permutation keeps the last axis last (a row of outputs stays contiguous, the stores coalesce) and the
MatMul still plans on the device with it.  The folded step runs where the MatMul ran.
"""

from __future__ import annotations

from typing import Sequence

from ortgpu_core._errors import UnsupportedOpError

from ._plan_types import PlannedStep
from ._rewrites import RewriteContext, step_readers
from .ops import NotOnDevice
from .ops._output_layout import store_permutation
from .ops.ai_onnx.matmul import MatMul
from .ops.ai_onnx.transpose import permutation

__all__ = ["fold_output_transposes"]


def _transpose_of(step: PlannedStep) -> tuple[int, ...] | None:
    """The permutation of a step that is one Transpose on the device, else None."""
    if step.op_types != ("Transpose",) or step.placement != "webgpu" or len(step.outputs) != 1:
        return None
    info = step.input_infos[0] if step.input_infos else None
    if info is None:
        return None
    try:
        return tuple(permutation(step.attrs, len(info.shape)))
    except UnsupportedOpError:
        return None


def _folded(ctx: RewriteContext, product: PlannedStep, transpose: PlannedStep) -> PlannedStep | None:
    """``product`` storing its output as ``transpose`` would have laid it out, or None when it cannot."""
    perm = _transpose_of(transpose)
    if perm is None or len(perm) < 3:
        return None
    try:
        store = store_permutation(perm, len(perm))
    except ValueError:
        return None  # moves the last axis: the stores would scatter
    if store is None:
        return None
    attrs = dict(product.attrs)
    attrs["_output_perm"] = store
    outputs = (transpose.output_infos[0],)
    try:
        op_plan = product.operator.plan(
            product.input_infos, outputs, attrs, ctx.caps, ctx.constants_of(list(product.inputs))
        )
    except (NotOnDevice, UnsupportedOpError):
        return None
    if op_plan is None or not op_plan.kernels:
        return None
    return PlannedStep(
        product.node_names + transpose.node_names,
        product.op_types + transpose.op_types,
        "webgpu",
        f"{product.reason}, output transposed in its store",
        product.operator,
        attrs,
        product.inputs,
        transpose.outputs,
        product.input_infos,
        outputs,
        op_plan,
    )


def fold_output_transposes(steps: Sequence[PlannedStep], ctx: RewriteContext) -> list[PlannedStep]:
    """``steps`` with each Transpose that only re-lays-out a MatMul's product folded into its store (see the module
    docstring)."""
    readers = step_readers(steps)
    replaced: dict[int, PlannedStep] = {}
    dropped: set[int] = set()
    for index, step in enumerate(steps):
        if not isinstance(step.operator, MatMul) or step.placement != "webgpu" or step.op_plan is None:
            continue
        if len(step.outputs) != 1 or "_output_perm" in step.attrs:
            continue
        name = step.outputs[0]
        users = readers.get(name, [])
        nodes = ctx.consumers.get(name, [])
        if name in ctx.graph_outputs or len(users) != 1 or len(nodes) != 1:
            continue
        transpose = steps[users[0]]
        if transpose.node_names != (nodes[0].name,) or list(transpose.inputs[:1]) != [name]:
            continue
        folded = _folded(ctx, step, transpose)
        if folded is not None:
            replaced[index] = folded
            dropped.add(users[0])
    return [replaced.get(index, step) for index, step in enumerate(steps) if index not in dropped]
