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

On the device (float32, or float16 with ``shader-f16``), first prompts and decoding steps alike: copy kernels
splitting a packed query, a kernel writing the rotary positions (``past_b + i``) and the standard RotaryEmbedding
kernel on Q and K with ``do_rotary``, a kernel turning ``seqlens_k`` into an additive ``-inf`` mask (and flagging the
run, which then raises, where a length does not fit; ``total_sequence_length`` is read by no kernel: its value made
the plan),
for a step with a past a kernel assembling each cache (the batch's past rows, its new rows at ``past_b``, zeros
after: positions read at run time, so one plan serves every step of a fixed total length), the standard Attention
kernel with its grouped heads, and copies into the present outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    #: past_key / present_key and past_value / present_value may be one buffer (onnxruntime-genai's static cache):
    #: the plan assembles each cache from the past before it writes the present.
    in_place_pairs = ((3, 1), (4, 2))
    data_error_hint = (
        "GroupQueryAttention: each seqlens_k + 1 must hold the new tokens and fit the present cache (a decode step "
        "past a full cache)"
    )

    def output_infos_from_values(
        self, inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any], values: Mapping[int, np.ndarray]
    ) -> list[TensorInfo] | None:
        """``[B, S, N * H]`` and the presents ``[B, Nkv, max(total_sequence_length, P), H]``: from the shapes and the
        total's value, not from a run on zero ``seqlens_k`` (which a step of several queries after a past refuses)."""
        total = values.get(6)
        query = inputs[0]
        if total is None or query is None:
            return None
        batch, sq, heads, kv_heads, head, past = _geometry(inputs, 3, attrs)
        present = max(int(np.asarray(total).reshape(-1)[0]), past)
        cache = TensorInfo((batch, kv_heads, present, head), query.dtype)
        return [TensorInfo((batch, sq, heads * head), query.dtype), cache, cache]

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
        if total_value is None:
            raise NotOnDevice(f"{OP}: total_sequence_length must be known when planning (a constant or a graph input)")
        total_length = int(np.asarray(total_value).reshape(-1)[0])
        first = total_length == sq
        present_length = max(total_length, past)
        if sq > present_length or total_length < 1:
            raise NotOnDevice(f"{OP}: total_sequence_length {total_length} does not fit {sq} queries")
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
        steps = _Steps(batch, sq, past, present_length, first)
        mask_info = TensorInfo((batch, 1, sq, present_length), F32)
        attention_bias = _optional(inputs, 10)
        if attention_bias is not None:
            if tuple(attention_bias.shape[2:]) != (sq, present_length):
                raise NotOnDevice(
                    f"{OP}: attention_bias {attention_bias.shape} does not end in [{sq}, {present_length}]"
                )
            mask_info = TensorInfo((batch, int(attention_bias.shape[1]), sq, present_length), F32)
        mask_at = builder.scratch(mask_info)
        window = int(attrs.get("local_window_size", -1))
        builder.add(_mask_kernel(steps, mask_info.shape, attention_bias, window, mask_at, caps))
        if rotary:
            cos = inputs[7]
            assert cos is not None
            ids = TensorInfo((batch, sq), np.dtype(np.int64))
            ids_at = builder.scratch(ids)
            builder.add(_positions_kernel(steps, ids_at, caps))
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
        if not first or past:
            # the cache: each batch's past, then its new keys and values at run-time positions, zeros after
            for slot in (1, 2):
                past_info = _optional(inputs, 2 + slot)
                full = TensorInfo((batch, present_length, kv_heads * head), dtype)
                full_at = builder.scratch(full)
                past_binding = None if past_info is None else (Binding("input", 2 + slot), past_info)
                builder.add(_cache_kernel(steps, kv_heads, head, operands[slot], past_binding, full_at, caps))
                operands[slot] = (full_at, full)
        attention_plan(builder, operands, mask, Binding("output", 0), heads, kv_heads, scale, caps, softcap)
        for slot in (1, 2):
            if len(outputs) > slot:
                present_copy(builder, operands[slot], kv_heads, Binding("output", slot), 0, caps)
        return builder.build()


@dataclass(frozen=True)
class _Steps:
    """What a plan knows of where the queries stand: ``first`` (a first prompt: the queries are positions 0 .. S - 1)
    or a decoding step, where batch ``b``'s queries follow ``past_b = seqlens_k[b] + 1 - S`` cached positions, read
    at run time; ``past`` is the past buffers' length, ``present`` the caches' ``max(total_sequence_length,
    past)``."""

    batch: int
    sq: int
    past: int
    present: int
    first: bool

    def wgsl_past(self, lengths: str) -> str:
        """WGSL (i32) of batch ``b``'s past length from the lengths variable ``lengths`` (seqlens_k + 1)."""
        return "0" if self.first else f"{lengths} - {self.sq}"

    def pasts(self, lengths: np.ndarray) -> np.ndarray:
        return np.zeros_like(lengths) if self.first else lengths - self.sq

    def valid(self, lengths: np.ndarray) -> bool:
        """Whether run-time ``lengths`` (seqlens_k + 1) fit the plan (as the reference checks; the total's value
        made the plan, so it fits by construction and no kernel reads it)."""
        pasts = self.pasts(lengths)
        return bool(
            lengths.min(initial=1) >= 1
            and lengths.max(initial=0) <= (self.sq if self.first else self.present)
            and pasts.min(initial=0) >= 0
            and (self.first or pasts.max(initial=0) <= self.past)
        )

    def wgsl_invalid(self, length: str) -> str:
        """WGSL condition: the run's lengths do not fit the plan (see :meth:`valid`)."""
        limit = self.sq if self.first else self.present
        past = self.wgsl_past(length)
        checks = [f"{length} < 1", f"{length} > {limit}", f"{past} < 0"]
        if not self.first:
            checks.append(f"{past} > {self.past}")
        return " || ".join(checks)


def _mask_kernel(
    steps: _Steps,
    shape: tuple[int, ...],
    attention_bias: TensorInfo | None,
    window: int,
    target: Binding,
    caps: DeviceCaps,
) -> KernelSpec:
    """The additive mask ``[B, heads or 1, S, T]`` from ``seqlens_k`` (0 where a key is seen, -inf where not, plus
    the attention bias); flags the run where a length does not fit the plan.  ``total_sequence_length`` is not read:
    its value made the plan (so a capture may keep it bound on the host)."""
    batch, heads, sq, keys = shape
    count = int(np.prod(shape))
    table = BindingTable()
    lengths = table.add(Binding("input", 5), "i32")
    added = ""
    if attention_bias is not None:
        element = float_element(attention_bias)
        name = table.add(Binding("input", 10), element)
        b_stride = int(attention_bias.shape[1]) * sq * keys if int(attention_bias.shape[0]) != 1 else 0
        h_stride = sq * keys if int(attention_bias.shape[1]) != 1 else 0
        added = f"m = f32({name}[b * {b_stride}u + h * {h_stride}u + i * {keys}u + j]) + m;"
    status = table.add(Binding("status"), "atomic<u32>", writable=True)
    out = table.add(target, "f32", writable=True)
    grid = grid_for_groups(-(-count // THREADS), caps)
    windowed = f" || i32(j) <= position - {window}" if window > 0 else ""
    wgsl = f"""{table.enables()}{table.declarations()}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let n = {workgroup_index(grid)} * {THREADS}u + li;
    if (n >= {count}u) {{ return; }}
    let j = n % {keys}u;
    let i = (n / {keys}u) % {sq}u;
    let h = (n / {sq * keys}u) % {heads}u;
    let b = n / {sq * keys * heads}u;
    _ = h;
    let length = {lengths}[b] + 1;
    if ({steps.wgsl_invalid("length")}) {{ atomicOr(&{status}[0], 1u); }}
    let position = {steps.wgsl_past("length")} + i32(i);
    var bits = 0xff800000u;
    var m = 0.0;
    if (i32(j) >= length || i32(j) > position{windowed}) {{ m = bitcast<f32>(bits); }}
    {added}
    {out}[n] = m;
}}
"""

    def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        seen = arrays[0][: 4 * batch].view(np.int32).astype(np.int64) + 1
        if not steps.valid(seen):
            arrays[-2][:4] = np.frombuffer(np.uint32(1).tobytes(), dtype=np.uint8)
        allowed = _allowed(seen, steps.pasts(seen), sq, keys, window)
        mask = np.where(allowed, np.float32(0), -np.inf)
        if attention_bias is not None:
            bias = arrays[1][: attention_bias.nbytes].view(attention_bias.dtype).reshape(attention_bias.shape)
            mask = bias.astype(np.float32) + mask
        result = np.ascontiguousarray(np.broadcast_to(mask, shape), dtype=np.float32)
        arrays[-1][: result.nbytes] = result.reshape(-1).view(np.uint8)

    return KernelSpec(OP, wgsl, grid, tuple(table.bindings), twin)


def _positions_kernel(steps: _Steps, target: Binding, caps: DeviceCaps) -> KernelSpec:
    """The rotary positions, int64 ``[B, S]``: ``past_b + i`` (a first prompt: ``i`` in every batch, onnxruntime's
    CPU kernel rotating a padded row at its index too)."""
    batch, sq = steps.batch, steps.sq
    table = BindingTable()
    lengths = table.add(Binding("input", 5), "i32")
    out = table.add(target, "u32", writable=True)
    count = batch * sq
    grid = grid_for_groups(-(-count // THREADS), caps)
    wgsl = f"""{table.declarations()}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let n = {workgroup_index(grid)} * {THREADS}u + li;
    if (n >= {count}u) {{ return; }}
    let b = n / {sq}u;
    let length = {lengths}[b] + 1;
    _ = length;
    let position = max({steps.wgsl_past("length")}, 0) + i32(n % {sq}u);
    {out}[2u * n] = u32(position);
    {out}[2u * n + 1u] = 0u;
}}
"""

    def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        seen = arrays[0][: 4 * batch].view(np.int32).astype(np.int64) + 1
        ids = np.maximum(steps.pasts(seen), 0)[:, None] + np.arange(sq, dtype=np.int64)[None, :]
        arrays[1][: 8 * count] = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1).view(np.uint8)

    return KernelSpec(OP, wgsl, grid, tuple(table.bindings), twin)


def _cache_kernel(
    steps: _Steps,
    kv_heads: int,
    head: int,
    new: tuple[Binding, TensorInfo],
    past: tuple[Binding, TensorInfo] | None,
    target: Binding,
    caps: DeviceCaps,
) -> KernelSpec:
    """A cache ``[B, T, Nkv * H]`` (token-major, as the attention reads it): batch ``b``'s first ``past_b``
    positions from ``past`` ``[B, Nkv, P, H]``, the ``S`` new ones from ``new`` ``[B, S, Nkv * H]`` after them, zeros
    after those; ``past_b`` read at run time (lengths that do not fit are flagged by the mask kernel)."""
    batch, sq, keys, kv = steps.batch, steps.sq, steps.present, kv_heads * head
    count = batch * keys * kv
    dtype = new[1].dtype
    element = float_element(new[1])
    table = BindingTable()
    lengths = table.add(Binding("input", 5), "i32")
    fresh = table.add(new[0], element)
    cached = table.add(past[0], element) if past is not None else ""
    out = table.add(target, element, writable=True)
    grid = grid_for_groups(-(-count // THREADS), caps)
    from_past = (
        f"if (t < past_b) {{ value = {cached}[((b * {kv_heads}u + n) * {steps.past}u + u32(t)) * {head}u + d]; }}"
        if past is not None
        else ""
    )
    wgsl = f"""{table.enables()}{table.declarations()}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let m = {workgroup_index(grid)} * {THREADS}u + li;
    if (m >= {count}u) {{ return; }}
    let d = m % {head}u;
    let n = (m / {head}u) % {kv_heads}u;
    let t = i32((m / {kv}u) % {keys}u);
    let b = m / {kv * keys}u;
    let length = {lengths}[b] + 1;
    _ = length;
    let past_b = clamp({steps.wgsl_past("length")}, 0, {steps.past});
    var value = {element}(0.0);
    {from_past}
    if (t >= past_b && t < past_b + {sq}) {{ value = {fresh}[(b * {sq}u + u32(t - past_b)) * {kv}u + n * {head}u + d]; }}
    {out}[m] = value;
}}
"""

    def twin(arrays: Sequence[np.ndarray], grid: tuple[int, int, int]) -> None:
        seen = arrays[0][: 4 * batch].view(np.int32).astype(np.int64) + 1
        pasts = np.clip(steps.pasts(seen), 0, steps.past)
        new_values = arrays[1][: batch * sq * kv * dtype.itemsize].view(dtype).reshape(batch, sq, kv)
        if past is not None:
            past_values = arrays[2][: past[1].nbytes].view(dtype).reshape(batch, kv_heads, steps.past, head)
        result = np.zeros((batch, keys, kv), dtype)
        for b in range(batch):
            p = int(pasts[b])
            if p and past is not None:
                result[b, :p] = past_values[b, :, :p].transpose(1, 0, 2).reshape(p, kv)
            stop = min(p + sq, keys)
            result[b, p:stop] = new_values[b, : stop - p]
        arrays[-1][: result.nbytes] = result.reshape(-1).view(np.uint8)

    return KernelSpec(OP, wgsl, grid, tuple(table.bindings), twin)
