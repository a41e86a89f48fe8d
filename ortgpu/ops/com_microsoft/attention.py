"""onnxruntime's ``Attention`` (com.microsoft): a packed Q/K/V projection, then multi-head attention.

``input [B, S, K] @ weights [K, Hq + Hk + Hv] + bias`` gives Q, K and V side by side (``qkv_hidden_sizes``, default
three equal thirds); each splits into ``num_heads`` heads.  A ``past`` state ``[2, B, N, P, H]`` goes in front of
K and V, and ``present`` ``[2, B, N, P + S, H]`` returns them.  The scores ``scale * Q.K^T`` (default scale ``1 /
sqrt(H)``) get an additive bias: ``mask_filter_value`` (default -10000) at keys the ``mask_index`` masks (key end
positions ``[B]``, end and start positions ``[2B]``, a 0/1 mask ``[B, T]`` or ``[B, S, T]``), keys past the
causal frontier dropped with ``unidirectional`` (for more than one query), and ``attention_bias`` ``[B or 1, N or 1, S, T]``.
As on onnxruntime's CPU, masked keys are added a large negative value, not dropped, and 4-D Megatron masks,
``do_rotary`` and a shared past/present buffer are refused.

On the device (float32, or float16 with ``shader-f16``) the plan is the MatMul operator's GEMM for the projection
into a scratch buffer, copy kernels that split it into Q, K, V (adding the bias, and the past in front), a kernel
building the additive mask where one is needed, the standard Attention operator's kernel for the output, and copies
into ``present``.  The reference computes the same steps in numpy (the standard Attention's reference for the last).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import Binding, DeviceCaps, Operator, OpPlan, TensorInfo
from .._registry import register
from ..ai_onnx.matmul import MatMul
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
    token_major,
)

__all__ = ["Attention", "PackedInputs", "attend_packed", "packed_geometry", "plan_packed_attention"]


Geometry = tuple[int, int, int, tuple[int, int, int], int, int]


def packed_geometry(
    x: tuple[int, ...],
    w: tuple[int, ...],
    past: tuple[int, ...] | None,
    attrs: Mapping[str, Any],
    op_type: str = "Attention",
) -> Geometry:
    """(batch, sequence, heads, (Hq, Hk, Hv), head size, past length) after checking the shapes and attributes
    (also QAttention's, whose packed projection has the same shape; ``op_type`` names the operator in errors)."""
    for name in ("do_rotary", "past_present_share_buffer"):
        if int(attrs.get(name, 0)):
            raise UnsupportedOpError(f"{op_type} (com.microsoft): {name}=1 is not supported; export without it")
    if len(x) != 3 or len(w) != 2 or x[2] != w[0]:
        raise ShapeError(f"{op_type} (com.microsoft): input {x} must be [B, S, K] and weights {w} [K, 3 * hidden]")
    heads = int(attrs.get("num_heads", 0))
    sizes = tuple(int(s) for s in attrs.get("qkv_hidden_sizes", ())) or (w[1] // 3,) * 3
    if len(sizes) != 3 or sum(sizes) != w[1] or sizes[0] != sizes[1]:
        raise ShapeError(
            f"{op_type} (com.microsoft): qkv_hidden_sizes {sizes} must be three sizes (Q and K equal) summing to "
            f"the weights' {w[1]} columns"
        )
    if heads <= 0 or any(s % heads or s <= 0 for s in sizes):
        raise ShapeError(f"{op_type} (com.microsoft): num_heads {heads} must divide the hidden sizes {sizes}")
    head = sizes[0] // heads
    past_length = 0
    if past is not None:
        if sizes[2] != sizes[0] or len(past) != 5 or past[:3] != (2, x[0], heads) or past[4] != head:
            raise ShapeError(f"{op_type} (com.microsoft): past {past} must be [2, {x[0]}, {heads}, P, {head}]")
        past_length = past[3]
    return x[0], x[1], heads, (sizes[0], sizes[1], sizes[2]), head, past_length


def attend_packed(
    packed: np.ndarray,
    geometry: Geometry,
    mask: np.ndarray | None,
    past: np.ndarray | None,
    attention_bias: np.ndarray | None,
    attrs: Mapping[str, Any],
    want_present: bool,
    op_type: str,
) -> list[np.ndarray]:
    """The reference after the projection: the packed ``[B, S, Hq + Hk + Hv]`` Q, K, V (bias added) split into
    heads, the past in front, the mask and causal frontier applied; returns the output (and ``present``)."""
    batch, sq, heads, (hq, hk, hv), head, past_length = geometry
    dtype = packed.dtype
    q, k, v = packed[..., :hq], packed[..., hq : hq + hk], packed[..., hq + hk :]
    if past is not None:
        # [B, N, P, H] -> [B, P, N * H] in front of the new keys and values
        k = np.concatenate([past[0].transpose(0, 2, 1, 3).reshape(batch, past_length, hk), k], axis=1)
        v = np.concatenate([past[1].transpose(0, 2, 1, 3).reshape(batch, past_length, hv), v], axis=1)
    total = past_length + sq
    scale = float(attrs.get("scale", 0.0)) or 1.0 / float(np.sqrt(np.float32(head)))
    causal = bool(int(attrs.get("unidirectional", 0))) and sq > 1
    additive = attention_bias
    if mask is not None or causal:
        heads_of_bias = 1 if attention_bias is None else int(attention_bias.shape[1])
        shape = (batch, heads_of_bias, sq, total)
        filter_value = float(attrs.get("mask_filter_value", -10000.0))
        additive = additive_mask(op_type, mask, attention_bias, causal, past_length, filter_value, shape)
    y = standard_attention(q, k, v, additive, heads, heads, scale)
    results = [y]
    if want_present:
        present_k = k.reshape(batch, total, heads, head).transpose(0, 2, 1, 3)
        present_v = v.reshape(batch, total, heads, hv // heads).transpose(0, 2, 1, 3)
        results.append(np.stack([present_k, present_v]).astype(dtype))
    return results


@dataclass(frozen=True)
class PackedInputs:
    """Where the node binds the parts that follow the projection (None: absent): the packed bias ``[Hq + Hk +
    Hv]`` (None also where the projection added it), the mask, the past ``[2, B, N, P, H]``, the attention bias."""

    bias: Binding | None
    mask: tuple[Binding, TensorInfo] | None
    past: Binding | None
    attention_bias: tuple[Binding, TensorInfo] | None


def plan_packed_attention(
    builder: PlanBuilder,
    packed_at: Binding,
    dtype: np.dtype[Any],
    geometry: Geometry,
    parts: PackedInputs,
    attrs: Mapping[str, Any],
    caps: DeviceCaps,
    want_present: bool,
) -> None:
    """Add the kernels after the projection into ``packed_at`` (``[B * S, Hq + Hk + Hv]`` of ``dtype``): the split
    into Q, K, V (bias added, past in front), the additive mask, the standard Attention into output 0, and the
    copies into ``present`` (output 1) when ``want_present``."""
    batch, sq, heads, (hq, hk, hv), head, past_length = geometry
    total, width = past_length + sq, hq + hk + hv
    # Q [B, S, N * H]; K and V [B, T, N * H] with the past in front
    operands = []
    for offset, hidden, slot in ((0, hq, -1), (hq, hk, 0), (hq + hk, hv, 1)):
        size = hidden // heads
        source = token_major(packed_at, dtype, offset, sq, width, size)
        added = None if parts.bias is None else Strided(parts.bias, dtype, offset, (0, 0, size, 1))
        cached = None
        if slot >= 0 and past_length and parts.past is not None:
            start = slot * batch * heads * past_length * size
            cached = head_major(parts.past, dtype, start, heads, past_length, size)
        shape = (batch, sq, heads, size)
        operands.append(gathered(builder, dtype, shape, source, caps, added, cached, past_length if slot >= 0 else 0))

    causal = bool(int(attrs.get("unidirectional", 0))) and sq > 1
    additive = parts.attention_bias
    if parts.mask is not None or causal:
        heads_of_bias = 1 if parts.attention_bias is None else int(parts.attention_bias[1].shape[1])
        shape = (batch, heads_of_bias, sq, total)
        info = TensorInfo(shape, F32)
        at = builder.scratch(info)
        filter_value = float(attrs.get("mask_filter_value", -10000.0))
        builder.add(
            mask_kernel(builder.op_type, parts.mask, additive, causal, past_length, filter_value, shape, at, caps)
        )
        additive = (at, info)
    scale = float(attrs.get("scale", 0.0)) or 1.0 / float(np.sqrt(np.float32(head)))
    attention_plan(builder, operands, additive, Binding("output", 0), heads, heads, scale, caps)

    if want_present:
        for slot, operand in enumerate(operands[1:]):
            start = slot * batch * heads * total * head
            present_copy(builder, operand, heads, Binding("output", 1), start, caps)


def _optional(inputs: Sequence[Any], index: int) -> Any:
    return inputs[index] if len(inputs) > index else None


@register
class Attention(Operator):
    """com.microsoft Attention-1."""

    op_type = "Attention"
    domain = "com.microsoft"
    since_version = 1

    def output_shapes(
        self, inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
    ) -> list[tuple[int, ...]] | None:
        x, w, past = inputs[0], inputs[1], _optional(inputs, 4)
        assert x is not None and w is not None
        batch, sq, heads, sizes, head, past_length = packed_geometry(x.shape, w.shape, past and past.shape, attrs)
        return [(batch, sq, sizes[2]), (2, batch, heads, past_length + sq, head)]

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, w = inputs[0], inputs[1]
        assert x is not None and w is not None
        bias, mask, past, attention_bias = (_optional(inputs, i) for i in (2, 3, 4, 5))
        if _optional(inputs, 6) is not None:
            raise UnsupportedOpError(
                "Attention (com.microsoft): past_sequence_length (a shared buffer) is not supported"
            )
        batch, sq, heads, (hq, hk, hv), head, past_length = packed_geometry(
            x.shape, w.shape, None if past is None else past.shape, attrs
        )
        dtype = x.dtype
        wide = np.float32 if dtype == np.float16 else dtype  # the GEMM's accumulation, as MatMul computes it
        packed = np.matmul(x.reshape(batch * sq, -1).astype(wide), w.astype(wide)).astype(dtype)
        if bias is not None:
            packed = (packed.astype(np.float32) + bias.astype(np.float32)).astype(dtype)
        packed = packed.reshape(batch, sq, hq + hk + hv)
        geometry = (batch, sq, heads, (hq, hk, hv), head, past_length)
        return attend_packed(packed, geometry, mask, past, attention_bias, attrs, len(outputs) > 1, "Attention")

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x, w = inputs[0], inputs[1]
        assert x is not None and w is not None
        bias, mask, past, attention_bias = (_optional(inputs, i) for i in (2, 3, 4, 5))
        if _optional(inputs, 6) is not None:
            raise UnsupportedOpError(
                "Attention (com.microsoft): past_sequence_length (a shared buffer) is not supported"
            )
        batch, sq, heads, (hq, hk, hv), head, past_length = packed_geometry(
            x.shape, w.shape, None if past is None else past.shape, attrs
        )
        dtype = device_float("Attention", [x, w, bias, past, attention_bias, *outputs], caps)
        width = hq + hk + hv
        builder = PlanBuilder("Attention")
        packed = TensorInfo((batch * sq, width), dtype)
        projection = MatMul(13).plan([TensorInfo((batch * sq, x.shape[2]), dtype), w], [packed], {}, caps, {})
        packed_at = builder.scratch(packed)
        builder.include(projection, [Binding("input", 0), Binding("input", 1)], [packed_at])

        geometry = (batch, sq, heads, (hq, hk, hv), head, past_length)
        parts = PackedInputs(
            bias=None if bias is None else Binding("input", 2),
            mask=None if mask is None else (Binding("input", 3), mask),
            past=None if past is None else Binding("input", 4),
            attention_bias=None if attention_bias is None else (Binding("input", 5), attention_bias),
        )
        plan_packed_attention(builder, packed_at, dtype, geometry, parts, attrs, caps, len(outputs) > 1)
        return builder.build()
