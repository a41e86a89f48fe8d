"""onnxruntime's ``GroupQueryAttention`` (com.microsoft): causal attention with fewer key/value heads and a KV cache.

Q is ``[B, S, N * H]`` and K, V ``[B, S, Nkv * H]`` (``kv_num_heads`` of them; query head ``h`` reads key/value head
``h // (N / Nkv)``), or all three packed in ``query [B, S, (N + 2 Nkv) * H]``.  ``seqlens_k [B]`` (int32) is each
batch's total length minus one, ``total_sequence_length`` (int32, one value) the longest.  As in onnxruntime: the
node is the first prompt when ``S == total_sequence_length``, and then batch ``b``'s queries are positions ``0 ..
S - 1``; otherwise they follow ``past_b = seqlens_k[b] + 1 - S`` cached positions.  ``present_key``/``present_value``
``[B, Nkv, max(total_sequence_length, P), H]`` hold each batch's first ``past_b`` cached keys (from ``past_key [B,
Nkv, P, H]``), then the ``S`` new ones, zeros after.  Query ``i`` of batch ``b`` sees keys ``j <= past_b + i`` below
``seqlens_k[b] + 1`` (and, with ``local_window_size`` ``w > 0``, ``j >= past_b + i - w``); the scores ``scale * Q.K``
(default ``1 / sqrt(H)``) are soft-capped with ``softcap`` and ``attention_bias`` ``[B or 1, N or 1, S, T]`` is
added.  With ``do_rotary`` Q and K are rotated first (caches ``[max position, rotary dim / 2]``) at the queries'
positions (a first prompt's rows at their indices, padded rows too, as onnxruntime's CPU kernel does).

The present's length depends on the value of ``total_sequence_length``: a model feeding it from a graph input is
planned for its value (the loader lists it among the value-dependent inputs).  ``smooth_softmax``, ``head_sink``,
``position_ids`` and the ``output_qk`` output are refused.  Query rows past a batch's length in a first prompt are
left to onnxruntime's whim there (it softmaxes scores it never computed); here they see the batch's keys.

On the device (float32, or float16 with ``shader-f16``) runs the first prompt (no past, or an empty one): copy kernels
splitting a packed query, the standard RotaryEmbedding kernel on Q and K with ``do_rotary``, a kernel turning
``seqlens_k`` into an additive ``-inf`` mask (and flagging the run, which then raises, where
``total_sequence_length`` is not ``S``), the standard Attention kernel with its grouped heads, and copies into the
present outputs.  Decoding steps (a non-empty past) run on the CPU: where each batch's new keys land in the cache
is run-time data there.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import InvalidArgumentError, ShapeError, UnsupportedOpError

from .._kernel import Binding, DeviceCaps, KernelSpec, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register
from .._tiling import THREADS, BindingTable, float_element, grid_for_groups, workgroup_index
from ..ai_onnx.rotary_embedding import RotaryEmbedding as StandardRotary
from ._attention_parts import (
    F32,
    PlanBuilder,
    attention_plan,
    device_float,
    gathered,
    present_copy,
    standard_attention,
    token_major,
)

__all__ = ["GroupQueryAttention"]

OP = "GroupQueryAttention"


def _optional(inputs: Sequence[Any], index: int) -> Any:
    return inputs[index] if len(inputs) > index else None


def _geometry(
    inputs: Sequence[Any], outputs_count: int, attrs: Mapping[str, Any]
) -> tuple[int, int, int, int, int, int]:
    """(batch, S, N, Nkv, H, past buffer length) after checking shapes and refusing what is not supported."""
    for name in ("smooth_softmax", "qk_output"):
        if int(attrs.get(name, 0)):
            raise UnsupportedOpError(f"{OP}: {name} is not supported; export without it")
    for index, name in ((9, "position_ids"), (11, "head_sink")):
        if _optional(inputs, index) is not None:
            raise UnsupportedOpError(f"{OP}: the {name} input is not supported")
    if outputs_count > 3:
        raise UnsupportedOpError(f"{OP}: the output_qk output is not supported; drop it from the node's outputs")
    query, key, value = inputs[0], _optional(inputs, 1), _optional(inputs, 2)
    heads, kv_heads = int(attrs.get("num_heads", 0)), int(attrs.get("kv_num_heads", 0))
    if heads <= 0 or kv_heads <= 0 or heads % kv_heads:
        raise ShapeError(f"{OP}: num_heads {heads} must be a positive multiple of kv_num_heads {kv_heads}")
    q = tuple(query.shape)
    if len(q) != 3:
        raise ShapeError(f"{OP}: query {q} must be [B, S, hidden]")
    batch, sq, width = q
    if key is None:
        if value is not None or width % (heads + 2 * kv_heads):
            raise ShapeError(f"{OP}: packed query {q} must be [B, S, (N + 2 Nkv) * H] with no key or value")
        head = width // (heads + 2 * kv_heads)
    else:
        head = width // heads
        want = (batch, sq, kv_heads * head)
        if width % heads or value is None or tuple(key.shape) != want or tuple(value.shape) != want:
            raise ShapeError(f"{OP}: key/value must be {want} for query {q}")
    past_key, past_value = _optional(inputs, 3), _optional(inputs, 4)
    past = 0
    if (past_key is None) != (past_value is None):
        raise ShapeError(f"{OP}: past_key and past_value must be given together")
    if past_key is not None:
        pk, pv = tuple(past_key.shape), tuple(past_value.shape)
        if len(pk) != 4 or pk != pv or pk[:2] != (batch, kv_heads) or pk[3] != head:
            raise ShapeError(f"{OP}: past_key {pk} / past_value {pv} must be [{batch}, {kv_heads}, P, {head}]")
        past = pk[2]
    seqlens, total = _optional(inputs, 5), _optional(inputs, 6)
    if seqlens is None or total is None or tuple(seqlens.shape) != (batch,) or int(np.prod(total.shape)) != 1:
        raise ShapeError(f"{OP}: seqlens_k must be [{batch}] and total_sequence_length one value")
    if int(attrs.get("do_rotary", 0)):
        cos, sin = _optional(inputs, 7), _optional(inputs, 8)
        if cos is None or sin is None or len(cos.shape) != 2 or tuple(cos.shape) != tuple(sin.shape):
            raise ShapeError(f"{OP}: do_rotary needs cos_cache and sin_cache of one 2-D shape")
        if 2 * int(cos.shape[1]) > head:
            raise ShapeError(f"{OP}: the caches' rotary dimension {2 * cos.shape[1]} exceeds the head size {head}")
    return batch, sq, heads, kv_heads, head, past


def _rotary_attrs(heads: int, cache: tuple[int, ...], attrs: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "num_heads": heads,
        "interleaved": int(attrs.get("rotary_interleaved", 0)),
        "rotary_embedding_dim": 2 * int(cache[1]),
    }


def _allowed(lengths: np.ndarray, pasts: np.ndarray, sq: int, total: int, window: int) -> np.ndarray:
    """``[B, 1, S, T]``: which keys each query sees (below its batch's length, causal, in its window)."""
    keys = np.arange(total)[None, None, :]
    position = pasts[:, None, None] + np.arange(sq)[None, :, None]
    allowed = (keys < lengths[:, None, None]) & (keys <= position)
    if window > 0:
        allowed &= keys > position - window
    return allowed[:, None]


@register
class GroupQueryAttention(Operator):
    """com.microsoft GroupQueryAttention-1."""

    op_type = OP
    domain = "com.microsoft"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        batch, sq, heads, kv_heads, head, past = _geometry(inputs, len(outputs), attrs)
        query = inputs[0]
        assert query is not None
        dtype, kv = query.dtype, kv_heads * head
        key, value = _optional(inputs, 1), _optional(inputs, 2)
        if key is None or value is None:
            q, k, v = query[..., : heads * head], query[..., heads * head : heads * head + kv], query[..., -kv:]
        else:
            q, k, v = query, key, value
        total_value = int(np.asarray(inputs[6]).reshape(-1)[0])
        present = max(total_value, past)
        lengths = np.asarray(inputs[5]).astype(np.int64).reshape(-1) + 1
        first = sq == total_value
        pasts = np.zeros(batch, np.int64) if first else lengths - sq
        if lengths.max(initial=0) > present or lengths.min(initial=1) < 1 or pasts.min(initial=0) < 0 or sq > present:
            raise InvalidArgumentError(f"{OP}: seqlens_k {lengths - 1} do not fit {sq} queries and a past of {past}")
        if int(attrs.get("do_rotary", 0)):
            cos, sin = inputs[7], inputs[8]
            assert cos is not None and sin is not None
            rows = np.arange(sq)[None, :]
            ids = np.broadcast_to(rows, (batch, sq)) if first else pasts[:, None] + rows
            info = [TensorInfo(q.shape, dtype)]
            q = StandardRotary(23).reference([q, cos, sin, ids], _rotary_attrs(heads, cos.shape, attrs), info)[0]
            info = [TensorInfo(k.shape, dtype)]
            k = StandardRotary(23).reference([k, cos, sin, ids], _rotary_attrs(kv_heads, cos.shape, attrs), info)[0]
        caches = []
        for new, cached in ((k, _optional(inputs, 3)), (v, _optional(inputs, 4))):
            full = np.zeros((batch, present, kv), dtype)
            for b in range(batch):
                p = int(pasts[b])
                if p and cached is not None:
                    full[b, :p] = cached[b, :, :p].transpose(1, 0, 2).reshape(p, kv)
                full[b, p : p + sq] = new[b]
            caches.append(full)
        window = int(attrs.get("local_window_size", -1))
        mask = np.where(_allowed(lengths, pasts, sq, present, window), np.float32(0), -np.inf).astype(np.float32)
        attention_bias = _optional(inputs, 10)
        if attention_bias is not None:
            mask = (attention_bias.astype(np.float32) + mask).astype(np.float32)
        scale = float(attrs.get("scale", 0.0)) or 1.0 / float(np.sqrt(np.float32(head)))
        softcap = float(attrs.get("softcap", 0.0))
        results = [standard_attention(q, caches[0], caches[1], mask, heads, kv_heads, scale, softcap)]
        for cache in caches[: len(outputs) - 1]:
            results.append(np.ascontiguousarray(cache.reshape(batch, present, kv_heads, head).transpose(0, 2, 1, 3)))
        return results

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        batch, sq, heads, kv_heads, head, past = _geometry(inputs, len(outputs), attrs)
        total_value = constants.get(6)
        if total_value is None or int(np.asarray(total_value).reshape(-1)[0]) != sq:
            raise NotOnDevice(
                f"{OP}: only a first prompt (total_sequence_length equal to the {sq} queries) runs on the device"
            )
        if past:
            raise NotOnDevice(
                f"{OP}: a decoding step (a past of {past} keys) runs on the CPU: where each batch's new keys land "
                "in the cache is run-time data (seqlens_k)"
            )
        seqlens, total = inputs[5], inputs[6]
        assert seqlens is not None and total is not None
        if seqlens.dtype != np.int32 or total.dtype != np.int32:
            raise NotOnDevice(f"{OP}: seqlens_k and total_sequence_length must be int32")
        rotary = bool(int(attrs.get("do_rotary", 0)))
        floats = [*inputs[:3], *(inputs[7:9] if rotary else []), _optional(inputs, 10), *outputs]
        dtype = device_float(OP, floats, caps)
        builder = PlanBuilder(OP)
        kv, width = kv_heads * head, (heads + 2 * kv_heads) * head
        operands = []
        for slot, (count, offset) in enumerate(((heads, 0), (kv_heads, heads * head), (kv_heads, heads * head + kv))):
            if _optional(inputs, 1) is None:
                source = token_major(Binding("input", 0), dtype, offset, sq, width, head)
            else:
                source = token_major(Binding("input", slot), dtype, 0, sq, count * head, head)
            operands.append(gathered(builder, dtype, (batch, sq, count, head), source, caps))
        mask_info = TensorInfo((batch, 1, sq, sq), F32)
        attention_bias = _optional(inputs, 10)
        if attention_bias is not None:
            mask_info = TensorInfo((batch, int(attention_bias.shape[1]), sq, sq), F32)
        mask_at = builder.scratch(mask_info)
        window = int(attrs.get("local_window_size", -1))
        builder.add(_mask_kernel(mask_info.shape, attention_bias, window, mask_at, caps))
        if rotary:
            cos = inputs[7]
            assert cos is not None
            ids = TensorInfo((batch, sq), np.dtype(np.int64))
            ids_at = builder.scratch(ids)
            builder.add(_positions_kernel(batch, sq, ids_at, caps))
            for slot, count in ((0, heads), (1, kv_heads)):
                binding, info = operands[slot]
                rotated = builder.scratch(info)
                plan = StandardRotary(23).plan(
                    [info, cos, inputs[8], ids], [info], _rotary_attrs(count, cos.shape, attrs), caps, {}
                )
                builder.include(plan, [binding, Binding("input", 7), Binding("input", 8), ids_at], [rotated])
                operands[slot] = (rotated, info)
        scale = float(attrs.get("scale", 0.0)) or 1.0 / float(np.sqrt(np.float32(head)))
        softcap = float(attrs.get("softcap", 0.0))
        mask = (mask_at, mask_info)
        attention_plan(builder, operands, mask, Binding("output", 0), heads, kv_heads, scale, caps, softcap)
        for slot in (1, 2):
            if len(outputs) > slot:
                present_copy(builder, operands[slot], kv_heads, Binding("output", slot), 0, caps)
        return builder.build()


def _mask_kernel(
    shape: tuple[int, ...], attention_bias: TensorInfo | None, window: int, target: Binding, caps: DeviceCaps
) -> KernelSpec:
    """A first prompt's additive mask ``[B, heads or 1, S, S]`` from ``seqlens_k`` (0 where a key is seen, -inf
    where not, plus the attention bias); flags the run where ``total_sequence_length`` is not ``S`` or a length does
    not fit."""
    batch, heads, sq, _ = shape
    count = int(np.prod(shape))
    table = BindingTable()
    lengths = table.add(Binding("input", 5), "i32")
    total = table.add(Binding("input", 6), "i32")
    added = ""
    if attention_bias is not None:
        element = float_element(attention_bias)
        name = table.add(Binding("input", 10), element)
        b_stride = int(attention_bias.shape[1]) * sq * sq if int(attention_bias.shape[0]) != 1 else 0
        h_stride = sq * sq if int(attention_bias.shape[1]) != 1 else 0
        added = f"m = f32({name}[b * {b_stride}u + h * {h_stride}u + i * {sq}u + j]) + m;"
    status = table.add(Binding("status"), "atomic<u32>", writable=True)
    out = table.add(target, "f32", writable=True)
    grid = grid_for_groups(-(-count // THREADS), caps)
    windowed = f" || i32(j) <= i32(i) - {window}" if window > 0 else ""
    wgsl = f"""{table.enables()}{table.declarations()}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let n = {workgroup_index(grid)} * {THREADS}u + li;
    if (n >= {count}u) {{ return; }}
    let j = n % {sq}u;
    let i = (n / {sq}u) % {sq}u;
    let h = (n / {sq * sq}u) % {heads}u;
    let b = n / {sq * sq * heads}u;
    _ = h;
    let length = {lengths}[b] + 1;
    if ({total}[0] != {sq} || length < 1 || length > {sq}) {{ atomicOr(&{status}[0], 1u); }}
    var bits = 0xff800000u;
    var m = 0.0;
    if (i32(j) >= length || j > i{windowed}) {{ m = bitcast<f32>(bits); }}
    {added}
    {out}[n] = m;
}}
"""

    def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        seen = arrays[0][: 4 * batch].view(np.int32).astype(np.int64) + 1
        if int(arrays[1][:4].view(np.int32)[0]) != sq or seen.min() < 1 or seen.max() > sq:
            arrays[-2][:4] = np.frombuffer(np.uint32(1).tobytes(), dtype=np.uint8)
        mask = np.where(_allowed(seen, np.zeros(batch, np.int64), sq, sq, window), np.float32(0), -np.inf)
        if attention_bias is not None:
            bias = arrays[2][: attention_bias.nbytes].view(attention_bias.dtype).reshape(attention_bias.shape)
            mask = bias.astype(np.float32) + mask
        result = np.ascontiguousarray(np.broadcast_to(mask, shape), dtype=np.float32)
        arrays[-1][: result.nbytes] = result.reshape(-1).view(np.uint8)

    return KernelSpec(OP, wgsl, grid, tuple(table.bindings), twin)


def _positions_kernel(batch: int, sq: int, target: Binding, caps: DeviceCaps) -> KernelSpec:
    """A first prompt's rotary positions, int64 ``[B, S]``: ``0 .. S - 1`` in every batch (onnxruntime's CPU kernel
    rotates a padded row at its index too)."""
    table = BindingTable()
    out = table.add(target, "u32", writable=True)
    count = batch * sq
    grid = grid_for_groups(-(-count // THREADS), caps)
    wgsl = f"""{table.declarations()}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let n = {workgroup_index(grid)} * {THREADS}u + li;
    if (n >= {count}u) {{ return; }}
    {out}[2u * n] = n % {sq}u;
    {out}[2u * n + 1u] = 0u;
}}
"""

    def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        ids = np.broadcast_to(np.arange(sq, dtype=np.int64), (batch, sq))
        arrays[0][: 8 * count] = np.ascontiguousarray(ids).reshape(-1).view(np.uint8)

    return KernelSpec(OP, wgsl, grid, tuple(table.bindings), twin)
