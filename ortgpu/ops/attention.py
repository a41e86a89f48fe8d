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

It runs on the CPU (this reference): no WebGPU kernel yet.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from ._registry import register

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

        # float16 computes in float16 stages (each step rounded, products accumulated in float32), as the ONNX
        # definition does in the input's precision; wider types compute in float64
        work: Any = np.float16 if dtype == np.float16 else np.float64

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
        raise NotOnDevice("Attention: no WebGPU kernel yet; it runs on the CPU")
