"""Transposes folded into the LayerNormalization after them: the normalisation reads each element where the
Transpose would have taken it from.

ConvNeXt normalises channels-first activations over their channels as ``Permute(0, 2, 3, 1) -> LayerNorm(C)``
(torchvision's blocks, timm's ``LayerNorm2d``), and Swin's patch embedding does the same once: a copy kernel over the
whole activation before every such LayerNorm.  :func:`fold_input_transposes` gives the LayerNormalization the
attribute ``_input_perm`` instead (:mod:`ortgpu.ops.ai_onnx.layer_normalization`), and it reads the Transpose's
input through the permuted strides.

It runs on the planned steps, after :func:`ortgpu._output_transposes.fold_output_transposes` (a product that can store
transposed does, and nothing reads strided): a step that is one Transpose on the device, whose output is no graph
output and is read by nothing but one LayerNormalization step, as its X only, is taken into that step where the
LayerNormalization still plans on the device with it.  The folded step runs where the LayerNormalization ran.
"""

from __future__ import annotations

from typing import Sequence

from ortgpu_core._errors import UnsupportedOpError

from ._plan_types import PlannedStep
from ._rewrites import RewriteContext, step_readers
from .ops import NotOnDevice
from .ops.ai_onnx.layer_normalization import LayerNormalization
from .ops.ai_onnx.transpose import permutation

__all__ = ["fold_input_transposes"]


def _folded(ctx: RewriteContext, transpose: PlannedStep, norm: PlannedStep) -> PlannedStep | None:
    """``norm`` reading X through ``transpose``'s permutation, or None where it cannot."""
    source = transpose.input_infos[0] if transpose.input_infos else None
    if source is None or len(source.shape) < 2:
        return None
    try:
        perm = tuple(permutation(transpose.attrs, len(source.shape)))
    except UnsupportedOpError:
        return None
    attrs = {**norm.attrs, "_input_perm": perm}
    inputs = (transpose.inputs[0],) + norm.inputs[1:]
    input_infos = (source,) + norm.input_infos[1:]
    try:
        op_plan = norm.operator.plan(input_infos, norm.output_infos, attrs, ctx.caps, ctx.constants_of(list(inputs)))
    except (NotOnDevice, UnsupportedOpError):
        return None
    if op_plan is None or not op_plan.kernels:
        return None
    return PlannedStep(
        transpose.node_names + norm.node_names,
        transpose.op_types + norm.op_types,
        "webgpu",
        f"{norm.reason}, its input read through the Transpose before it",
        norm.operator,
        attrs,
        inputs,
        norm.outputs,
        input_infos,
        norm.output_infos,
        op_plan,
    )


def fold_input_transposes(steps: Sequence[PlannedStep], ctx: RewriteContext) -> list[PlannedStep]:
    """``steps`` with each Transpose read only as a LayerNormalization's X folded into that step's reads (see the
    module docstring)."""
    readers = step_readers(steps)
    replaced: dict[int, PlannedStep] = {}
    dropped: set[int] = set()
    for index, step in enumerate(steps):
        if step.op_types != ("Transpose",) or step.placement != "webgpu" or len(step.outputs) != 1:
            continue
        name = step.outputs[0]
        users = readers.get(name, [])
        nodes = ctx.consumers.get(name, [])
        if name in ctx.graph_outputs or len(users) != 1 or len(nodes) != 1 or users[0] in replaced:
            continue
        norm = steps[users[0]]
        if (
            not isinstance(norm.operator, LayerNormalization)
            or norm.placement != "webgpu"
            or "_input_perm" in norm.attrs
            or norm.inputs[:1] != (name,)
            or name in norm.inputs[1:]
            or nodes[0].name not in norm.node_names
        ):
            continue
        folded = _folded(ctx, step, norm)
        if folded is not None:
            replaced[users[0]] = folded
            dropped.add(index)
    return [replaced.get(index, step) for index, step in enumerate(steps) if index not in dropped]
