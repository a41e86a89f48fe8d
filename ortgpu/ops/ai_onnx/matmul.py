"""MatMul: numpy's matmul semantics (batched, broadcast batch dimensions, 1-D operands), with fused epilogues.

Fusion contract (MatMul, Gemm and Conv)
---------------------------------------
The planner may fold elementwise successors of a MatMul, Gemm or Conv node into it by giving the node the
special attribute ``"_epilogue"``: a tuple of steps applied, in order, to each float32 output element before
it is stored:

``("add", k)``
    add input ``k`` of the node, broadcast (numpy rules) to the output shape; it must not change the output
    shape.  A bias, a residual.
``("scale", c)``
    ``x * c`` (a float32 constant; the planner folds ``Mul``/``Div`` by a scalar constant, e.g. attention's
    ``1 / sqrt(d)``).
``("relu",)``
    ``max(x, 0)``.
``("gelu",)``
    ``0.5 x (1 + erf(x / sqrt 2))`` (the erf form; ONNX Gelu with ``approximate="none"``, or the exported
    ``Div(x, sqrt 2) -> Erf -> Add 1 -> Mul x -> Mul 0.5`` subgraph, which the planner recognises).
``("clip", lo, hi)``
    ``min(max(x, lo), hi)``; ``-inf``/``inf`` leave that side open.
``("sigmoid",)``
    ``1 / (1 + exp(-x))``.

Extra inputs are appended *after the op's own inputs, padded to the op's full arity with ``None``*: MatMul
reads inputs 0-1, so its first extra input is index 2; Gemm (A, B, optional C) and Conv (X, W, optional B)
start theirs at index 3 (a Gemm without C, fused with a bias, has inputs ``[A, B, None, bias]`` and
``_epilogue=(("add", 3),)``).  Extra inputs must have the output's dtype (float32).  Gemm applies ``alpha``
and ``beta * C`` and Conv its bias before the epilogue steps; all of it happens in registers, in one kernel.
Both ``reference`` and the WebGPU kernels honour the attribute, so a fused node placed on the CPU computes the
same thing.  Outputs are the op's own (one tensor); a MatMul the planner made of sibling projections (same A,
weights side by side) has several, which split the product's columns in order (:mod:`.._output_layout`).

Folded output transposes (MatMul only)
--------------------------------------
``"_output_perm"``: a permutation of the product's axes that keeps the last axis last; the output is
``numpy.transpose(epilogue(product), perm)`` (the planner folds a Transpose read only from the product into its store:
an unfused attention's heads merged back costs no copy).  The epilogue's extra inputs are read in the product's
layout.

Folded input transposes (MatMul only)
-------------------------------------
The planner may also fold a ``Transpose`` whose only consumer is a MatMul into it, with the special attribute
``"_input_perms"``: ``(perm_a, perm_b)``, each ``None`` or a permutation of that input's axes (rank >= 2).  Input
``i`` then holds the tensor *before* the transpose and the operand is ``numpy.transpose(input_i, perm_i)``; the
kernel reads it through the permuted strides (attention's head split, ``[B, S, H, D] -> [B, H, S, D]`` and
``-> [B, H, D, S]``, costs no dispatch and no copy).  A size-1 axis is only ever read at index 0, so its stride
means nothing; the planner sets it to 0 before comparing layouts (:func:`._matmul_operands.canonical`), so a
transpose that moves only size-1 axes (ViT's packed Q/K/V projection, ``[1, S, D] -> [S, 1, D]``) is planned like no
transpose: the same rows, batch and vec4 loads.  The one-row GEMV reads folded operands too: its A is K contiguous
values whatever the permutation, its B a ``[K, N]`` or ``[N, K]`` source.

Operands read as views (MatMul only)
------------------------------------
``"_input_views"``: ``(view_a, view_b)``, each ``None`` or ``(shape, strides, offset)`` in elements: the operand is
that strided view of the input (rank >= 2; every element it reaches lies in the input).  The planner reads an
attention's Q, K^T and V so where it leaves the attention unfused: straight from a packed projection, through the
Gathers, Reshapes and Transposes an exporter wrote.  Not with ``"_input_perms"``.

Softmax operand (MatMul only)
-----------------------------
``"_softmax_a": True``: the product's A is the softmax of input 0 (as read) over its last axis, which the node
computes itself: a kernel keeps each row's maximum and reciprocal sum, and the product's A loads apply them
(:mod:`.._softmax_operand`).  The planner folds an unfused attention's Softmax into its second product so (the
probabilities are never stored).  A must be all of input 0 read in order (no folded transpose, a view only of the
same bytes in C order) and the product must not be a single row (batch x M > 1: the GEMV reads no statistics), and
the statistics (8 bytes a row) must fit a storage binding; otherwise the plan raises ``NotOnDevice`` and
the planner keeps the Softmax as its own step.  Float16 scores are softmaxed in f32 without rounding the
probabilities to float16 first.

Kernels
-------
* M = 1 (one row, no batch; also after folding, see below): a GEMV kernel that streams B with vec4 loads,
  splitting K over a workgroup (and optionally over workgroups: split-K) and reducing through workgroup memory
  or subgroup shuffles; the variant is chosen per shape by :func:`._gemv.choose_gemv_config` (today's kernel
  everywhere until the sweep's measurements fill :data:`._gemv.GEMV_SHAPE_CONFIGS`).
* otherwise: the shared-memory tiled GEMM of :mod:`._tiled_gemm` (tile shape and split-K chosen per problem by
  :func:`._gemm.choose_gemm_config`; vec4 loads where the layouts allow).  The trailing batch axes along which B
  is broadcast fold into M (:func:`_merged_rows`), so ``[B, S, K] x [K, N]`` is one ``[B*S, K] x [K, N]`` GEMM and
  ``[B, H, S, K] x [B, 1, K, N]`` is ``B`` GEMMs of ``H*S`` rows.  A contiguous A's merged rows are evenly strided;
  a folded transpose's may not be (``[S, B, D]`` read from ``[B, S, D]``), and then A's loads find each row
  through an index function rather than leaving ``S`` GEMMs of ``B`` rows.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from ..._types import element_count
from .._epilogue import EpilogueStep, apply_epilogue, parse_epilogue
from .._gemv import plan_gemv
from .._kernel import Binding, DeviceCaps, KernelSpec, NotOnDevice, Operator, OpPlan, TensorInfo
from .._output_layout import laid_out, output_parts, store_permutation
from .._registry import register
from .._softmax_operand import (
    STATS_ELEMENT,
    check_softmax_operand,
    softmax_load,
    softmax_of,
    softmax_operands,
    softmax_stats_kernel,
)
from .._tiled_gemm import GemmLoad, GemmProblem, binding_name, plan_tiled_gemm
from .._tiling import broadcast_strides, c_strides, float_element, index_function, require_float
from ._matmul_operands import (
    InputView,
    Perm,
    Read,
    canonical,
    input_perms,
    input_views,
    operand_strides,
    permuted,
    read_through,
    strided,
)

__all__ = ["InputView", "MatMul", "plan_gemm", "matmul_output_shape", "input_perms", "input_views"]


def _output_perm(attrs: Mapping[str, Any], out_shape: tuple[int, ...], outputs: Sequence[TensorInfo]) -> Perm | None:
    """The ``_output_perm`` attribute (a Transpose after the product folded into its store), checked with the
    outputs' layout: several outputs split the product's columns, one transposed output is the product permuted
    (:mod:`ortgpu.ops._output_layout`)."""
    try:
        perm = store_permutation(attrs.get("_output_perm"), len(out_shape))
        output_parts(outputs, out_shape, perm)
    except ValueError as why:
        raise UnsupportedOpError(f"MatMul: {why}") from None
    return perm


RowRuns = list[tuple[int, int]]


def _merged_rows(
    batch_shape: tuple[int, ...], a_shape: tuple[int, ...], a_strides: tuple[int, ...], b_shape: tuple[int, ...]
) -> tuple[int, RowRuns]:
    """``(tail, runs)``: the last ``tail`` batch axes of the product fold into A's rows, and where those rows lie.

    An axis folds when B is broadcast along it: one B matrix serves every index, so the product over it is one GEMM
    with more rows (the output is C-contiguous, so its rows merge along the same axes).  Without the fold every
    batch index is its own product: at ``m = 1`` one live row per tile.  ``runs``: A's merged rows, innermost first,
    as ``(size, stride)`` runs of evenly strided rows; size-1 axes (whatever their stride) are dropped and
    neighbours that continue one another are joined, so a layout that is one run (any C-contiguous A, a transpose
    that moved only size-1 axes) puts row ``r`` at ``r * stride``; several runs are read through an index function
    (a few integer divisions per load, against a batch of GEMMs with a few live rows per tile).  No runs: one row.
    """
    lead = len(batch_shape)
    pad_a, pad_b = lead - (len(a_shape) - 2), lead - (len(b_shape) - 2)
    tail = 0
    while tail < lead and (lead - 1 - tail < pad_b or b_shape[lead - 1 - tail - pad_b] == 1):
        tail += 1
    axes = [(a_shape[-2], a_strides[-2])]
    for axis in range(lead - 1, lead - 1 - tail, -1):  # B is broadcast here, so A has the product's size
        axes.append((batch_shape[axis], a_strides[axis - pad_a] if axis >= pad_a else 0))
    runs: RowRuns = []
    for size, stride in axes:
        if size == 1:
            continue
        if runs and stride == runs[-1][0] * runs[-1][1]:
            runs[-1] = (runs[-1][0] * size, runs[-1][1])
        else:
            runs.append((size, stride))
    return tail, runs


def _rows_of(runs: RowRuns) -> int:
    """How many rows ``runs`` hold."""
    return int(np.prod([size for size, _ in runs], dtype=np.int64)) if runs else 1


def _batched(
    a: np.ndarray, b: np.ndarray, batch_shape: tuple[int, ...], batch: int, m: int, k: int, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """The operands as the kernel sees them (for the split-K twin): A ``[batch, m, k]`` and B ``[batch, k, n]``,
    the product's batch axes that :func:`_merged_rows` folded into A's rows (B is broadcast along them) merged there."""
    a_full = np.broadcast_to(a, batch_shape + a.shape[-2:]).reshape(batch, m, k)
    b_full = np.broadcast_to(b, batch_shape + b.shape[-2:]).reshape(batch, -1, k, n)[:, 0]
    return a_full, b_full


def _scaled(name: str, stride: int) -> str:
    return name if stride == 1 else f"{name} * {stride}u"


def matmul_output_shape(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> tuple[int, ...]:
    """numpy.matmul's output shape (raises ``ValueError`` on a mismatch)."""
    if not a_shape or not b_shape:
        raise ValueError("MatMul operands must have at least one dimension")
    a2 = (1,) + a_shape if len(a_shape) == 1 else a_shape
    b2 = b_shape + (1,) if len(b_shape) == 1 else b_shape
    if a2[-1] != b2[-2]:
        raise ValueError(f"MatMul: inner dimensions differ, {a_shape} x {b_shape}")
    batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    shape = batch + (a2[-2], b2[-1])
    if len(a_shape) == 1:
        shape = shape[:-2] + shape[-1:]
    if len(b_shape) == 1:
        shape = shape[:-1]
    return shape


def plan_gemm(
    op_type: str,
    *,
    a_shape: tuple[int, ...],
    b_shape: tuple[int, ...],
    trans_a: bool,
    trans_b: bool,
    steps: Sequence[EpilogueStep],
    out_shape: tuple[int, ...],
    compute: Any,
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
    caps: DeviceCaps,
    a_perm: Perm | None = None,
    b_perm: Perm | None = None,
    output_perm: Perm | None = None,
    a_view: InputView | None = None,
    b_view: InputView | None = None,
    a_softmax: bool = False,
) -> OpPlan:
    """The plan of ``out = epilogue(op(A) @ op(B))`` with A = input 0, B = input 1 (stored transposed by
    ``output_perm``, or split by columns over several ``outputs``: :mod:`ortgpu.ops._output_layout`); with
    ``a_softmax`` the product's A is the softmax of input 0 over its last axis (:mod:`ortgpu.ops._softmax_operand`).

    ``a_shape``/``b_shape`` are at least 2-D (1-D operands already lifted); transposes apply to 2-D operands
    only (Gemm).  ``compute`` is the twin's whole-node function.  ``a_perm``/``b_perm`` (MatMul's folded
    transposes, not with ``trans_a``/``trans_b``): input ``i`` holds the source and the operand, of shape
    ``a_shape``/``b_shape``, is ``numpy.transpose(source, perm)``; ``a_view``/``b_view`` (MatMul's ``_input_views``):
    the operand is that strided view of the source.
    """
    if element_count(out_shape) == 0:
        return OpPlan()
    if (a_shape[-2] if trans_a else a_shape[-1]) == 0:
        # K = 0: every output is epilogue(0 [+ beta * C]), which the twin computes; the GEMM/GEMV kernels would
        # bind zero-length operands (a validation error on wgpu) or leave the output unwritten.
        raise NotOnDevice(f"{op_type}: the inner dimension K is 0 (the output is the epilogue of zeros)")
    if a_softmax:
        check_softmax_operand(op_type, a_shape, trans_a, a_perm, a_view, inputs[0])
    if any(x is not None for x in (a_perm, b_perm, a_view, b_view)):
        if trans_a or trans_b:
            raise ValueError("plan_gemm: folded operands (perms, views) do not combine with trans_a/trans_b")
        a_read = read_through(a_shape, a_perm, a_view)
        b_read = read_through(b_shape, b_perm, b_view)
        return _plan_strided_gemm(
            op_type,
            a_shape,
            b_shape,
            a_read,
            b_read,
            steps,
            out_shape,
            compute,
            inputs,
            outputs,
            caps,
            output_perm,
            a_softmax,
        )
    m = a_shape[-1] if trans_a else a_shape[-2]
    k = a_shape[-2] if trans_a else a_shape[-1]
    n = b_shape[-2] if trans_b else b_shape[-1]
    a_batch, b_batch = a_shape[:-2], b_shape[:-2]
    batch_shape = tuple(np.broadcast_shapes(a_batch, b_batch))
    tail = 0
    if not trans_a:  # A's trailing batch axes fold into its rows wherever B is broadcast along them (one run)
        tail, runs = _merged_rows(batch_shape, a_shape, canonical(a_shape, c_strides(a_shape)), b_shape)
        assert len(runs) <= 1, runs  # C-contiguous rows continue through every axis of A's full size
        m = _rows_of(runs)
    head = batch_shape[: len(batch_shape) - tail]
    batch = element_count(head)
    if batch == 1 and m == 1:
        if a_softmax:
            raise NotOnDevice(f"{op_type}: a one-row product reads no softmax operand; run the Softmax on its own")
        return plan_gemv(
            op_type,
            n=n,
            k=k,
            layout="nk" if trans_b else "kn",
            steps=steps,
            out_shape=out_shape,
            compute=compute,
            inputs=inputs,
            outputs=outputs,
            caps=caps,
            output_perm=output_perm,
        )

    prelude = ""
    a_base = b_base = ""
    if batch > 1:
        a_head, b_head = a_batch[: max(0, len(a_batch) - tail)], b_batch[: max(0, len(b_batch) - tail)]
        prelude += index_function("a_batch", head, broadcast_strides(a_head, head))
        prelude += index_function("b_batch", head, broadcast_strides(b_head, head))
        a_base = f"a_batch(b) * {m * k}u + "
        b_base = f"b_batch(b) * {k * n}u + "
    a_index = f"k * {m}u + m" if trans_a else f"m * {k}u + k"
    b_index = f"n * {k}u + k" if trans_b else f"k * {n}u + n"
    a_lifted, b_lifted = a_shape, b_shape

    def operands(full: list[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
        a, b = full[0], full[1]
        assert a is not None and b is not None
        a, b = a.reshape(a_lifted), b.reshape(b_lifted)
        if trans_a:
            a = a.T
        if trans_b:
            b = b.T
        return _batched(a, b, batch_shape, batch, m, k, n)

    vectors = (not trans_a and k % 4 == 0, trans_a and m % 4 == 0, not trans_b and n % 4 == 0, trans_b and k % 4 == 0)
    return _loaded_gemm(
        op_type,
        batch=batch,
        m=m,
        n=n,
        k=k,
        a_base=a_base,
        b_base=b_base,
        a_index=a_index,
        b_index=b_index,
        vectors=vectors,
        prelude=prelude,
        operands=operands,
        steps=steps,
        out_shape=out_shape,
        compute=compute,
        inputs=inputs,
        outputs=outputs,
        caps=caps,
        output_perm=output_perm,
        a_softmax=a_softmax,
    )


def _loaded_gemm(
    op_type: str,
    *,
    batch: int,
    m: int,
    n: int,
    k: int,
    a_base: str,
    b_base: str,
    a_index: str,
    b_index: str,
    vectors: tuple[bool, bool, bool, bool],
    prelude: str,
    operands: Any,
    steps: Sequence[EpilogueStep],
    out_shape: tuple[int, ...],
    compute: Any,
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
    caps: DeviceCaps,
    output_perm: Perm | None = None,
    a_softmax: bool = False,
) -> OpPlan:
    """The tiled GEMM over inputs 0 (A) and 1 (B) read at ``base + index`` (WGSL expressions in ``b``, ``m``,
    ``k``, ``n``); ``vectors`` says which vec4 loaders are valid: (A along k, A along m, B along n, B along k).
    ``a_softmax``: A's loads return the softmax of input 0's rows (:mod:`ortgpu.ops._softmax_operand`), from row
    statistics a kernel before the product writes into scratch 0."""
    a_in, b_in = Binding("input", 0), Binding("input", 1)
    info = inputs[0]
    assert info is not None
    element = float_element(info)  # f16 storage is loaded into f32: the tiles and sums stay f32
    vec = f"vec4<{element}>"
    a_s, b_s = binding_name(a_in, element), binding_name(b_in, element)
    a_v, b_v = binding_name(a_in, vec), binding_name(b_in, vec)
    stats = Binding("scratch", 0)

    def widened(value: str, vector: bool) -> str:
        return value if element == "f32" else f"{'vec4<f32>' if vector else 'f32'}({value})"

    def loaded(value: str, vector: bool) -> str:
        return f"    return {widened(value, vector)};"

    def loaded_a(value: str, vector: bool) -> str:
        if not a_softmax:
            return loaded(value, vector)
        return softmax_load(widened(value, vector), f"{a_base}{a_index}", k, binding_name(stats, STATS_ELEMENT), vector)

    a_extra = ((stats, STATS_ELEMENT),) if a_softmax else ()
    a_vector = GemmLoad(loaded_a(f"{a_v}[({a_base}{a_index}) / 4u]", True), ((a_in, vec),) + a_extra)
    b_vector = GemmLoad(loaded(f"{b_v}[({b_base}{b_index}) / 4u]", True), ((b_in, vec),))
    a4k, a4m, b4n, b4k = vectors
    before: tuple[tuple[KernelSpec, int], ...] = ()
    if a_softmax:
        a4m = False  # four rows' loads would need four rows' statistics
        stats_bytes = info.size // k * 8
        if stats_bytes > caps.limits.max_storage_buffer_binding_size:
            raise NotOnDevice(f"{op_type}: the softmax operand's row statistics exceed a storage binding")
        before = ((softmax_stats_kernel(op_type, info, k, 0, caps), stats_bytes),)
        operands = softmax_operands(operands)
    problem = GemmProblem(
        batch=batch,
        m=m,
        n=n,
        k=k,
        load_a=GemmLoad(loaded_a(f"{a_s}[{a_base}{a_index}]", False), ((a_in, element),) + a_extra),
        load_b=GemmLoad(loaded(f"{b_s}[{b_base}{b_index}]", False), ((b_in, element),)),
        load_a4k=a_vector if a4k else None,
        load_a4m=a_vector if a4m else None,
        load_b4n=b_vector if b4n else None,
        load_b4k=b_vector if b4k else None,
        prelude=prelude,
        operands=operands,
    )
    return plan_tiled_gemm(
        op_type,
        problem,
        steps=steps,
        out_shape=out_shape,
        compute=compute,
        inputs=inputs,
        outputs=outputs,
        caps=caps,
        output_perm=output_perm,
        before=before,
    )


def _plan_strided_gemm(
    op_type: str,
    a_shape: tuple[int, ...],
    b_shape: tuple[int, ...],
    a_read: Read,
    b_read: Read,
    steps: Sequence[EpilogueStep],
    out_shape: tuple[int, ...],
    compute: Any,
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
    caps: DeviceCaps,
    output_perm: Perm | None = None,
    a_softmax: bool = False,
) -> OpPlan:
    """:func:`plan_gemm` with operands read through folded transposes or views: every load goes through the
    operand's element strides (from its offset), vec4 loads only where the strides and offset keep four neighbours
    together and aligned.  Strides are canonical (:func:`._matmul_operands.canonical`): a transpose that moves only
    size-1 axes reads exactly like no transpose."""
    (sa, a_start, a_numpy), (sb, b_start, b_numpy) = a_read, b_read
    m, k, n = a_shape[-2], a_shape[-1], b_shape[-1]
    a_batch, b_batch = a_shape[:-2], b_shape[:-2]
    batch_shape = tuple(np.broadcast_shapes(a_batch, b_batch))
    tail, runs = _merged_rows(batch_shape, a_shape, sa, b_shape)
    m = _rows_of(runs)
    head = batch_shape[: len(batch_shape) - tail]
    batch = element_count(head)
    if batch == 1 and m == 1 and a_softmax:
        raise NotOnDevice(f"{op_type}: a one-row product reads no softmax operand; run the Softmax on its own")
    if batch == 1 and m == 1 and not (a_start or b_start):  # (the GEMV reads its operands from their start)
        return _strided_gemv(op_type, b_shape, sa, sb, steps, out_shape, compute, inputs, outputs, caps, output_perm)

    def batch_strides(shape: tuple[int, ...], strides: tuple[int, ...]) -> list[int]:
        """Per axis of ``head``: the operand's stride, 0 where it is broadcast (canonical strides: 0 at size 1)."""
        pad = len(batch_shape) - (len(shape) - 2)
        sizes = (1,) * pad + shape[:-2]
        own = (0,) * pad + strides[:-2]
        return [stride if size == out else 0 for size, out, stride in zip(sizes, head, own)]

    prelude = ""
    a_base = f"{a_start}u + " if a_start else ""
    b_base = f"{b_start}u + " if b_start else ""
    a_offsets, b_offsets = [a_start], [b_start]
    if batch > 1:
        a_offsets, b_offsets = batch_strides(a_shape, sa) + [a_start], batch_strides(b_shape, sb) + [b_start]
        prelude += index_function("a_batch", head, a_offsets[:-1]) + index_function("b_batch", head, b_offsets[:-1])
        a_base, b_base = a_base + "a_batch(b) + ", b_base + "b_batch(b) + "
    if len(runs) > 1:  # rows that are no single run: their offsets through an index function
        prelude += index_function("a_row", [size for size, _ in runs[::-1]], [stride for _, stride in runs[::-1]])
        a_index = f"a_row(m) + {_scaled('k', sa[-1])}"
    else:
        a_index = f"{_scaled('m', runs[0][1] if runs else 0)} + {_scaled('k', sa[-1])}"
    row_strides = [stride for _, stride in runs]
    b_index = f"{_scaled('k', sb[-2])} + {_scaled('n', sb[-1])}"

    def aligned(*strides: int) -> bool:
        return all(s % 4 == 0 for s in strides)

    def operands(full: list[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
        a, b = full[0], full[1]
        assert a is not None and b is not None
        return _batched(a_numpy(a), b_numpy(b), batch_shape, batch, m, k, n)

    vectors = (
        sa[-1] == 1 and k % 4 == 0 and aligned(*row_strides, *a_offsets),
        # four rows from a multiple of 4 stay within the innermost run when its length is one too
        bool(runs) and runs[0][1] == 1 and runs[0][0] % 4 == 0 and aligned(sa[-1], *row_strides[1:], *a_offsets),
        sb[-1] == 1 and n % 4 == 0 and aligned(sb[-2], *b_offsets),
        sb[-2] == 1 and k % 4 == 0 and aligned(sb[-1], *b_offsets),
    )
    return _loaded_gemm(
        op_type,
        batch=batch,
        m=m,
        n=n,
        k=k,
        a_base=a_base,
        b_base=b_base,
        a_index=a_index,
        b_index=b_index,
        vectors=vectors,
        prelude=prelude,
        operands=operands,
        steps=steps,
        out_shape=out_shape,
        compute=compute,
        inputs=inputs,
        outputs=outputs,
        caps=caps,
        output_perm=output_perm,
        a_softmax=a_softmax,
    )


def _strided_gemv(
    op_type: str,
    b_shape: tuple[int, ...],
    sa: tuple[int, ...],
    sb: tuple[int, ...],
    steps: Sequence[EpilogueStep],
    out_shape: tuple[int, ...],
    compute: Any,
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
    caps: DeviceCaps,
    output_perm: Perm | None = None,
) -> OpPlan:
    """The one-row product (M = 1, every batch axis of size 1) through folded transposes, on the GEMV kernel.

    A's only axis longer than 1 is K, so its source holds the K values contiguously whatever the permutation; B's
    are K and N, so its source is ``[K, N]`` or ``[N, K]``: the GEMV's two layouts (``"kn"`` preferred when both
    fit, as for an unfolded MatMul).  Strides are canonical, so size-1 axes do not disturb either comparison."""
    k, n = b_shape[-2], b_shape[-1]
    swap = tuple(range(len(b_shape) - 2)) + (len(b_shape) - 1, len(b_shape) - 2)
    layouts = {operand_strides(b_shape, swap): "nk", operand_strides(b_shape, None): "kn"}
    layout = layouts.get(sb)
    if sa[-1] not in (0, 1) or layout is None:  # a permuted contiguous source cannot get here; a guard
        raise NotOnDevice(f"{op_type}: a one-row product whose operands are not contiguous rows; keep the Transpose")
    return plan_gemv(
        op_type,
        n=n,
        k=k,
        layout=layout,
        steps=steps,
        out_shape=out_shape,
        compute=compute,
        inputs=inputs,
        outputs=outputs,
        caps=caps,
        output_perm=output_perm,
    )


@register
class MatMul(Operator):
    """MatMul-1/9/13 (numpy.matmul)."""

    op_type = "MatMul"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        if a.dtype != b.dtype:
            raise UnsupportedOpError(f"MatMul: operand dtypes differ ({a.dtype}, {b.dtype}) at opset {self.opset}")
        a_perm, b_perm = input_perms(attrs, [tuple(a.shape), tuple(b.shape)])
        a_view, b_view = input_views(attrs, [a.size, b.size])
        a_op = read_through(tuple(a.shape), a_perm, None)[2](a) if a_view is None else strided(a, a_view)
        b_op = read_through(tuple(b.shape), b_perm, None)[2](b) if b_view is None else strided(b, b_view)
        if _softmax_a(attrs):  # A is the softmax of what input 0 holds, in f32 (the kernel's loads)
            y = np.matmul(softmax_of(a_op), b_op.astype(np.float32))
        elif a.dtype == np.float16:  # as the kernels do: products and sums in float32, one rounding at the end
            y = np.matmul(a_op.astype(np.float32), b_op.astype(np.float32))
        else:
            y = np.matmul(a_op, b_op)
        shapes = [None if x is None else tuple(x.shape) for x in inputs]
        steps = parse_epilogue("MatMul", attrs, 2, shapes, tuple(y.shape))
        result = apply_epilogue(np.asarray(y), steps, inputs).astype(a.dtype, copy=False)
        out_perm = _output_perm(attrs, tuple(y.shape), outputs)
        return laid_out(result, outputs, tuple(y.shape), out_perm)

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        require_float("MatMul", list(inputs) + list(outputs), caps)
        a_perm, b_perm = input_perms(attrs, [a.shape, b.shape])
        a_view, b_view = input_views(attrs, [element_count(a.shape), element_count(b.shape)])
        a_logical = permuted(a.shape, a_perm) if a_view is None else a_view[0]
        b_logical = permuted(b.shape, b_perm) if b_view is None else b_view[0]
        out_shape = matmul_output_shape(a_logical, b_logical)
        shapes = [a_logical, b_logical] + [None if x is None else x.shape for x in inputs[2:]]
        steps = parse_epilogue("MatMul", attrs, 2, shapes, out_shape)
        output_perm = _output_perm(attrs, out_shape, outputs)
        a_shape = (1,) + a_logical if len(a_logical) == 1 else a_logical
        b_shape = b_logical + (1,) if len(b_logical) == 1 else b_logical
        return plan_gemm(
            "MatMul",
            a_shape=a_shape,
            b_shape=b_shape,
            trans_a=False,
            trans_b=False,
            steps=steps,
            out_shape=out_shape,
            compute=lambda full: self.reference(full, attrs, outputs),
            inputs=inputs,
            outputs=outputs,
            caps=caps,
            a_perm=a_perm,
            b_perm=b_perm,
            output_perm=output_perm,
            a_view=a_view,
            b_view=b_view,
            a_softmax=_softmax_a(attrs),
        )


def _softmax_a(attrs: Mapping[str, Any]) -> bool:
    """The ``_softmax_a`` attribute (default False), checked."""
    value = attrs.get("_softmax_a", False)
    if not isinstance(value, bool):
        raise UnsupportedOpError(f"MatMul: _softmax_a must be True or False, got {value!r}")
    return value
