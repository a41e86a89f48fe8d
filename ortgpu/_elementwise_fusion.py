"""The elementwise-fusion rewrite: a connected group of elementwise steps runs as one kernel.

It runs on the planned steps, after the other rewrites (so a MatMul's epilogue and a fused attention keep their
nodes).  A step is fusable when it is one node whose plan is a single plain elementwise kernel (one that states
its per-element function: :attr:`~ortgpu.ops.KernelSpec.elementwise`; the unary, binary, comparison and Cast
families and the other operators built on :func:`~ortgpu.ops._wgsl_kernels.elementwise_kernel` do).  Walking the
steps from the last, a fusable step joins the group of its consumers when every consumer of its output is in
that one group, its output is float32 (held in a register in the fused kernel, bit for bit what the buffer would
hold) with the group's output shape, and it is no graph output.  So chains (``Add -> Sqrt -> Reciprocal``),
diamonds (``x * Sigmoid(x)``) and trees (rotary embedding's ``q * cos + rot * sin``) fuse, and a value read by
anything outside the group stays a step of its own.

The fused kernel evaluates each member's function in order per output element, reading each outside input (a
*leaf*) once with numpy broadcasting into the group's output shape; the members' helper functions are included
once each (a group whose members' helpers would define one name twice is not formed).
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import numpy as np

from ._plan_types import PlannedStep
from .ops import DeviceCaps, KernelSpec, NotOnDevice, Operator, OpPlan, TensorInfo
from .ops._kernel import Binding, ElementwiseExpression
from .ops._tiling import whole_op_twin
from .ops._wgsl import (
    LINEAR_INVOCATION,
    broadcast_index_function,
    check_binding_sizes,
    elements_per_invocation,
    grid_for,
    kernel_entry,
    load_function,
    storage_declaration,
    store_statements,
    wgsl_compute_type,
    workgroup_size_for,
)

__all__ = ["FusedElementwise", "fuse_elementwise"]

_FUNCTION_NAME = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")


class FusedElementwise(Operator):
    """The operator of a fused elementwise group: its reference runs the members' references in order."""

    op_type = "FusedElementwise"
    since_version = 1
    domain = "ortgpu.fused"

    def __init__(self, members: Sequence[PlannedStep], leaves: Sequence[str]) -> None:
        super().__init__(1)
        self.members = tuple(members)
        self.leaves = tuple(leaves)

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        values: dict[str, np.ndarray | None] = dict(zip(self.leaves, inputs))
        for step in self.members:
            arrays = [values[name] if name else None for name in step.inputs]
            values[step.outputs[0]] = step.operator.reference(arrays, step.attrs, step.output_infos)[0]
        result = values[self.members[-1].outputs[0]]
        assert result is not None
        return [result]


def _expression(step: PlannedStep) -> ElementwiseExpression | None:
    """The step's per-element function, when it is one node planned as one plain elementwise kernel."""
    plan = step.op_plan
    if (
        step.placement != "webgpu"
        or plan is None
        or len(step.node_names) != 1
        or len(step.outputs) != 1
        or len(plan.kernels) != 1
        or plan.scratch_sizes
        or plan.alias
    ):
        return None
    return plan.kernels[0].elementwise


def _helper_names(helpers: str) -> set[str]:
    return set(_FUNCTION_NAME.findall(helpers))


def fuse_elementwise(steps: Sequence[PlannedStep], graph_outputs: set[str], caps: DeviceCaps) -> list[PlannedStep]:
    """``steps`` with each group of two or more fusable steps replaced by one step at its last member's place."""
    expressions = [_expression(step) for step in steps]
    consumers: dict[str, set[int]] = {}
    for index, step in enumerate(steps):
        for name in step.inputs:
            if name:
                consumers.setdefault(name, set()).add(index)
    group_of: dict[int, int] = {}  # step index -> the index of its group's last step (the root)
    members: dict[int, list[int]] = {}
    limit = caps.limits.max_storage_buffers_per_shader_stage
    for index in range(len(steps) - 1, -1, -1):
        expression = expressions[index]
        if expression is None:
            continue
        step = steps[index]
        out = step.outputs[0]
        users = consumers.get(out, set())
        roots = {group_of.get(user) for user in users}
        root = next(iter(roots)) if len(roots) == 1 else None
        joined = False
        if (
            root is not None
            and out not in graph_outputs
            and step.output_infos[0].dtype == np.float32
            and step.output_infos[0].shape == steps[root].output_infos[0].shape
        ):
            candidate = [index] + members[root]
            if _bindings(steps, candidate) <= limit and _helpers(expressions, candidate) is not None:
                members[root] = candidate
                group_of[index] = root
                joined = True
        if not joined:
            group_of[index] = index
            members[index] = [index]
    fused: dict[int, PlannedStep] = {}
    dropped: set[int] = set()
    for root, group in members.items():
        if len(group) < 2:
            continue
        try:
            fused[root] = _fused_step([steps[i] for i in group], [expressions[i] for i in group], caps)
        except NotOnDevice:
            continue
        dropped.update(group)
    return [fused.get(index, step) for index, step in enumerate(steps) if index not in dropped or index in fused]


def _leaves(steps: Sequence[PlannedStep]) -> list[str]:
    """The group's outside inputs, in order of first use."""
    produced = {step.outputs[0] for step in steps}
    leaves: list[str] = []
    for step in steps:
        for name in step.inputs:
            if name and name not in produced and name not in leaves:
                leaves.append(name)
    return leaves


def _bindings(steps: Sequence[PlannedStep], group: Sequence[int]) -> int:
    return len(_leaves([steps[i] for i in group])) + 1


def _helpers(expressions: Sequence[ElementwiseExpression | None], group: Sequence[int]) -> str | None:
    """The group's helper functions, each text once; None when two different texts define one name."""
    texts: list[str] = []
    names: set[str] = set()
    for index in group:
        expression = expressions[index]
        assert expression is not None
        if not expression.helpers.strip() or expression.helpers in texts:
            continue
        declared = _helper_names(expression.helpers)
        if declared & names:
            return None
        names |= declared
        texts.append(expression.helpers)
    return "".join(texts)


def _fused_step(
    members: Sequence[PlannedStep], expressions: Sequence[ElementwiseExpression | None], caps: DeviceCaps
) -> PlannedStep:
    """One step computing the group ``members`` (in plan order; the last is the root) with one kernel."""
    root = members[-1]
    output = root.output_infos[0]
    leaves = _leaves(members)
    infos: dict[str, TensorInfo] = {}
    for step in members:
        for name, info in zip(step.inputs, step.input_infos):
            if name and info is not None:
                infos[name] = info
    leaf_infos = tuple(infos[name] for name in leaves)
    check_binding_sizes("fused elementwise", list(leaf_infos) + [output], caps)
    helpers = _helpers(expressions, range(len(members)))
    assert helpers is not None
    parts = [storage_declaration(slot, f"in{slot}", writable=False) for slot in range(len(leaves))]
    parts.append(storage_declaration(len(leaves), "dst", writable=True))
    lines = []
    for slot, info in enumerate(leaf_infos):
        parts.append(load_function(f"load{slot}", f"in{slot}", info.dtype))
        parts.append(broadcast_index_function(f"index{slot}", info.shape, output.shape))
        lines.append(f"  let l{slot} = load{slot}(index{slot}(j));\n")
    parts.append(helpers)
    values = {name: f"l{slot}" for slot, name in enumerate(leaves)}
    for number, (step, expression) in enumerate(zip(members, expressions)):
        assert expression is not None
        operand_infos = [step.input_infos[i] for i in expression.input_indices]
        params = "".join(
            f", x{k}: {wgsl_compute_type(info.dtype)}" for k, info in enumerate(operand_infos) if info is not None
        )
        out_type = wgsl_compute_type(step.output_infos[0].dtype)
        parts.append(f"fn member{number}(j: u32{params}) -> {out_type} {{\n  return {expression.expression};\n}}\n")
        arguments = "".join(f", {values[step.inputs[i]]}" for i in expression.input_indices)
        lines.append(f"  let t{number} = member{number}(j{arguments});\n")
        values[step.outputs[0]] = f"t{number}"
    parts.append(
        f"fn value(j: u32) -> {wgsl_compute_type(output.dtype)} {{\n{''.join(lines)}  return t{len(members) - 1};\n}}\n"
    )
    per = elements_per_invocation(output.dtype.itemsize)
    invocations = -(-output.size // per)
    workgroup = workgroup_size_for(caps.limits)
    guard = f"  let w = {LINEAR_INVOCATION};\n  if (w >= {invocations}u) {{ return; }}\n"
    operator = FusedElementwise(members, leaves)
    bindings = tuple(Binding("input", slot) for slot in range(len(leaves))) + (Binding("output", 0),)
    twin = whole_op_twin(lambda full: operator.reference(full, {}, (output,)), bindings, leaf_infos, (output,))
    kernel = KernelSpec(
        "FusedElementwise",
        "".join(parts) + kernel_entry(workgroup, guard + store_statements(output.dtype, output.size, "value")),
        grid_for(invocations, workgroup, caps.limits),
        bindings,
        twin,
    )
    names = tuple(name for step in members for name in step.node_names)
    return PlannedStep(
        names,
        tuple(op for step in members for op in step.op_types),
        "webgpu",
        f"WGSL kernel, fused elementwise {'+'.join(step.op_type for step in members)}",
        operator,
        {},
        tuple(leaves),
        (root.outputs[0],),
        leaf_infos,
        (output,),
        OpPlan(kernels=(kernel,)),
    )
