"""onnxruntime's ``RotaryEmbedding`` (com.microsoft): the standard RotaryEmbedding with its inputs reordered.

Inputs are ``(input, position_ids, cos_cache, sin_cache)`` (the standard operator takes the positions last).
``input`` is ``[B, S, hidden]`` or ``[B, N, S, H]``; ``position_ids`` is ``[B, S]``, or one id (a scalar or a
one-element vector) that the ``S`` positions count up from.  Without ``rotary_embedding_dim`` the head size is twice
the caches' width and every feature rotates; with it, ``num_heads`` gives the head size and the caches must be
``rotary_embedding_dim / 2`` wide.  ``interleaved`` pairs neighbours, as in the standard operator.  Packed batching
is refused; ``scale`` is read by no onnxruntime CPU code (a model setting it gets the same result there), so it is
ignored here too.

On the device the standard operator's kernel runs (float32, or float16 with ``shader-f16``), after a small kernel
that expands a single position id into ``[B, S]`` ids where the node has one.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import Binding, DeviceCaps, KernelSpec, Operator, OpPlan, TensorInfo
from .._registry import register
from .._tiling import THREADS, BindingTable, grid_for_groups, workgroup_index
from ..ai_onnx.rotary_embedding import RotaryEmbedding as StandardRotary
from ._attention_parts import PlanBuilder

__all__ = ["RotaryEmbedding"]

OP = "RotaryEmbedding"


def standard_attrs(x: tuple[int, ...], cache: tuple[int, ...], attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The standard operator's attributes for this node (after checking what it refuses)."""
    if int(attrs.get("is_packed_batching", 0)):
        raise UnsupportedOpError(f"{OP} (com.microsoft): is_packed_batching=1 is not supported")
    if len(x) not in (3, 4) or len(cache) != 2:
        raise ShapeError(f"{OP} (com.microsoft): input {x} must be 3-D or 4-D and the caches {cache} 2-D")
    heads, rotary = int(attrs.get("num_heads", 0)), int(attrs.get("rotary_embedding_dim", 0))
    if rotary > 0 and heads <= 0:
        raise ShapeError(f"{OP} (com.microsoft): rotary_embedding_dim needs num_heads")
    hidden = x[2] if len(x) == 3 else x[1] * x[3]
    head = hidden // heads if rotary > 0 else 2 * cache[1]
    if head <= 0 or hidden % head:
        raise ShapeError(f"{OP} (com.microsoft): head size {head} does not divide the hidden size {hidden}")
    result: dict[str, Any] = {"interleaved": int(attrs.get("interleaved", 0)), "rotary_embedding_dim": rotary or head}
    if len(x) == 3:
        result["num_heads"] = hidden // head
    return result


def _positions_check(positions: tuple[int, ...], batch: int, sequence: int) -> bool:
    """Whether the ids are one id (True) or ``[B, S]`` (False); a ShapeError otherwise."""
    if int(np.prod(positions)) == 1 and len(positions) <= 1:
        return True
    if positions != (batch, sequence):
        raise ShapeError(f"{OP} (com.microsoft): position_ids {positions} must be one id or [{batch}, {sequence}]")
    return False


def _batch_sequence(x: tuple[int, ...]) -> tuple[int, int]:
    return x[0], x[1] if len(x) == 3 else x[2]


@register
class RotaryEmbedding(Operator):
    """com.microsoft RotaryEmbedding-1."""

    op_type = OP
    domain = "com.microsoft"
    since_version = 1

    def output_shapes(
        self, inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
    ) -> list[tuple[int, ...]] | None:
        x = inputs[0]
        assert x is not None
        return [tuple(x.shape)]

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, positions, cos, sin = inputs[0], inputs[1], inputs[2], inputs[3]
        assert x is not None and positions is not None and cos is not None and sin is not None
        standard = standard_attrs(tuple(x.shape), tuple(cos.shape), attrs)
        batch, sequence = _batch_sequence(tuple(x.shape))
        if _positions_check(tuple(positions.shape), batch, sequence):
            first = int(positions.reshape(-1)[0])
            positions = np.broadcast_to(first + np.arange(sequence, dtype=np.int64), (batch, sequence))
        return StandardRotary(23).reference([x, cos, sin, positions.astype(np.int64)], standard, outputs)

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x, positions, cos, sin = inputs[0], inputs[1], inputs[2], inputs[3]
        assert x is not None and positions is not None and cos is not None and sin is not None
        standard = standard_attrs(tuple(x.shape), tuple(cos.shape), attrs)
        batch, sequence = _batch_sequence(tuple(x.shape))
        builder = PlanBuilder(OP)
        ids = TensorInfo((batch, sequence), np.dtype(np.int64))
        at = Binding("input", 1)
        if _positions_check(tuple(positions.shape), batch, sequence):
            at = builder.scratch(ids)
            builder.add(_expand_kernel(positions, batch, sequence, at, caps))
        elif positions.dtype != np.int64:
            raise ShapeError(f"{OP} (com.microsoft): position_ids must be int64, got {positions.dtype}")
        plan = StandardRotary(23).plan([x, cos, sin, ids], outputs, standard, caps, {})
        builder.include(
            plan, [Binding("input", 0), Binding("input", 2), Binding("input", 3), at], [Binding("output", 0)]
        )
        return builder.build()


def _expand_kernel(info: TensorInfo, batch: int, sequence: int, target: Binding, caps: DeviceCaps) -> KernelSpec:
    """int64 ids ``[B, S]``: the one id plus the position (64-bit addition on the words)."""
    if info.dtype != np.int64:
        raise ShapeError(f"{OP} (com.microsoft): position_ids must be int64, got {info.dtype}")
    table = BindingTable()
    source = table.add(Binding("input", 1), "u32")
    out = table.add(target, "u32", writable=True)
    count = batch * sequence
    grid = grid_for_groups(-(-count // THREADS), caps)
    wgsl = f"""{table.declarations()}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let n = {workgroup_index(grid)} * {THREADS}u + li;
    if (n >= {count}u) {{ return; }}
    let low = {source}[0] + n % {sequence}u;
    {out}[2u * n] = low;
    {out}[2u * n + 1u] = {source}[1] + select(0u, 1u, low < {source}[0]);
}}
"""

    def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        first = arrays[0][:8].view(np.int64)[0]
        ids = first + np.broadcast_to(np.arange(sequence, dtype=np.int64), (batch, sequence))
        arrays[1][: 8 * count] = np.ascontiguousarray(ids).reshape(-1).view(np.uint8)

    return KernelSpec(OP, wgsl, grid, tuple(table.bindings), twin)
