"""Attention-23/24/25: scaled dot-product attention with grouped heads, masks, a key/value cache and soft capping.

Q is ``[B, Hq, Sq, D]`` (or 3-D ``[B, Sq, Hq * D]`` with ``q_num_heads``), K ``[B, Hkv, Skv, D]`` and V
``[B, Hkv, Skv, Dv]`` (3-D likewise with ``kv_num_heads``); query head ``h`` reads key/value head
``h // (Hq / Hkv)``.  ``past_key``/``past_value`` are concatenated in front of K/V (the ``present`` outputs).

The score of query ``i`` and key ``j`` is ``scale * Q.K`` (default scale ``1 / sqrt(D)``), soft-capped
(``softcap * tanh(s / softcap)``), plus a bias: a float ``attn_mask`` adds, a bool one gives ``-inf`` where
False; a mask shorter than the keys counts as ``-inf`` past its end.  ``is_causal`` keeps keys
``j <= i + offset`` (offset: the past length, or ``nonpad_kv_seqlen - Sq`` per batch with an external cache),
keys at or past ``nonpad_kv_seqlen`` are dropped (opset 24), and opset 25's windows keep
``offset + i - left <= j <= offset + i + right``.  A query row with no key left is a zero row (also in
``qk_matmul_output`` mode 3), never NaN.

On the device (float32, or float16 with ``shader-f16``) one kernel computes Y: the flash kernel of
:mod:`ortgpu.ops._flash_attention` (query blocks and key tiles in workgroup memory, an online softmax) when there is
no key/value cache, no sequence lengths, no window or soft cap and the mask (if any) is float and covers every key;
otherwise one invocation per output element walks the keys once with an online softmax (running maximum, rescaled
sums), skipping the keys the bias drops; the present key/value are copy kernels; ``qk_matmul_output`` is one kernel
per score.  Float16 tensors are read into f32 and every kernel computes in f32, storing once; the reference computes
them so too (wide, one rounding at the end), except with ``softmax_precision`` float16, which computes in float16
stages as the definition does and runs on the CPU, as do the other softmax precisions than float.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._flash_attention import FlashProblem, OperandView, read_f32, stored
from .._flash_rows import attention_kernel
from .._kernel import (
    Binding,
    DeviceCaps,
    KernelSpec,
    NotOnDevice,
    Operator,
    OpPlan,
    TensorInfo,
    check_loop_budget,
    reference_twin,
)
from .._registry import register
from .._tiling import (
    THREADS,
    BindingTable,
    broadcast_strides,
    check_device_fits,
    float_element,
    grid_for_groups,
    single_kernel_plan,
    wgsl_f32,
    workgroup_index,
)

__all__ = ["Attention"]

#: softmax_precision values (TensorProto data types) numpy can compute in
_PRECISIONS: dict[int, Any] = {1: np.float32, 10: np.float16, 11: np.float64}


def _to_heads(x: np.ndarray, heads: int | None, name: str) -> np.ndarray:
    """A 3-D ``[B, S, H * D]`` tensor as ``[B, H, S, D]``; 4-D tensors unchanged."""
    if x.ndim == 4:
        return x
    if x.ndim != 3:
        raise ShapeError(f"Attention: {name} must be 3-D or 4-D, got shape {x.shape}")
    if not heads or heads <= 0 or x.shape[2] % heads:
        raise ShapeError(
            f"Attention: 3-D {name} of shape {x.shape} needs a positive head count dividing its last dimension "
            f"(q_num_heads/kv_num_heads, got {heads})"
        )
    b, s, hidden = x.shape
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


@register
class Attention(Operator):
    """Attention-23 (24 adds ``nonpad_kv_seqlen``, 25 adds ``left/right_window_size``)."""

    op_type = "Attention"
    since_version = 23

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        q_in, k_in, v_in = inputs[0], inputs[1], inputs[2]
        assert q_in is not None and k_in is not None and v_in is not None
        optional = list(inputs[3:]) + [None] * (7 - len(inputs))
        mask, past_key, past_value, nonpad = optional[0], optional[1], optional[2], optional[3]
        if (past_key is None) != (past_value is None):
            raise ShapeError("Attention: past_key and past_value must be given together")
        if nonpad is not None and past_key is not None:
            raise UnsupportedOpError("Attention: nonpad_kv_seqlen together with past_key/past_value is not defined")
        q_heads = int(attrs["q_num_heads"]) if "q_num_heads" in attrs else None
        kv_heads = int(attrs["kv_num_heads"]) if "kv_num_heads" in attrs else None
        q = _to_heads(q_in, q_heads, "Q")
        k = _to_heads(k_in, kv_heads, "K")
        v = _to_heads(v_in, kv_heads, "V")
        if past_key is not None and past_value is not None:
            k = np.concatenate([past_key, k.astype(past_key.dtype)], axis=2)
            v = np.concatenate([past_value, v.astype(past_value.dtype)], axis=2)
        batch, hq, sq, head = q.shape
        hkv, skv = k.shape[1], k.shape[2]
        if k.shape[0] != batch or v.shape[0] != batch or v.shape[1] != hkv or v.shape[2] != skv or k.shape[3] != head:
            raise ShapeError(f"Attention: incompatible Q {q.shape}, K {k.shape}, V {v.shape} (as [B, H, S, D])")
        if hkv == 0 or hq % hkv:
            raise ShapeError(f"Attention: q heads ({hq}) must be a multiple of kv heads ({hkv})")
        precision_code = int(attrs.get("softmax_precision", 0))
        if precision_code and precision_code not in _PRECISIONS:
            raise UnsupportedOpError(
                f"Attention: softmax_precision {precision_code} is not supported (float, float16, double are)"
            )
        dtype = q_in.dtype
        scale = float(attrs["scale"]) if "scale" in attrs else (1.0 / np.sqrt(head) if head else 1.0)
        softcap = float(attrs.get("softcap", 0.0))
        mode = int(attrs.get("qk_matmul_output_mode", 0))
        if mode not in (0, 1, 2, 3):
            raise UnsupportedOpError(f"Attention: qk_matmul_output_mode {mode} is not defined (0..3)")

        # float16 with a float16 softmax computes in float16 stages (each step rounded, products accumulated in
        # float32), as the ONNX definition does; otherwise in float64, rounded once at the end, as the kernels do
        work: Any = np.float16 if dtype == np.float16 and precision_code == 10 else np.float64

        def rounded(x: np.ndarray | float) -> np.ndarray:
            return np.asarray(x).astype(work).astype(np.float64)

        def product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            accumulate = np.float32 if work == np.float16 else np.float64
            return rounded(np.matmul(a.astype(accumulate), b.astype(accumulate)))

        # each query head's key/value head (grouped-query attention)
        group = hq // hkv
        root = rounded(np.sqrt(scale))
        kk = np.repeat(rounded(k.astype(np.float64) * root), group, axis=1)
        vv = np.repeat(v.astype(np.float64), group, axis=1)
        scores = product(rounded(q.astype(np.float64) * root), np.swapaxes(kk, -1, -2))
        raw = scores
        if softcap > 0.0:
            scores = rounded(softcap * np.tanh(rounded(scores / softcap)))
        capped = scores

        bias = self._bias(mask, nonpad, attrs, batch, hq, sq, skv, 0 if past_key is None else past_key.shape[2])
        scores = rounded(scores + bias)
        dead = np.all(np.isneginf(bias), axis=-1, keepdims=True)

        # softmax in the requested precision; rows with no key left give zeros
        soft = _PRECISIONS.get(precision_code, work)
        wide = scores.astype(soft)
        top = np.max(np.where(dead, 0, wide), axis=-1, keepdims=True, initial=-np.inf).astype(soft)
        with np.errstate(invalid="ignore", over="ignore"):
            e = np.where(np.isneginf(wide) | dead, 0, np.exp(wide - top)).astype(soft)
            total = np.sum(e, axis=-1, keepdims=True).astype(soft)
            probs = np.where(dead, 0, e / np.where(total == 0, 1, total).astype(soft))
        probs = rounded(probs.astype(soft))
        y = product(probs, vv)

        if q_in.ndim == 3:
            y = y.transpose(0, 2, 1, 3).reshape(batch, sq, hq * vv.shape[3])
        results: list[np.ndarray] = [y.astype(dtype)]
        if len(outputs) > 1:
            results.append(k.astype(k_in.dtype))
        if len(outputs) > 2:
            results.append(v.astype(v_in.dtype))
        if len(outputs) > 3:
            qk = (raw, capped, scores, probs)[mode]
            results.append(qk.astype(dtype))
        return results

    @staticmethod
    def _bias(
        mask: np.ndarray | None,
        nonpad: np.ndarray | None,
        attrs: Mapping[str, Any],
        batch: int,
        heads: int,
        sq: int,
        skv: int,
        past: int,
    ) -> np.ndarray:
        """The additive bias ``[B, H, Sq, Skv]``: mask, causal frontier, padding and windows (``-inf`` = dropped)."""
        bias = np.zeros((batch, heads, sq, skv))
        if mask is not None:
            if mask.ndim == 0 or mask.ndim > 4:
                raise ShapeError(f"Attention: attn_mask must have rank 1 to 4, got shape {mask.shape}")
            if mask.dtype == np.bool_:
                m = np.where(mask, 0.0, -np.inf)
            else:
                m = mask.astype(np.float64)
            length = m.shape[-1]
            if length > skv:
                raise ShapeError(f"Attention: attn_mask covers {length} keys, there are only {skv}")
            if length < skv:
                # keys past the mask's end are padding
                pad = np.full(m.shape[:-1] + (skv - length,), -np.inf)
                m = np.concatenate([m, pad], axis=-1)
            try:
                bias = bias + np.broadcast_to(m, bias.shape)
            except ValueError:
                raise ShapeError(
                    f"Attention: attn_mask of shape {mask.shape} does not broadcast to {(batch, heads, sq, skv)}"
                ) from None
        rows = np.arange(sq).reshape(sq, 1)
        cols = np.arange(skv).reshape(1, skv)
        if nonpad is not None:
            lengths = nonpad.astype(np.int64).reshape(-1)
            if lengths.shape[0] != batch:
                raise ShapeError(f"Attention: nonpad_kv_seqlen has {lengths.shape[0]} entries for batch {batch}")
            offsets = (lengths - sq).reshape(batch, 1, 1, 1)
            bias = np.where(cols.reshape(1, 1, 1, skv) >= lengths.reshape(batch, 1, 1, 1), -np.inf, bias)
        else:
            offsets = np.full((batch, 1, 1, 1), past, dtype=np.int64)
        position = offsets + rows.reshape(1, 1, sq, 1)
        key = cols.reshape(1, 1, 1, skv)
        allowed = np.ones((batch, 1, sq, skv), dtype=bool)
        if int(attrs.get("is_causal", 0)):
            allowed &= key <= position
        left = int(attrs.get("left_window_size", -1))
        right = int(attrs.get("right_window_size", -1))
        if left >= 0:
            allowed &= key >= position - left
        if right >= 0:
            allowed &= key <= position + right
        return np.where(allowed, bias, -np.inf)

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        return _attention_plan(self, inputs, outputs, attrs, caps)


def _attention_plan(
    operator: Attention,
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
    attrs: Mapping[str, Any],
    caps: DeviceCaps,
) -> OpPlan:
    """Y by one kernel (one invocation per output element, an online softmax over the keys), the present
    key/value by one copy kernel each, qk_matmul_output by one kernel per score (mode 3 walks its row twice); every
    kernel computes in f32, float16 tensors read into it and stored from it."""
    infos = list(inputs) + [None] * (7 - len(inputs))
    q, k, v, mask, past_key, past_value, nonpad = infos[:7]
    assert q is not None and k is not None and v is not None
    floats = [q, k, v, past_key, past_value, *outputs] + ([mask] if mask is not None and mask.dtype != np.bool_ else [])
    for info in floats:
        if info is not None and info.dtype not in (np.float32, np.float16):
            raise NotOnDevice(f"Attention: the WebGPU kernels take float32 or float16 tensors, not {info.dtype}")
    if any(info is not None and info.dtype == np.float16 for info in floats) and not caps.has_f16:
        raise NotOnDevice("Attention: float16 on the device needs the adapter's shader-f16 feature")
    el = [float_element(info) if info is not None and info.dtype != np.bool_ else "" for info in infos]
    if int(attrs.get("softmax_precision", 1)) != 1:
        raise NotOnDevice("Attention: softmax_precision other than float runs on the CPU")
    if (past_key is None) != (past_value is None) or (nonpad is not None and past_key is not None):
        raise NotOnDevice("Attention: past_key/past_value/nonpad_kv_seqlen combination runs on the CPU (it checks)")
    if len(q.shape) not in (3, 4):
        raise NotOnDevice("Attention: Q must be 3-D or 4-D; the CPU reference reports it")
    three_d = len(q.shape) == 3
    if three_d:
        hq, hkv = int(attrs.get("q_num_heads", 0)), int(attrs.get("kv_num_heads", 0))
        if hq <= 0 or hkv <= 0 or q.shape[2] % hq or k.shape[2] % hkv or v.shape[2] % hkv:
            raise ShapeError("Attention: 3-D inputs need q_num_heads/kv_num_heads dividing their hidden sizes")
        batch, sq, head = q.shape[0], q.shape[1], q.shape[2] // hq
        sk, dv = k.shape[1], v.shape[2] // hkv
    else:
        batch, hq, sq, head = q.shape
        hkv, sk, dv = k.shape[1], k.shape[2], v.shape[3]
    consistent = (
        len(k.shape) == len(v.shape) == len(q.shape)
        and (three_d or (k.shape[0] == v.shape[0] == batch and k.shape[3] == head and v.shape[:3] == k.shape[:3]))
        and (not three_d or (k.shape[0] == v.shape[0] == batch and k.shape[1] == v.shape[1]))
        and (
            past_key is None
            or past_value is None
            or (
                len(past_key.shape) == len(past_value.shape) == 4
                and past_key.shape[:2] == (batch, hkv) == past_value.shape[:2]
                and past_key.shape[3] == head
                and past_value.shape[3] == dv
                and past_key.shape[2] == past_value.shape[2]
            )
        )
        and (not three_d or k.shape[2] // hkv == head)
    )
    if not consistent:
        raise NotOnDevice("Attention: inconsistent Q/K/V/past shapes; the CPU reference reports them")
    past = 0 if past_key is None else int(past_key.shape[2])
    total = past + sk
    if hkv <= 0 or hq % hkv:
        raise ShapeError(f"Attention: q heads ({hq}) must be a multiple of kv heads ({hkv})")
    # Y walks the keys once (a head-long dot product each); mode-3 scores walk them twice
    walks = 2 if len(outputs) > 3 and int(attrs.get("qk_matmul_output_mode", 0)) == 3 else 1
    check_loop_budget("Attention", walks * total * (head + 1) + head + 1, caps)
    scale = float(attrs["scale"]) if "scale" in attrs else (1.0 / float(np.sqrt(head)) if head else 1.0)
    softcap = float(attrs.get("softcap", 0.0))

    # the structural limits on the keys (nonpad_kv_seqlen, causal frontier, windows)
    if nonpad is not None:
        # LENGTHS: the binding of nonpad_kv_seqlen (int64: its low words)
        offset = f"i32(LENGTHS[b * 2u]) - {sq}"
        valid = "i32(LENGTHS[b * 2u])"
    else:
        offset, valid = str(past), str(total)
    dropped = [f"ji >= {valid}"]
    if int(attrs.get("is_causal", 0)):
        dropped.append("ji > position")
    left, right = int(attrs.get("left_window_size", -1)), int(attrs.get("right_window_size", -1))
    if left >= 0:
        dropped.append(f"ji < position - {left}")
    if right >= 0:
        dropped.append(f"ji > position + {right}")
    mask_index, mask_length = "", total
    if mask is not None:
        if not 1 <= len(mask.shape) <= 4:
            raise ShapeError(f"Attention: attn_mask must have rank 1 to 4, got shape {mask.shape}")
        full = (1,) * (4 - len(mask.shape)) + tuple(int(d) for d in mask.shape)
        mask_length = full[3]
        for got, want in zip(full[:3], (batch, hq, sq)):
            if got not in (1, want):
                raise ShapeError(f"Attention: attn_mask of shape {mask.shape} does not broadcast")
        if mask_length > total:
            raise ShapeError(f"Attention: attn_mask covers {mask_length} keys, there are only {total}")
        strides = [full[1] * full[2] * mask_length, full[2] * mask_length, mask_length]
        mask_index = " + ".join(
            f"{name} * {stride if size > 1 else 0}u" for name, stride, size in zip(("b", "h", "i"), strides, full[:3])
        )
        # keys past a short mask's end are padding
        dropped.append(f"j >= {mask_length}u")

    def functions(table: BindingTable) -> str:
        """WGSL ``logit(b, h, i, j) -> vec2<f32>`` (scaled Q.K, soft-capped) and ``bias(b, h, i, j) -> f32`` (the
        mask's value, -inf where the key is dropped), reading the inputs bound in ``table``."""
        q_name, k_name = table.add(Binding("input", 0), el[0]), table.add(Binding("input", 1), el[1])
        if three_d:
            q_at = f"(b * {sq}u + i) * {hq * head}u + h * {head}u + d"
            k_at = f"(b * {sk}u + jn) * {hkv * head}u + hk * {head}u + d"
        else:
            q_at = f"((b * {hq}u + h) * {sq}u + i) * {head}u + d"
            k_at = f"((b * {hkv}u + hk) * {sk}u + jn) * {head}u + d"
        key = read_f32(k_name, k_at, el[1])
        if past_key is not None:
            pk = table.add(Binding("input", 4), el[4])
            cached_key = read_f32(pk, f"((b * {hkv}u + hk) * {past}u + j) * {head}u + d", el[4])
            key = f"select({key}, {cached_key}, j < {past}u)"
        lengths = table.add(Binding("input", 6), "u32") if nonpad is not None else "LENGTHS"
        mask_value = "0.0"
        if mask is not None and mask.dtype == np.bool_:
            bits = table.add(Binding("input", 3), "u32")
            mask_value = f"select(neg_inf(), 0.0, (({bits}[mi / 4u] >> (8u * (mi % 4u))) & 0xffu) != 0u)"
        elif mask is not None:
            mask_value = read_f32(table.add(Binding("input", 3), el[3]), "mi", el[3])
        capped = f"{wgsl_f32(softcap)} * tanh(x / {wgsl_f32(softcap)})" if softcap > 0 else "x"
        return f"""// -inf, made at run time (WGSL makes an infinite constant expression an error)
fn neg_inf() -> f32 {{
    var bits = 0xff800000u;
    return bitcast<f32>(bits);
}}
fn logit(b: u32, h: u32, i: u32, j: u32) -> vec2<f32> {{
    let hk = h / {hq // hkv}u;
    let jn = j - min(j, {past}u);
    var x = 0.0;
    for (var d = 0u; d < {head}u; d = d + 1u) {{ x = fma({read_f32(q_name, q_at, el[0])}, {key}, x); }}
    x = x * {wgsl_f32(scale)};
    return vec2<f32>(x, {capped});
}}
fn bias(b: u32, h: u32, i: u32, j: u32) -> f32 {{
    let ji = i32(j);
    let position = {offset.replace("LENGTHS", lengths)} + i32(i);
    if ({" || ".join(dropped).replace("LENGTHS", lengths)}) {{ return neg_inf(); }}
    let mi = {mask_index or "0u"} + j;
    return {mask_value};
}}
"""

    kernels = []
    count = outputs[0].size
    out_el = float_element(outputs[0])
    with_cache = past_key is not None or nonpad is not None
    flash = _flash_problem(q, k, v, mask, attrs, batch, hq, hkv, sq, sk, head, dv, scale, with_cache, el[:4] + [out_el])
    if count and flash is not None:
        wgsl, grid, table = attention_kernel(flash, caps)
        compute = lambda full: operator.reference(full, attrs, outputs[:1])  # noqa: E731
        kernels += list(single_kernel_plan("Attention", wgsl, grid, table, compute, inputs, outputs[:1], caps).kernels)
    elif count:
        table = BindingTable()
        helpers = functions(table)
        v_name = table.add(Binding("input", 2), el[2])
        y_name = table.add(Binding("output", 0), out_el, writable=True)
        if three_d:
            v_at = f"(b * {sk}u + jn) * {hkv * dv}u + hk * {dv}u + e"
            decode = f"let e = n % {dv}u; let h = (n / {dv}u) % {hq}u; let i = (n / {dv * hq}u) % {sq}u; "
            decode += f"let b = n / {dv * hq * sq}u;"
        else:
            v_at = f"((b * {hkv}u + hk) * {sk}u + jn) * {dv}u + e"
            decode = f"let e = n % {dv}u; let i = (n / {dv}u) % {sq}u; let h = (n / {dv * sq}u) % {hq}u; "
            decode += f"let b = n / {dv * sq * hq}u;"
        value = read_f32(v_name, v_at, el[2])
        if past_value is not None:
            pv = table.add(Binding("input", 5), el[5])
            cached_value = read_f32(pv, f"((b * {hkv}u + hk) * {past}u + j) * {dv}u + e", el[5])
            value = f"select({value}, {cached_value}, j < {past}u)"
        grid = grid_for_groups(-(-count // THREADS), caps)
        wgsl = f"""{table.enables()}{table.declarations()}
{helpers}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let n = {workgroup_index(grid)} * {THREADS}u + li;
    if (n >= {count}u) {{ return; }}
    {decode}
    let hk = h / {hq // hkv}u;
    var m = 0.0;
    var l = 0.0;
    var acc = 0.0;
    var seen = false;
    for (var j = 0u; j < {total}u; j = j + 1u) {{
        let bz = bias(b, h, i, j);
        if (bitcast<u32>(bz) == 0xff800000u) {{ continue; }}
        let x = logit(b, h, i, j).y + bz;
        let jn = j - min(j, {past}u);
        let vj = {value};
        if (!seen) {{ m = x; l = 1.0; acc = vj; seen = true; continue; }}
        let top = max(m, x);
        let a = exp(m - top);
        let w = exp(x - top);
        l = l * a + w;
        acc = acc * a + w * vj;
        m = top;
    }}
    {y_name}[n] = {stored("select(0.0, acc / l, seen)", out_el)};
}}
"""
        compute = lambda full: operator.reference(full, attrs, outputs[:1])  # noqa: E731
        kernels += list(single_kernel_plan("Attention", wgsl, grid, table, compute, inputs, outputs[:1], caps).kernels)
    for slot, source, cached, width in ((1, 1, 4, head), (2, 2, 5, dv)):
        if len(outputs) > slot and outputs[slot].size:
            kernels.append(_present_kernel(inputs, outputs, slot, source, cached, width, hkv, sk, past, caps))
    if len(outputs) > 3 and outputs[3].size:
        mode = int(attrs.get("qk_matmul_output_mode", 0))
        table = BindingTable()
        helpers = functions(table)
        qk_el = float_element(outputs[3])
        qk_name = table.add(Binding("output", 3), qk_el, writable=True)
        qk_count = outputs[3].size
        grid = grid_for_groups(-(-qk_count // THREADS), caps)
        if mode == 3:
            body = f"""    var m = 0.0;
    var seen = false;
    for (var k = 0u; k < {total}u; k = k + 1u) {{
        let bz = bias(b, h, i, k);
        if (bitcast<u32>(bz) == 0xff800000u) {{ continue; }}
        let x = logit(b, h, i, k).y + bz;
        m = select(x, max(m, x), seen);
        seen = true;
    }}
    var l = 0.0;
    for (var k = 0u; k < {total}u; k = k + 1u) {{
        let bz = bias(b, h, i, k);
        if (bitcast<u32>(bz) == 0xff800000u) {{ continue; }}
        l = l + exp(logit(b, h, i, k).y + bz - m);
    }}
    let own = bias(b, h, i, j);
    let dropped = bitcast<u32>(own) == 0xff800000u;
    {qk_name}[n] = {stored("select(exp(logit(b, h, i, j).y + own - m) / l, 0.0, dropped || !seen)", qk_el)};"""
        else:
            value = ("logit(b, h, i, j).x", "logit(b, h, i, j).y", "logit(b, h, i, j).y + bias(b, h, i, j)")[mode]
            # the phony call keeps every bound input statically used (unused bindings leave the pipeline layout)
            body = f"    _ = bias(b, h, i, j);\n    {qk_name}[n] = {stored(value, qk_el)};"
        wgsl = f"""{table.enables()}{table.declarations()}
{helpers}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let n = {workgroup_index(grid)} * {THREADS}u + li;
    if (n >= {qk_count}u) {{ return; }}
    let j = n % {total}u;
    let i = (n / {total}u) % {sq}u;
    let h = (n / {total * sq}u) % {hq}u;
    let b = n / {total * sq * hq}u;
{body}
}}
"""

        def qk_only(full: list[np.ndarray | None]) -> list[np.ndarray]:
            # the scores do not read the values, which this kernel does not bind
            for position in (2, 5):
                info = inputs[position] if position < len(inputs) else None
                if info is not None and full[position] is None:
                    full[position] = np.zeros(info.shape, info.dtype)
            results = operator.reference(full, attrs, outputs)
            return [np.zeros(o.shape, o.dtype) for o in outputs[:3]] + [results[3]]

        kernels += list(single_kernel_plan("Attention", wgsl, grid, table, qk_only, inputs, outputs, caps).kernels)
    return OpPlan(kernels=tuple(kernels))


def _flash_problem(
    q: TensorInfo,
    k: TensorInfo,
    v: TensorInfo,
    mask: TensorInfo | None,
    attrs: Mapping[str, Any],
    batch: int,
    hq: int,
    hkv: int,
    sq: int,
    sk: int,
    head: int,
    dv: int,
    scale: float,
    cached: bool,
    elements: Sequence[str],
) -> FlashProblem | None:
    """Y as the flash kernel's problem, where it computes it: no key/value cache or sequence lengths, no windows or
    soft cap, a float mask covering every key (or none).  The batch is ``[B, Hkv, group]``: a query head ``h`` is
    ``(h // group, h % group)``, and K/V broadcast along the group axis.  ``elements``: the storage of Q, K, V, the
    mask and Y."""
    windows = int(attrs.get("left_window_size", -1)) >= 0 or int(attrs.get("right_window_size", -1)) >= 0
    if cached or windows or float(attrs.get("softcap", 0.0)) > 0 or min(sq, sk, head, dv) <= 0:
        return None
    if mask is not None and (mask.dtype not in (np.float32, np.float16) or int(mask.shape[-1]) != sk):
        return None
    group = hq // hkv

    def view(index: int, heads: int, rows: int, width: int, three_d: bool, output: bool = False) -> OperandView:
        if three_d:  # [B, S, H * W]
            b_stride, h_stride, row = rows * heads * width, width, heads * width
        else:  # [B, H, S, W]
            b_stride, h_stride, row = heads * rows * width, rows * width, width
        per_group = h_stride if heads == hq else 0
        strides = (b_stride, h_stride * (group if heads == hq else 1), per_group)
        return OperandView(index, strides, row, 1, elements[4 if output else index])

    three_d = len(q.shape) == 3
    mask_view = None
    if mask is not None:
        full = (1,) * (4 - len(mask.shape)) + tuple(int(d) for d in mask.shape)
        strides = broadcast_strides(full, (batch, hq, sq, sk))
        mask_view = OperandView(3, (strides[0], strides[1] * group, strides[1]), strides[2], strides[3], elements[3])
    return FlashProblem(
        batch=(batch, hkv, group),
        sq=sq,
        sk=sk,
        head=head,
        value_head=dv,
        q=view(0, hq, sq, head, three_d),
        k=view(1, hkv, sk, head, three_d),
        v=view(2, hkv, sk, dv, three_d),
        mask=mask_view,
        logit_scale=scale,
        bias_scale=1.0,
        out=view(0, hq, sq, dv, three_d, output=True),
        causal_offset=0 if int(attrs.get("is_causal", 0)) else None,
        empty_rows_zero=True,
    )


def _present_kernel(
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo],
    slot: int,
    source: int,
    cached: int,
    width: int,
    heads: int,
    steps: int,
    past: int,
    caps: DeviceCaps,
) -> KernelSpec:
    """present = concat(past, new) along the sequence (the new keys/values alone without a past), the new ones
    ``[B, S, H * W]`` or ``[B, H, S, W]``; a copy, converted only where the types differ."""
    new, out = inputs[source], outputs[slot]
    old = inputs[cached] if cached < len(inputs) else None
    assert new is not None
    table = BindingTable()
    out_el = float_element(out)

    def moved(index: int, info: TensorInfo, at: str) -> str:
        name = table.add(Binding("input", index), float_element(info))
        same = float_element(info) == out_el
        return f"{name}[{at}]" if same else stored(read_f32(name, at, float_element(info)), out_el)

    if len(new.shape) == 3:
        new_at = f"(b * {steps}u + (j - {past}u)) * {heads * width}u + hk * {width}u + d"
    else:
        new_at = f"((b * {heads}u + hk) * {steps}u + (j - {past}u)) * {width}u + d"
    value = moved(source, new, new_at)  # bound before the output: the slots stay as they were
    out_name = table.add(Binding("output", slot), out_el, writable=True)
    count = out.size
    total = past + steps
    copy = f"{out_name}[n] = {value};"
    if old is not None:
        copy = f"""if (j < {past}u) {{
        {out_name}[n] = {moved(cached, old, f"((b * {heads}u + hk) * {past}u + j) * {width}u + d")};
    }} else {{
        {copy}
    }}"""
    grid = grid_for_groups(-(-count // THREADS), caps)
    wgsl = f"""{table.enables()}{table.declarations()}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let n = {workgroup_index(grid)} * {THREADS}u + li;
    if (n >= {count}u) {{ return; }}
    let d = n % {width}u;
    let j = (n / {width}u) % {total}u;
    let hk = (n / {width * total}u) % {heads}u;
    let b = n / {width * total * heads}u;
    {copy}
}}
"""

    def concatenate(fresh: np.ndarray, *cache: np.ndarray) -> np.ndarray:
        if fresh.ndim == 3:
            fresh = fresh.reshape(fresh.shape[0], fresh.shape[1], heads, width).transpose(0, 2, 1, 3)
        return np.concatenate([*cache, fresh], axis=2)

    # the twin's bindings (same slots) name output 0: it sees the one output this kernel writes
    twin_bindings = [Binding("output", 0) if b.kind == "output" else b for b in table.bindings]
    twin = reference_twin(concatenate, twin_bindings, inputs, [out])
    check_device_fits("Attention", [new, old, out], len(table.bindings), caps)
    return KernelSpec("Attention", wgsl, grid, tuple(table.bindings), twin)
