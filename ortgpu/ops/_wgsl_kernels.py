"""The generic kernel templates most operators instantiate, built on the helpers of :mod:`ortgpu.ops._wgsl`.

:func:`elementwise_kernel` is the generic n-ary elementwise kernel with numpy
broadcasting used by the unary, binary and comparison operators and Cast
(:func:`elementwise_plan`: its one-kernel :class:`~ortgpu.ops.OpPlan`).
:func:`gather_kernel` is the generic data-movement kernel: each output element
is copied bit for bit from an element of one of several sources, chosen by a
WGSL ``source`` function the operator writes (Transpose, Concat, Slice,
Gather, Where, ...).  Shapes, strides and scalar attributes are baked into the
WGSL text as constants (pipelines are cached by text); no string from the
model ever reaches the WGSL.  Buffers are ``array<u32>`` read and written by
numpy's C layout (the storage model of :mod:`ortgpu.ops._wgsl`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ortgpu_core.backends.protocol import DeviceLimits, KernelTwin

from ._kernel import (
    Binding,
    DeviceCaps,
    ElementwiseExpression,
    GatherExpression,
    KernelSpec,
    NotOnDevice,
    OpPlan,
    TensorInfo,
    reference_twin,
)
from ._wgsl import (
    LINEAR_INVOCATION,
    broadcast_index_function,
    check_binding_count,
    check_binding_sizes,
    elements_per_invocation,
    grid_for,
    kernel_entry,
    load_function,
    raw_load_function,
    storage_declaration,
    store_statements,
    wgsl_compute_type,
    workgroup_size_for,
)

__all__ = [
    "kernel_bindings",
    "Operand",
    "elementwise_kernel",
    "elementwise_plan",
    "gather_kernel",
]


def kernel_bindings(input_count: int) -> list[Binding]:
    """The bindings of an :func:`elementwise_kernel` over node inputs ``0 .. input_count-1`` (for twins)."""
    return [Binding("input", i) for i in range(input_count)] + [Binding("output", 0)]


@dataclass(frozen=True)
class Operand:
    """One input of an elementwise kernel: which node input it is and how it is read."""

    input_index: int
    info: TensorInfo
    #: read int64 as ``vec2<u32>(low, high)`` instead of its low word as ``i32``.
    int64_pair: bool = False


def elementwise_kernel(
    name: str,
    operands: Sequence[Operand],
    output: TensorInfo,
    expression: str,
    caps: DeviceCaps,
    twin: KernelTwin,
    *,
    helpers: str = "",
    pair_output: bool = False,
) -> KernelSpec:
    """A kernel computing ``output[j] = expression`` for every output element, with numpy broadcasting.

    ``expression`` is WGSL in terms of ``x0, x1, ...`` (operand values in their
    compute types, see :func:`wgsl_compute_type`) and must have the output's
    compute type (``bool`` for bool outputs).  ``helpers`` is WGSL placed before
    the kernel (functions the expression calls).  Binding ``i`` is operand ``i``,
    the last binding the output.  ``twin`` must do on the bound bytes what the
    kernel does (usually :func:`~ortgpu.ops._kernel.reference_twin`).
    ``pair_output``: the output is int64/uint64/float64 and ``expression`` is
    its bits as ``vec2<u32>(low, high)`` (see :data:`INT64_WGSL`).
    """
    if pair_output:
        if output.dtype.itemsize != 8:
            raise NotOnDevice(f"{name}: a pair output must be an 8-byte dtype, not {output.dtype.name}")
        out_type = "vec2<u32>"
    else:
        out_type = wgsl_compute_type(output.dtype)
    count = output.size
    limits = caps.limits
    check_binding_count(name, len(operands) + 1, caps)
    check_binding_sizes(name, [op.info for op in operands] + [output], caps)
    parts: list[str] = []
    for slot in range(len(operands)):
        parts.append(storage_declaration(slot, f"in{slot}", writable=False))
    parts.append(storage_declaration(len(operands), "dst", writable=True))
    lets = []
    for slot, operand in enumerate(operands):
        parts.append(load_function(f"load{slot}", f"in{slot}", operand.info.dtype, int64_pair=operand.int64_pair))
        parts.append(broadcast_index_function(f"index{slot}", operand.info.shape, output.shape))
        lets.append(f"  let x{slot} = load{slot}(index{slot}(j));\n")
    parts.append(helpers)
    parts.append(f"fn value(j: u32) -> {out_type} {{\n{''.join(lets)}  return {expression};\n}}\n")
    per = elements_per_invocation(output.dtype.itemsize)
    invocations = -(-count // per)
    body = store_statements(output.dtype, count, "value", pair_output)
    bindings = tuple(Binding("input", op.input_index) for op in operands) + (Binding("output", 0),)
    kernel = _linear_kernel(name, parts, body, invocations, bindings, twin, limits)
    if pair_output or any(op.int64_pair for op in operands):
        return kernel
    meta = ElementwiseExpression(tuple(op.input_index for op in operands), expression, helpers)
    return dataclasses.replace(kernel, elementwise=meta)


def _linear_kernel(
    name: str,
    parts: list[str],
    body: str,
    invocations: int,
    bindings: tuple[Binding, ...],
    twin: KernelTwin,
    limits: DeviceLimits,
) -> KernelSpec:
    """The kernel of WGSL ``parts`` whose entry runs ``body`` once per invocation ``w`` below ``invocations``."""
    workgroup = workgroup_size_for(limits)
    guard = f"  let w = {LINEAR_INVOCATION};\n  if (w >= {invocations}u) {{ return; }}\n"
    return KernelSpec(
        name=name,
        wgsl="".join(parts) + kernel_entry(workgroup, guard + body),
        grid=grid_for(invocations, workgroup, limits),
        bindings=bindings,
        twin=twin,
    )


def gather_kernel(
    name: str,
    sources: Sequence[tuple[Binding, TensorInfo]],
    auxiliaries: Sequence[tuple[Binding, TensorInfo]],
    output: TensorInfo,
    source_function: str,
    caps: DeviceCaps,
    twin: KernelTwin,
    *,
    output_index: int = 0,
    status: bool = False,
) -> KernelSpec:
    """A data-movement kernel: output element ``j`` is a bit-exact copy of one source element.

    ``source_function`` is WGSL defining ``fn source(j: u32) -> vec2<u32>``
    returning ``(s, k)``: copy element ``k`` of source ``s`` (0-based into
    ``sources``).  It may call ``aux<i>(k)`` (auxiliary ``i`` read in its
    compute type, e.g. Gather's indices or Where's condition) and helpers it
    defines itself.  Sources must all have the output's itemsize; any dtype of
    1, 2, 4 or 8 bytes moves.  Bindings: sources, then auxiliaries, then the output.
    With ``status``, the program's status words follow (``Binding("status")``,
    declared as ``status: array<atomic<u32>>``): ``source`` may flag invalid data
    with ``atomicOr(&status[0], 1u)``.
    """
    itemsize = output.dtype.itemsize
    limits = caps.limits
    check_binding_count(name, len(sources) + len(auxiliaries) + 1 + int(status), caps)
    check_binding_sizes(name, [info for _, info in sources] + [info for _, info in auxiliaries] + [output], caps)
    parts: list[str] = []
    slot = 0
    for s, (_, info) in enumerate(sources):
        if info.dtype.itemsize != itemsize:
            raise NotOnDevice(f"{name}: source {s} is {info.dtype.name}, the output {output.dtype.name}")
        parts.append(storage_declaration(slot, f"src{s}", writable=False))
        parts.append(raw_load_function(f"raw{s}", f"src{s}", itemsize))
        slot += 1
    for a, (_, info) in enumerate(auxiliaries):
        parts.append(storage_declaration(slot, f"auxbuf{a}", writable=False))
        parts.append(load_function(f"aux{a}", f"auxbuf{a}", info.dtype))
        slot += 1
    parts.append(storage_declaration(slot, "dst", writable=True))
    if status:
        parts.append(f"@group(0) @binding({slot + 1}) var<storage, read_write> status: array<atomic<u32>>;\n")
    parts.append(source_function)
    fetch = ["fn fetch(j: u32) -> vec2<u32> {\n  let sk = source(j);\n"]
    for s in range(len(sources) - 1):
        fetch.append(f"  if (sk.x == {s}u) {{ return raw{s}(sk.y); }}\n")
    fetch.append(f"  return raw{len(sources) - 1}(sk.y);\n}}\n")
    parts.append("".join(fetch))
    count = output.size
    per = elements_per_invocation(itemsize)
    invocations = -(-count // per)
    lines = []
    if itemsize == 8:
        lines.append("  let v = fetch(w);\n  dst[2u * w] = v.x;\n  dst[2u * w + 1u] = v.y;\n")
    elif itemsize == 4:
        lines.append("  dst[w] = fetch(w).x;\n")
    else:
        bits = 8 * itemsize
        lines.append("  var word = 0u;\n")
        for e in range(per):
            j = f"(w * {per}u + {e}u)"
            lines.append(f"  if ({j} < {count}u) {{ word = word | (fetch({j}).x << {e * bits}u); }}\n")
        lines.append("  dst[w] = word;\n")
    bindings = tuple(b for b, _ in sources) + tuple(b for b, _ in auxiliaries) + (Binding("output", output_index),)
    if status:
        bindings += (Binding("status"),)
    kernel = _linear_kernel(name, parts, "".join(lines), invocations, bindings, twin, limits)
    if status or auxiliaries or itemsize != 4 or output_index != 0 or any(b.kind != "input" for b, _ in sources):
        return kernel
    rule = GatherExpression(tuple(b.index for b, _ in sources), source_function)
    return dataclasses.replace(kernel, gather=rule)


def elementwise_plan(
    op_type: str,
    operands: Sequence[Operand],
    outputs: Sequence[TensorInfo],
    expression: str,
    caps: DeviceCaps,
    function: Callable[..., np.ndarray],
    inputs: Sequence[TensorInfo | None],
    *,
    helpers: str = "",
    pair_output: bool = False,
) -> OpPlan:
    """An :class:`OpPlan` of one :func:`elementwise_kernel` (none for an empty output).

    ``function`` is the numpy twin: it receives the operands' arrays in operand
    order and returns output 0.
    """
    if outputs[0].size == 0:
        return OpPlan()
    bindings = [Binding("input", op.input_index) for op in operands] + [Binding("output", 0)]
    twin = reference_twin(function, bindings, inputs, outputs)
    kernel = elementwise_kernel(
        op_type, operands, outputs[0], expression, caps, twin, helpers=helpers, pair_output=pair_output
    )
    return OpPlan(kernels=(kernel,))
