"""Sibling projections merged: MatMuls that multiply one activation by constant weights run as one product.

A transformer layer multiplies its normalised hidden state by the query, key and value weights, and its gated MLP
by the gate and up weights: two or three products of the same ``A`` with ``N`` of a few hundred to a few thousand,
each its own dispatch, each too small at a short sequence to fill a large GPU.  Computed as one product against the
weights side by side (``[K, N_1 + ... + N_p]``, and the biases side by side), they cost one dispatch over ``p``
times the workgroups; the kernel stores each output's columns into that output
(:mod:`ortgpu.ops._output_layout`), so every consumer reads the tensor it read before.

:func:`merge_sibling_projections` runs on the planned steps, after the other rewrites, so a projection whose output
carries more than an affine map (a residual Add, an activation in its epilogue) is left as it was planned.  A step
joins a group when it is one MatMul on the device whose B is a 2-D constant (read as it is, no folded transpose) of
A's dtype, whose epilogue is nothing, one bias Add of a constant holding one value per column, scales by powers of
two (folded into its weights and bias exactly: an attention's ``1 / sqrt(64)`` on its query), or both, and whose A
(and A's folded transpose, if any) is the group's; a group larger than one kernel binds (:data:`MAX_OUTPUTS`, the
device's storage buffers, its binding size for the weights side by side) is merged in parts.  The merged step runs
where the group's first step ran (its inputs are A and constants, ready there) and is kept only if it plans on the
device as one MatMul.

The side-by-side weights are new constants (the originals stay, for plans of other shapes, but no longer go to the
device); they are computed and hashed once per model (the model's rewrite cache) while the weights are the same
arrays.  So the host holds those weights twice for the model's life: the price of planning other shapes without
concatenating them again.
"""

from __future__ import annotations

from typing import Any, Hashable, Optional, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from ._plan_types import PlannedStep, constant_digest
from .ops import DeviceCaps, NotOnDevice, TensorInfo
from .ops.ai_onnx.matmul import MatMul

__all__ = ["MAX_OUTPUTS", "merge_sibling_projections"]

#: At most this many projections in one product: its store finds an element's output by comparing its column with
#: each output's bounds in turn.
MAX_OUTPUTS = 8

#: Group key: A's tensor name, A's folded permutation (or None), K and the dtype.
_Key = tuple[str, Any, int, str]


#: What a member's epilogue does, folded into its weights: ``(weight factor, bias or None)``.
_Affine = tuple[float, Optional[np.ndarray]]


def _power_of_two(value: float) -> bool:
    """Whether multiplying by ``value`` is exact (barring overflow and underflow, which :func:`_scaled` checks)."""
    return value != 0.0 and bool(np.isfinite(value)) and abs(float(np.frexp(value)[0])) == 0.5


def _affine_epilogue(step: PlannedStep, constants: dict[str, np.ndarray], columns: int) -> _Affine | None:
    """The step's epilogue as a factor of its weights and a bias (one value per column, its own factors applied),
    or None when it is anything else: at most one Add of a constant with one value per column, and scales by
    powers of two (an attention's ``1 / sqrt(64)``), which multiply the weights and bias exactly, so the merged
    product equals the member's own."""
    factor, bias = 1.0, None
    for entry in tuple(step.attrs.get("_epilogue", ())):
        if entry[0] == "scale" and _power_of_two(float(entry[1])):
            factor *= float(entry[1])
            bias = None if bias is None else (bias[0] * float(entry[1]), bias[1])
        elif entry == ("add", 2) and bias is None and len(step.inputs) == 3:
            value = constants.get(step.inputs[2])
            if value is None or value.size != columns or (value.ndim and value.shape[-1] != columns):
                return None
            bias = (1.0, value.reshape(columns))
        else:
            return None
    if bias is None:
        return factor, None
    scaled = _scaled(bias[1], bias[0])
    return None if scaled is None else (factor, scaled)


def _scaled(value: np.ndarray, factor: float) -> np.ndarray | None:
    """``value * factor`` in its dtype, or None unless every element is exact (no overflow, no underflow)."""
    if factor == 1.0:
        return value
    scaled: np.ndarray = (value * np.asarray(factor, dtype=value.dtype)).astype(value.dtype)
    if not np.array_equal(scaled.astype(np.float64), value.astype(np.float64) * factor):
        return None
    return scaled


def _candidate(step: PlannedStep, constants: dict[str, np.ndarray]) -> tuple[_Key, np.ndarray, _Affine] | None:
    """``(key, B, its epilogue as an affine map)`` of a step that may join a group, or None."""
    if step.placement != "webgpu" or step.op_plan is None or not step.op_plan.kernels:
        return None  # (no kernel: an empty product, which has nothing to share)
    if not isinstance(step.operator, MatMul):
        return None
    if len(step.outputs) != 1 or len(step.inputs) < 2 or not step.inputs[0]:
        return None
    if "_output_perm" in step.attrs or "_input_views" in step.attrs:
        return None
    perms = step.attrs.get("_input_perms")
    a_perm, b_perm = (None, None) if perms is None else (perms[0], perms[1])
    weight = constants.get(step.inputs[1])
    a_info, out_info = step.input_infos[0], step.output_infos[0]
    if b_perm is not None or weight is None or weight.ndim != 2 or a_info is None:
        return None
    if weight.dtype != a_info.dtype or out_info.dtype != a_info.dtype or a_info.dtype not in (np.float32, np.float16):
        return None
    if not out_info.shape or out_info.shape[-1] != weight.shape[1]:
        return None
    affine = _affine_epilogue(step, constants, weight.shape[1])
    if affine is None or (affine[1] is not None and affine[1].dtype != weight.dtype):
        return None
    key = (step.inputs[0], None if a_perm is None else tuple(a_perm), int(weight.shape[0]), str(weight.dtype))
    return key, weight, affine


#: What :func:`_side_by_side` gives: the weights side by side, the biases (or None), and their digests.
_Combined = tuple[np.ndarray, Optional[np.ndarray], str, str]


def _side_by_side(
    members: Sequence[tuple[PlannedStep, np.ndarray, _Affine]],
    constants: dict[str, np.ndarray],
    cache: dict[Hashable, Any],
) -> _Combined | None:
    """The weights, each times its factor, side by side (and the biases, zeros where a member has none), with their
    digests (computed once, for the uploads' keys); None when a factor would not multiply a weight exactly.  Cached
    while the members' constants are the same arrays."""
    sources = tuple(constants.get(name) for step, _, _ in members for name in step.inputs[1:3])
    key = ("sibling_projections", tuple(step.name for step, _, _ in members), tuple(f for _, _, (f, _) in members))
    cached = cache.get(key)
    if cached is not None and len(cached[0]) == len(sources) and all(a is b for a, b in zip(cached[0], sources)):
        return cached[1]  # type: ignore[no-any-return]
    weights: list[np.ndarray] = []
    for _, original, (factor, _) in members:
        scaled = _scaled(original, factor)
        if scaled is None:
            break
        weights.append(scaled)
    result: _Combined | None = None
    if len(weights) == len(members):
        weight = np.ascontiguousarray(np.concatenate(weights, axis=1))
        bias = None
        if any(b is not None for _, _, (_, b) in members):
            bias = np.concatenate([np.zeros(w.shape[1], w.dtype) if b is None else b for _, w, (_, b) in members])
        result = (weight, bias, constant_digest(weight), "" if bias is None else constant_digest(bias))
    cache[key] = (sources, result)
    return result


def _fresh_name(base: str, taken: dict[str, Any]) -> str:
    name, index = base, 0
    while name in taken:
        index += 1
        name = f"{base}_{index}"
    return name


def _merged(
    members: Sequence[tuple[PlannedStep, np.ndarray, _Affine]],
    caps: DeviceCaps,
    constants: dict[str, np.ndarray],
    infos: dict[str, TensorInfo],
    cache: dict[Hashable, Any],
    digests: dict[str, str],
) -> PlannedStep | None:
    """One step computing every member's output, or None when it would not plan on the device."""
    first = members[0][0]
    combined = _side_by_side(members, constants, cache)
    if combined is None:
        return None
    weight, bias, weight_digest, bias_digest = combined
    weight_name = _fresh_name(f"{first.name}::sibling_weights", constants)
    inputs: list[str] = [first.inputs[0], weight_name]
    new = {weight_name: weight}
    attrs = {k: v for k, v in first.attrs.items() if k != "_epilogue"}
    if bias is not None:
        bias_name = _fresh_name(f"{first.name}::sibling_biases", constants)
        new[bias_name] = bias
        inputs.append(bias_name)
        attrs["_epilogue"] = (("add", 2),)
    new_infos = {name: TensorInfo(tuple(value.shape), value.dtype) for name, value in new.items()}
    input_infos = (first.input_infos[0],) + tuple(new_infos[name] for name in inputs[1:])
    output_infos = tuple(step.output_infos[0] for step, _, _ in members)
    known = {1: weight} if bias is None else {1: weight, 2: bias}
    try:
        op_plan = first.operator.plan(input_infos, output_infos, attrs, caps, known)
    except (NotOnDevice, UnsupportedOpError):
        return None
    if op_plan is None or not op_plan.kernels:
        return None
    constants.update(new)
    infos.update(new_infos)
    digests[weight_name] = weight_digest
    if bias is not None:
        digests[inputs[2]] = bias_digest
    names = tuple(name for step, _, _ in members for name in step.node_names)
    kinds = tuple(kind for step, _, _ in members for kind in step.op_types)
    return PlannedStep(
        names,
        kinds,
        "webgpu",
        f"WGSL kernel, {len(members)} projections of one input as one product",
        first.operator,
        attrs,
        tuple(inputs),
        tuple(step.outputs[0] for step, _, _ in members),
        input_infos,
        output_infos,
        op_plan,
    )


def _chunks(
    group: list[tuple[int, PlannedStep, np.ndarray, _Affine]], caps: DeviceCaps
) -> list[list[tuple[int, PlannedStep, np.ndarray, _Affine]]]:
    """``group`` in runs of members that one kernel can bind: at most :data:`MAX_OUTPUTS` outputs (and a binding
    each for A, B, the bias and a split-K scratch buffer besides), the weights side by side within one binding."""
    most = max(2, min(MAX_OUTPUTS, caps.limits.max_storage_buffers_per_shader_stage - 4))
    limit = caps.limits.max_storage_buffer_binding_size
    chunks: list[list[tuple[int, PlannedStep, np.ndarray, _Affine]]] = [[]]
    size = 0
    for member in group:
        weight = member[2]
        if chunks[-1] and (len(chunks[-1]) == most or size + weight.nbytes > limit):
            chunks.append([])
            size = 0
        chunks[-1].append(member)
        size += weight.nbytes
    return [chunk for chunk in chunks if len(chunk) >= 2]


def merge_sibling_projections(
    steps: Sequence[PlannedStep],
    caps: DeviceCaps,
    constants: dict[str, np.ndarray],
    infos: dict[str, TensorInfo],
    cache: dict[Hashable, Any],
    digests: dict[str, str],
) -> list[PlannedStep]:
    """``steps`` with each group of sibling projections as one step (see the module docstring); ``constants``,
    ``infos`` and ``digests`` gain the side-by-side weights and biases of the groups merged."""
    groups: dict[_Key, list[tuple[int, PlannedStep, np.ndarray, _Affine]]] = {}
    for index, step in enumerate(steps):
        found = _candidate(step, constants)
        if found is not None:
            key, weight, affine = found
            groups.setdefault(key, []).append((index, step, weight, affine))
    replaced: dict[int, PlannedStep] = {}
    dropped: set[int] = set()
    for group in groups.values():
        for members in _chunks(group, caps):
            merged = _merged([(s, w, b) for _, s, w, b in members], caps, constants, infos, cache, digests)
            if merged is None:
                continue
            replaced[members[0][0]] = merged
            dropped.update(index for index, _, _, _ in members[1:])
    return [replaced.get(index, step) for index, step in enumerate(steps) if index not in dropped]
