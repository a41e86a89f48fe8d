"""LinearAttention-27: recurrent (linear) attention with a ``[d_k, d_v]`` state per key/value head.

Inputs are packed 3-D ``[B, T, H * D]`` (``q_num_heads``, ``kv_num_heads`` required; query head ``h`` shares the
state of kv head ``h // (Hq / Hkv)``).  Per token, with ``g`` the log-space ``decay`` (per key feature
``[B, T, Hkv * d_k]`` or per head ``[B, T, Hkv]``) and ``beta`` the update rate (``[B, T, Hkv]`` or ``[B, T, 1]``):

* ``linear``: ``S = S + k v^T``
* ``gated``: ``S = exp(g) S + k v^T``
* ``delta``: ``S = S + beta k (v - S^T k)^T``
* ``gated_delta`` (default): ``S' = exp(g) S``, ``S = S' + beta k (v - S'^T k)^T``

and ``o = scale * S^T q`` (default scale ``1 / sqrt(d_k)``).  ``past_state [B, Hkv, d_k, d_v]`` starts the
recurrence (zeros when absent); ``present_state`` is the final state.  ``chunk_size`` is a tuning hint only.

It runs on the CPU (this reference), token by token in float64.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ._kernel import Operator, TensorInfo
from ._registry import register

__all__ = ["LinearAttention"]

_RULES = ("linear", "gated", "delta", "gated_delta")


def _heads(x: np.ndarray, heads: int, name: str) -> np.ndarray:
    """``[B, T, H * D]`` as float64 ``[B, T, H, D]``."""
    if x.ndim != 3 or heads <= 0 or x.shape[2] % heads:
        raise ShapeError(f"LinearAttention: {name} must be [B, T, {heads} * D], got shape {x.shape}")
    return x.astype(np.float64).reshape(x.shape[0], x.shape[1], heads, x.shape[2] // heads)


def _per_head(x: np.ndarray, heads: int, width: int, name: str) -> np.ndarray:
    """A decay/beta input as ``[B, T, Hkv, width or 1]`` (per feature, per head or one for all heads)."""
    batch, steps = x.shape[0], x.shape[1]
    last = x.shape[2] if x.ndim == 3 else -1
    if last == heads * width:
        return x.astype(np.float64).reshape(batch, steps, heads, width)
    if last == heads:
        return x.astype(np.float64).reshape(batch, steps, heads, 1)
    if last == 1:
        return np.broadcast_to(x.astype(np.float64).reshape(batch, steps, 1, 1), (batch, steps, heads, 1))
    raise ShapeError(f"LinearAttention: {name} of shape {x.shape} is neither per head nor per key feature")


@register
class LinearAttention(Operator):
    """LinearAttention-27 (CPU)."""

    op_type = "LinearAttention"
    since_version = 27

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        query, key, value = inputs[0], inputs[1], inputs[2]
        assert query is not None and key is not None and value is not None
        optional = list(inputs[3:]) + [None] * (6 - len(inputs))
        past, decay, beta = optional[0], optional[1], optional[2]
        rule = attrs.get("update_rule", "gated_delta")
        rule = rule.decode() if isinstance(rule, bytes) else str(rule)
        if rule not in _RULES:
            raise UnsupportedOpError(f"LinearAttention: update_rule {rule!r} is not defined ({', '.join(_RULES)})")
        if "q_num_heads" not in attrs or "kv_num_heads" not in attrs:
            raise UnsupportedOpError("LinearAttention: q_num_heads and kv_num_heads are required")
        hq, hkv = int(attrs["q_num_heads"]), int(attrs["kv_num_heads"])
        if hkv <= 0 or hq % hkv:
            raise ShapeError(f"LinearAttention: q_num_heads {hq} must be a positive multiple of kv_num_heads {hkv}")
        q = _heads(query, hq, "query")
        k = _heads(key, hkv, "key")
        v = _heads(value, hkv, "value")
        batch, steps, _, dk = q.shape
        dv = v.shape[3]
        if k.shape[:2] != (batch, steps) or v.shape[:2] != (batch, steps) or k.shape[3] != dk:
            raise ShapeError(f"LinearAttention: query {query.shape}, key {key.shape}, value {value.shape} disagree")
        gated = rule in ("gated", "gated_delta")
        delta = rule in ("delta", "gated_delta")
        if gated and decay is None:
            raise UnsupportedOpError(f"LinearAttention: update_rule {rule!r} needs the decay input")
        if delta and beta is None:
            raise UnsupportedOpError(f"LinearAttention: update_rule {rule!r} needs the beta input")
        g = _per_head(decay, hkv, dk, "decay") if gated and decay is not None else None
        rate = _per_head(beta, hkv, 1, "beta") if delta and beta is not None else None
        scale = float(attrs.get("scale", 0.0)) or 1.0 / np.sqrt(dk)
        if past is None:
            state = np.zeros((batch, hkv, dk, dv))
        elif past.shape != (batch, hkv, dk, dv):
            raise ShapeError(f"LinearAttention: past_state must be {(batch, hkv, dk, dv)}, got {past.shape}")
        else:
            state = past.astype(np.float64).copy()
        group = hq // hkv
        out = np.zeros((batch, steps, hq, dv))
        for t in range(steps):
            kt, vt = k[:, t], v[:, t]  # [B, Hkv, dk], [B, Hkv, dv]
            if g is not None:
                state = np.exp(g[:, t])[..., None] * state
            if rate is not None:
                predicted = np.einsum("bhkv,bhk->bhv", state, kt)
                update = rate[:, t] * (vt - predicted)
            else:
                update = vt
            state = state + kt[..., :, None] * update[..., None, :]
            shared = np.repeat(state, group, axis=1)  # [B, Hq, dk, dv]
            out[:, t] = scale * np.einsum("bhkv,bhk->bhv", shared, q[:, t])
        present_dtype = past.dtype if past is not None else query.dtype
        results = [out.reshape(batch, steps, hq * dv).astype(query.dtype), state.astype(present_dtype)]
        return results[: max(1, len(outputs))]
