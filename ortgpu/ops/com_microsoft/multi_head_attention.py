"""onnxruntime's ``MultiHeadAttention`` (com.microsoft): attention over already projected queries, keys and values.

Q is ``[B, S, N * H]``; K and V ``[B, L, N * H]`` (``[B, L, N * Hv]``), or ``[B, N, L, H]`` (projected for
cross-attention: no bias then), or packed: Q, K and V in one ``query [B, S, N, 3, H]``, or K and V in one
``key [B, L, N, 2, H]``.  ``bias [N * H + N * H + N * Hv]`` adds to Q, K and V; ``past_key``/``past_value`` ``[B, N,
P, H]`` go in front of K and V, and ``present_key``/``present_value`` return them.  The scores ``scale * Q.K^T``
(default scale ``1 / sqrt(H)``) get an additive bias as in onnxruntime's CPU kernel: ``mask_filter_value`` (default
-10000) at keys the ``key_padding_mask`` masks (key lengths ``[B]``, a 0/1 mask ``[B, T]`` or ``[B, S, T]``), keys past
the causal frontier dropped with ``unidirectional`` (for more than one query), and ``attention_bias`` ``[B or
1, N or 1, S, T]``.  (onnxruntime's CPU kernel refuses the packed forms; here they mean the same as their unpacked
tensors.)  ``past_sequence_length``, ``cache_indirection`` and the ``qk`` output (beam search's decoder) are refused.

On the device (float32, or float16 with ``shader-f16``) the plan is copy kernels that bring Q, K, V into ``[B, S,
N * H]`` with the bias added and the past in front (none where an input already is that), a kernel building the
additive mask where one is needed, the standard Attention operator's kernel, and copies into the present outputs.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import Binding, DeviceCaps, Operator, OpPlan, TensorInfo
from .._registry import register
from ._attention_parts import (
    F32,
    PlanBuilder,
    Strided,
    additive_mask,
    attention_plan,
    device_float,
    gathered,
    head_major,
    mask_kernel,
    present_copy,
    standard_attention,
)

__all__ = ["MultiHeadAttention"]

OP = "MultiHeadAttention"


class _Layout:
    """Where Q, K and V come from: for each, (input index, offset, strides over points ``(b, position, head,
    feature)``), and the sizes."""

    def __init__(self, shapes: Sequence[tuple[int, ...] | None], heads: int, has_bias: bool) -> None:
        query, key, value = shapes[0], shapes[1], shapes[2]
        assert query is not None
        if heads <= 0:
            raise ShapeError(f"{OP}: num_heads must be positive, got {heads}")
        self.heads = heads
        self.bnsh_kv = False
        if len(query) == 5:  # packed [B, S, N, 3, H]
            if key is not None or value is not None or query[2] != heads or query[3] != 3:
                raise ShapeError(f"{OP}: packed query {query} must be [B, S, {heads}, 3, H] with no key or value")
            self.batch, self.sq, _, _, self.head = query
            self.length, self.value_head = self.sq, self.head
            row = heads * 3 * self.head
            strides = (self.sq * row, row, 3 * self.head, 1)
            self.sources = [(0, part * self.head, strides) for part in range(3)]
            return
        if len(query) != 3 or query[2] % heads:
            raise ShapeError(f"{OP}: query {query} must be [B, S, N * H] with num_heads {heads} dividing N * H")
        self.batch, self.sq, hidden = query
        self.head = hidden // heads
        q_source = (0, 0, (self.sq * hidden, hidden, self.head, 1))
        if key is None:
            raise ShapeError(f"{OP}: key is required unless query is packed [B, S, N, 3, H]")
        if len(key) == 5:  # packed [B, L, N, 2, H]
            if value is not None or key[0] != self.batch or key[2:] != (heads, 2, self.head):
                raise ShapeError(f"{OP}: packed key {key} must be [{self.batch}, L, {heads}, 2, {self.head}], no value")
            self.length, self.value_head = key[1], self.head
            row = heads * 2 * self.head
            strides = (self.length * row, row, 2 * self.head, 1)
            self.sources = [q_source, (1, 0, strides), (1, self.head, strides)]
            return
        if value is None or len(key) != len(value) or len(key) not in (3, 4):
            raise ShapeError(f"{OP}: key {key} and value {value} must both be [B, L, N * H] or [B, N, L, H]")
        if len(key) == 4:
            if has_bias:
                raise UnsupportedOpError(f"{OP}: a bias with [B, N, L, H] key/value is not defined; add it before")
            if key[:3] != value[:3] or key[:2] != (self.batch, heads) or key[3] != self.head:
                raise ShapeError(f"{OP}: key {key} and value {value} must be [{self.batch}, {heads}, L, {self.head}]")
            self.bnsh_kv = True
            self.length, self.value_head = key[2], value[3]
            self.sources = [q_source]
            for index, size in ((1, self.head), (2, self.value_head)):
                self.sources.append((index, 0, (heads * self.length * size, size, self.length * size, 1)))
            return
        if key[0] != self.batch or value[:2] != key[:2] or key[2] != hidden or value[2] % heads:
            raise ShapeError(f"{OP}: key {key} and value {value} do not fit query {query} with {heads} heads")
        self.length, self.value_head = key[1], value[2] // heads
        self.sources = [q_source]
        for index, size in ((1, self.head), (2, self.value_head)):
            self.sources.append((index, 0, (self.length * heads * size, heads * size, size, 1)))

    def sizes(self) -> tuple[int, int, int]:
        return self.head, self.head, self.value_head

    def lengths(self) -> tuple[int, int, int]:
        return self.sq, self.length, self.length


def _optional(inputs: Sequence[Any], index: int) -> Any:
    return inputs[index] if len(inputs) > index else None


def _check(inputs: Sequence[Any], outputs: Sequence[Any], layout: _Layout) -> int:
    """Refuse what is not supported; the past length after checking the past's shapes."""
    for index, name in ((8, "past_sequence_length"), (9, "cache_indirection")):
        if _optional(inputs, index) is not None:
            raise UnsupportedOpError(f"{OP}: the {name} input (beam search's shared buffers) is not supported")
    if len(outputs) > 3:
        raise UnsupportedOpError(f"{OP}: the qk output is not supported; drop it from the node's outputs")
    past_key, past_value = _optional(inputs, 6), _optional(inputs, 7)
    if (past_key is None) != (past_value is None):
        raise ShapeError(f"{OP}: past_key and past_value must be given together")
    if past_key is None:
        return 0
    if layout.bnsh_kv:
        raise UnsupportedOpError(f"{OP}: a past with [B, N, L, H] key/value is not defined")
    b, n = layout.batch, layout.heads
    pk, pv = tuple(past_key.shape), tuple(past_value.shape)
    if len(pk) != 4 or pk != (b, n, pk[2], layout.head) or pv != (b, n, pk[2], layout.value_head):
        raise ShapeError(f"{OP}: past_key {pk} / past_value {pv} must be [{b}, {n}, P, head size]")
    return int(pk[2])


@register
class MultiHeadAttention(Operator):
    """com.microsoft MultiHeadAttention-1."""

    op_type = OP
    domain = "com.microsoft"
    since_version = 1

    def output_shapes(
        self, inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
    ) -> list[tuple[int, ...]] | None:
        shapes = [None if info is None else tuple(info.shape) for info in inputs[:3]]
        layout = _Layout(shapes + [None] * (3 - len(shapes)), int(attrs.get("num_heads", 0)), False)
        past = _check(inputs, [], layout)
        b, n, total = layout.batch, layout.heads, past + layout.length
        return [(b, layout.sq, n * layout.value_head), (b, n, total, layout.head), (b, n, total, layout.value_head)]

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        shapes = [None if x is None else tuple(x.shape) for x in inputs[:3]]
        bias = _optional(inputs, 3)
        layout = _Layout(shapes + [None] * (3 - len(shapes)), int(attrs.get("num_heads", 0)), bias is not None)
        past = _check(inputs, outputs, layout)
        query = inputs[0]
        assert query is not None
        dtype, heads = query.dtype, layout.heads
        operands = []
        bias_offset = 0
        for slot, ((index, offset, strides), size, length) in enumerate(
            zip(layout.sources, layout.sizes(), layout.lengths())
        ):
            source = inputs[index]
            assert source is not None
            flat = source.reshape(-1)
            view = Strided(Binding("input", index), dtype, offset, strides).flat((layout.batch, length, heads, size))
            x = flat[view].reshape(layout.batch, length, heads * size)
            if bias is not None:
                added = bias[bias_offset : bias_offset + heads * size].astype(np.float32)
                x = (x.astype(np.float32) + added).astype(dtype)
            bias_offset += heads * size
            cached = _optional(inputs, 5 + slot)
            if slot and cached is not None:
                x = np.concatenate([cached.transpose(0, 2, 1, 3).reshape(layout.batch, past, heads * size), x], axis=1)
            operands.append(x)
        mask, attention_bias = _optional(inputs, 4), _optional(inputs, 5)
        causal = bool(int(attrs.get("unidirectional", 0))) and layout.sq > 1
        additive = attention_bias
        total = past + layout.length
        if mask is not None or causal:
            shape = (layout.batch, 1 if attention_bias is None else int(attention_bias.shape[1]), layout.sq, total)
            filter_value = float(attrs.get("mask_filter_value", -10000.0))
            additive = additive_mask(OP, mask, attention_bias, causal, past, filter_value, shape)
        scale = float(attrs.get("scale", 0.0)) or 1.0 / float(np.sqrt(np.float32(layout.head)))
        results = [standard_attention(operands[0], operands[1], operands[2], additive, heads, heads, scale)]
        for slot, size in ((1, layout.head), (2, layout.value_head)):
            if len(outputs) > slot:
                present = operands[slot].reshape(layout.batch, total, heads, size).transpose(0, 2, 1, 3)
                results.append(np.ascontiguousarray(present))
        return results

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        shapes = [None if info is None else tuple(info.shape) for info in inputs[:3]]
        bias = _optional(inputs, 3)
        layout = _Layout(shapes + [None] * (3 - len(shapes)), int(attrs.get("num_heads", 0)), bias is not None)
        past = _check(inputs, outputs, layout)
        floats = [*inputs[:4], *[_optional(inputs, i) for i in (5, 6, 7)], *outputs]
        dtype = device_float(OP, floats, caps)
        heads, batch = layout.heads, layout.batch
        builder = PlanBuilder(OP)
        operands = []
        bias_offset = 0
        for slot, ((index, offset, strides), size, length) in enumerate(
            zip(layout.sources, layout.sizes(), layout.lengths())
        ):
            source = Strided(Binding("input", index), dtype, offset, strides)
            added = None if bias is None else Strided(Binding("input", 3), dtype, bias_offset, (0, 0, size, 1))
            bias_offset += heads * size
            cached = head_major(Binding("input", 5 + slot), dtype, 0, heads, past, size) if slot and past else None
            shape = (batch, length, heads, size)
            operands.append(gathered(builder, dtype, shape, source, caps, added, cached, past if slot else 0))

        mask, attention_bias = _optional(inputs, 4), _optional(inputs, 5)
        causal = bool(int(attrs.get("unidirectional", 0))) and layout.sq > 1
        additive = None if attention_bias is None else (Binding("input", 5), attention_bias)
        total = past + layout.length
        if mask is not None or causal:
            shape = (batch, 1 if attention_bias is None else int(attention_bias.shape[1]), layout.sq, total)
            info = TensorInfo(shape, F32)
            at = builder.scratch(info)
            filter_value = float(attrs.get("mask_filter_value", -10000.0))
            mask_part = None if mask is None else (Binding("input", 4), mask)
            builder.add(mask_kernel(OP, mask_part, additive, causal, past, filter_value, shape, at, caps))
            additive = (at, info)
        scale = float(attrs.get("scale", 0.0)) or 1.0 / float(np.sqrt(np.float32(layout.head)))
        attention_plan(builder, operands, additive, Binding("output", 0), heads, heads, scale, caps)
        for slot in (1, 2):
            if len(outputs) > slot:
                present_copy(builder, operands[slot], heads, Binding("output", slot), 0, caps)
        return builder.build()
