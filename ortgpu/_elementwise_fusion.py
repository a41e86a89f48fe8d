"""The elementwise-fusion rewrite: a connected group of elementwise and data-movement steps runs as one kernel.

It runs on the planned steps, after the other rewrites (so a MatMul's epilogue and a fused attention keep their
nodes).  A step is fusable when it is one node whose plan is a single kernel that states its per-element rule:
an elementwise kernel's function of its inputs (:attr:`~ortgpu.ops.KernelSpec.elementwise`: the unary, binary,
comparison and Cast families and the others built on :func:`~ortgpu.ops._wgsl_kernels.elementwise_kernel`) or a
data-movement kernel's source of each element (:attr:`~ortgpu.ops.KernelSpec.gather`: Transpose, Slice, Concat,
Expand and the others built on :func:`~ortgpu.ops._wgsl_kernels.gather_kernel` without auxiliary inputs); a view
(Reshape, Unsqueeze...: no kernel, its input's buffer) joins as the identity.
Walking the steps from the last, a fusable step joins the group of its consumers when every consumer of its output
is in that one group, its output is float32 (a register value in the fused kernel, bit for bit what the buffer
would hold) and no graph output.  So chains (``Add -> Sqrt -> Reciprocal``), broadcasts into a larger shape,
diamonds (``x * Sigmoid(x)``) and rotary embedding (``Transpose``, ``Slice``, ``Neg``, ``Concat``, then
``q * cos + r * sin``) fuse, and a value read by anything outside the group stays a step of its own.

In the fused kernel each member is a WGSL function of its own output index: an elementwise member reads each
input at the index broadcasting gives, a data-movement member at the index its rule gives; an outside input (a
*leaf*) is read from its buffer, a member's output by calling that member.  A member used from several places is
evaluated at each (the compiler merges evaluations at one index); a group whose members would be evaluated more
than :data:`MAX_EVALUATIONS` times per element of the result is not formed.  The members' helper functions are
included once each (a group whose helpers would define one name twice is not formed).
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import numpy as np

from ._plan_types import PlannedStep
from .ops import DeviceCaps, KernelSpec, NotOnDevice, Operator, OpPlan, TensorInfo
from .ops._kernel import Binding, ElementwiseExpression, GatherExpression
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

    def __init__(self, members: Sequence[PlannedStep], leaves: Sequence[str], fixed: Mapping[str, np.ndarray]) -> None:
        super().__init__(1)
        self.members = tuple(members)
        self.leaves = tuple(leaves)
        #: the members' inputs their kernels do not read (a Slice's starts and ends: constants baked into its rule)
        self.fixed = dict(fixed)

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        values: dict[str, np.ndarray | None] = {**self.fixed, **dict(zip(self.leaves, inputs))}
        for step in self.members:
            arrays = [values[name] if name else None for name in step.inputs]
            values[step.outputs[0]] = step.operator.reference(arrays, step.attrs, step.output_infos)[0]
        result = values[self.members[-1].outputs[0]]
        assert result is not None
        return [result]


#: The most evaluations of members per element of a group's result (members used from several places count once per
#: use): a bound on the work recomputation can add.
MAX_EVALUATIONS = 24

Rule = ElementwiseExpression | GatherExpression


#: The rule of a step whose output is its first input's buffer under another shape (Reshape, Squeeze, Unsqueeze,
#: Flatten, Identity): element ``j`` is element ``j`` of that input.
_ALIAS_RULE = GatherExpression((0,), "fn source(j: u32) -> vec2<u32> {\n  return vec2<u32>(0u, j);\n}\n")


def _rule(step: PlannedStep) -> Rule | None:
    """The step's per-element rule, when it is one node planned as one kernel that states one, or as a view of its
    first input (float32: a fused group then reads through it)."""
    plan = step.op_plan
    if step.placement != "webgpu" or plan is None or len(step.node_names) != 1 or len(step.outputs) != 1:
        return None
    if not plan.kernels and dict(plan.alias) == {0: 0} and not plan.scratch_sizes:
        source = step.input_infos[0]
        same = source is not None and source.size == step.output_infos[0].size
        return _ALIAS_RULE if same and step.output_infos[0].dtype == np.float32 else None
    if len(plan.kernels) != 1 or plan.scratch_sizes or plan.alias:
        return None
    kernel = plan.kernels[0]
    return kernel.elementwise if kernel.elementwise is not None else kernel.gather


def _reads(rule: Rule) -> tuple[int, ...]:
    return rule.input_indices


def _helper_names(helpers: str) -> set[str]:
    return set(_FUNCTION_NAME.findall(helpers))


def fuse_elementwise(
    steps: Sequence[PlannedStep], graph_outputs: set[str], caps: DeviceCaps, constants: Mapping[str, np.ndarray]
) -> list[PlannedStep]:
    """``steps`` with each group of two or more fusable steps replaced by one step at its last member's place.
    ``constants``: the plan's constant values (the inputs a member's kernel does not read must be among them)."""
    rules = [_rule(step) for step in steps]
    for index, rule in enumerate(rules):
        if rule is not None and any(name not in constants for name in _unread(steps[index], rule)):
            rules[index] = None
    consumers: dict[str, set[int]] = {}
    for index, step in enumerate(steps):
        for name in step.inputs:
            if name:
                consumers.setdefault(name, set()).add(index)
    group_of: dict[int, int] = {}  # step index -> the index of its group's last step (the root)
    members: dict[int, list[int]] = {}
    limit = caps.limits.max_storage_buffers_per_shader_stage
    for index in range(len(steps) - 1, -1, -1):
        if rules[index] is None:
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
            and all(_read_only_by_rule(steps[user], rules[user], out) for user in users)
        ):
            candidate = [index] + members[root]
            if (
                _bindings(steps, rules, candidate) <= limit
                and _helpers(rules, candidate) is not None
                and _evaluations(steps, rules, candidate) <= MAX_EVALUATIONS
            ):
                members[root] = candidate
                group_of[index] = root
                joined = True
        if not joined:
            group_of[index] = index
            members[index] = [index]
    fused: dict[int, PlannedStep] = {}
    dropped: set[int] = set()
    for root, group in members.items():
        if len(group) < 2 or all(_is_view(steps[i]) for i in group):
            continue  # views alone cost nothing: fused, they would become a copy
        try:
            fused[root] = _fused_step([steps[i] for i in group], [rules[i] for i in group], caps, constants)
        except NotOnDevice:
            continue
        dropped.update(group)
    return [fused.get(index, step) for index, step in enumerate(steps) if index not in dropped or index in fused]


def _is_view(step: PlannedStep) -> bool:
    """Whether the step runs no kernel (a view of its input's buffer)."""
    return step.op_plan is not None and not step.op_plan.kernels


def _read_only_by_rule(user: PlannedStep, rule: Rule | None, name: str) -> bool:
    """Whether ``user`` reads ``name`` only through its rule (every input position holding it is one the rule
    reads)."""
    if rule is None:
        return False
    return all(position in rule.input_indices for position, used in enumerate(user.inputs) if used == name)


def _unread(step: PlannedStep, rule: Rule) -> set[str]:
    """The step's inputs its kernel does not read."""
    read = {step.inputs[position] for position in rule.input_indices}
    return {name for name in step.inputs if name and name not in read}


def _leaves(steps: Sequence[PlannedStep], rules: Sequence[Rule | None]) -> list[str]:
    """The group's outside inputs its kernels read, in order of first use."""
    produced = {step.outputs[0] for step in steps}
    leaves: list[str] = []
    for step, rule in zip(steps, rules):
        assert rule is not None
        for position in rule.input_indices:
            name = step.inputs[position]
            if name and name not in produced and name not in leaves:
                leaves.append(name)
    return leaves


def _bindings(steps: Sequence[PlannedStep], rules: Sequence[Rule | None], group: Sequence[int]) -> int:
    return len(_leaves([steps[i] for i in group], [rules[i] for i in group])) + 1


def _evaluations(steps: Sequence[PlannedStep], rules: Sequence[Rule | None], group: Sequence[int]) -> int:
    """How many member evaluations one element of the group's result costs (group in plan order, root last)."""
    count = {group[-1]: 1}
    producer = {steps[i].outputs[0]: i for i in group}
    for index in reversed(group):
        rule = rules[index]
        assert rule is not None
        for position in rule.input_indices:
            source = producer.get(steps[index].inputs[position])
            if source is not None:
                count[source] = count.get(source, 0) + count.get(index, 0)
    return sum(count.values())


def _helpers(rules: Sequence[Rule | None], group: Sequence[int]) -> str | None:
    """The group's elementwise helper functions, each text once; None when two texts define one name."""
    texts: list[str] = []
    names: set[str] = set()
    for index in group:
        rule = rules[index]
        if not isinstance(rule, ElementwiseExpression) or not rule.helpers.strip() or rule.helpers in texts:
            continue
        declared = _helper_names(rule.helpers)
        if declared & names:
            return None
        names |= declared
        texts.append(rule.helpers)
    return "".join(texts)


def _renamed(source_function: str, suffix: str) -> str:
    """A gather rule's WGSL with every function it defines renamed ``<name>_<suffix>`` (its calls too)."""
    for name in sorted(_helper_names(source_function), key=len, reverse=True):
        source_function = re.sub(rf"\b{name}\s*\(", f"{name}_{suffix}(", source_function)
    return source_function


def _fused_step(
    members: Sequence[PlannedStep],
    rules: Sequence[Rule | None],
    caps: DeviceCaps,
    constants: Mapping[str, np.ndarray],
) -> PlannedStep:
    """One step computing the group ``members`` (in plan order; the last is the root) with one kernel."""
    root = members[-1]
    output = root.output_infos[0]
    leaves = _leaves(members, rules)
    fixed = {name: constants[name] for step, rule in zip(members, rules) if rule for name in _unread(step, rule)}
    infos: dict[str, TensorInfo] = {}
    for step in members:
        for name, info in zip(step.inputs, step.input_infos):
            if name and info is not None:
                infos[name] = info
    leaf_infos = tuple(infos[name] for name in leaves)
    check_binding_sizes("fused elementwise", list(leaf_infos) + [output], caps)
    helpers = _helpers(rules, range(len(members)))
    assert helpers is not None
    parts = [storage_declaration(slot, f"in{slot}", writable=False) for slot in range(len(leaves))]
    parts.append(storage_declaration(len(leaves), "dst", writable=True))
    for slot, info in enumerate(leaf_infos):
        parts.append(load_function(f"load{slot}", f"in{slot}", info.dtype))
    parts.append(helpers)
    reader = {name: f"load{slot}" for slot, name in enumerate(leaves)}  # name -> WGSL fn(index) -> value
    for number, (step, rule) in enumerate(zip(members, rules)):
        out_info = step.output_infos[0]
        out_type = wgsl_compute_type(out_info.dtype)
        if isinstance(rule, ElementwiseExpression):
            lets = []
            params = []
            for k, position in enumerate(rule.input_indices):
                info = step.input_infos[position]
                assert info is not None
                index_fn = f"at{number}_{k}"
                parts.append(broadcast_index_function(index_fn, info.shape, out_info.shape))
                lets.append(f"  let x{k} = {reader[step.inputs[position]]}({index_fn}(j));\n")
                params.append(k)
            parts.append(
                f"fn member{number}(j: u32) -> {out_type} {{\n{''.join(lets)}  return {rule.expression};\n}}\n"
            )
        else:
            assert rule is not None
            parts.append(_renamed(rule.source_function, f"m{number}"))
            lines = [f"fn member{number}(j: u32) -> {out_type} {{\n  let sk = source_m{number}(j);\n"]
            for s, position in enumerate(rule.input_indices):
                value = f"{reader[step.inputs[position]]}(sk.y)"
                if s + 1 < len(rule.input_indices):
                    lines.append(f"  if (sk.x == {s}u) {{ return {value}; }}\n")
                else:
                    lines.append(f"  return {value};\n")
            parts.append("".join(lines) + "}\n")
        reader[step.outputs[0]] = f"member{number}"
    parts.append(
        f"fn value(j: u32) -> {wgsl_compute_type(output.dtype)} {{\n  return member{len(members) - 1}(j);\n}}\n"
    )
    per = elements_per_invocation(output.dtype.itemsize)
    invocations = -(-output.size // per)
    workgroup = workgroup_size_for(caps.limits)
    guard = f"  let w = {LINEAR_INVOCATION};\n  if (w >= {invocations}u) {{ return; }}\n"
    operator = FusedElementwise(members, leaves, fixed)
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
