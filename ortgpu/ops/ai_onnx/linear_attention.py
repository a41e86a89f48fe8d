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

The reference runs token by token in float64 (rounded once to the tensors' type).  On the device (float32, or
float16 with ``shader-f16``: read into f32, stored from it) one invocation per (batch, kv head, value feature) keeps
its column of the state in private memory, in f32, and walks the tokens, writing the outputs of the query heads
that share it and, at the end, its column of ``present_state``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import Binding, DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo, check_loop_budget
from .._registry import register
from .._tiling import (
    THREADS,
    BindingTable,
    grid_for_groups,
    require_float,
    single_kernel_plan,
    wgsl_f32,
    workgroup_index,
)

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
    """LinearAttention-27."""

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

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        infos = list(inputs) + [None] * (6 - len(inputs))
        query, key, value, past, decay, beta = infos[:6]
        assert query is not None and key is not None and value is not None
        element = require_float("LinearAttention", list(inputs) + list(outputs), caps)
        rule = attrs.get("update_rule", "gated_delta")
        rule = rule.decode() if isinstance(rule, bytes) else str(rule)
        if rule not in _RULES or "q_num_heads" not in attrs or "kv_num_heads" not in attrs:
            raise NotOnDevice("LinearAttention: invalid attributes; the CPU reference reports them")
        hq, hkv = int(attrs["q_num_heads"]), int(attrs["kv_num_heads"])
        shapes_ok = (
            hkv > 0
            and hq % hkv == 0
            and len(query.shape) == len(key.shape) == len(value.shape) == 3
            and query.shape[2] % hq == 0
            and key.shape[2] % hkv == 0
            and value.shape[2] % hkv == 0
        )
        if not shapes_ok:
            raise ShapeError(f"LinearAttention: query {query.shape}, key {key.shape}, value {value.shape} disagree")
        batch, steps = int(query.shape[0]), int(query.shape[1])
        dk, dv = int(query.shape[2]) // hq, int(value.shape[2]) // hkv
        if tuple(key.shape) != (batch, steps, hkv * dk) or tuple(value.shape[:2]) != (batch, steps):
            raise ShapeError(f"LinearAttention: query {query.shape}, key {key.shape}, value {value.shape} disagree")
        if past is not None and tuple(past.shape) != (batch, hkv, dk, dv):
            raise ShapeError(f"LinearAttention: past_state must be {(batch, hkv, dk, dv)}, got {past.shape}")
        gated = rule in ("gated", "gated_delta")
        delta = rule in ("delta", "gated_delta")
        if (gated and decay is None) or (delta and beta is None):
            raise UnsupportedOpError(f"LinearAttention: update_rule {rule!r} needs its decay/beta inputs")
        group = hq // hkv
        check_loop_budget("LinearAttention", steps * (dk * (3 + group) + group) + 2 * dk, caps)
        count = batch * hkv * dv
        if count == 0:
            return OpPlan()
        scale = float(attrs.get("scale", 0.0)) or 1.0 / float(np.sqrt(dk))

        def per_head(info: TensorInfo, width: int, name: str) -> str:
            """WGSL index of a decay/beta element for token (b, t), kv head hk, key feature kk."""
            last = int(info.shape[2]) if len(info.shape) == 3 else -1
            if len(info.shape) != 3 or tuple(info.shape[:2]) != (batch, steps):
                raise ShapeError(f"LinearAttention: {name} of shape {info.shape} does not match [B, T, ...]")
            if last == hkv * width:
                return f"(b * {steps}u + t) * {hkv * width}u + hk * {width}u + kk"
            if last == hkv:
                return f"(b * {steps}u + t) * {hkv}u + hk"
            if last == 1:
                return f"b * {steps}u + t"
            raise ShapeError(f"LinearAttention: {name} of shape {info.shape} is neither per head nor per key feature")

        table = BindingTable()

        def read(index: int, at: str) -> str:  # f16 storage is widened: the state and the sums stay f32
            name = table.add(Binding("input", index), element)
            return f"{name}[{at}]" if element == "f32" else f"f32({name}[{at}])"

        def store(value: str) -> str:
            return value if element == "f32" else f"{element}({value})"

        for index in range(3):  # Q, K, V take the first slots
            table.add(Binding("input", index), element)
        out_name = table.add(Binding("output", 0), element, writable=True)
        start = "0.0"
        if past is not None:
            start = read(3, f"((b * {hkv}u + hk) * {dk}u + kk) * {dv}u + e")
        k_at = read(1, f"(b * {steps}u + t) * {hkv * dk}u + hk * {dk}u + kk")
        step = ""
        if gated and decay is not None:
            g_at = read(4, per_head(decay, dk, "decay"))
            step += f"""        for (var kk = 0u; kk < {dk}u; kk = kk + 1u) {{
            s[kk] = s[kk] * exp({g_at});
        }}
"""
        update = read(2, f"(b * {steps}u + t) * {hkv * dv}u + hk * {dv}u + e")
        if delta and beta is not None:
            beta_at = read(5, per_head(beta, 1, "beta"))
            step += f"""        var predicted = 0.0;
        for (var kk = 0u; kk < {dk}u; kk = kk + 1u) {{ predicted = fma(s[kk], {k_at}, predicted); }}
        let kk = 0u;
"""
            update = f"{beta_at} * ({update} - predicted)"
        state = ""
        if len(outputs) > 1 and outputs[1].size:
            state_name = table.add(Binding("output", 1), element, writable=True)
            state = f"""    for (var kk = 0u; kk < {dk}u; kk = kk + 1u) {{
        {state_name}[((b * {hkv}u + hk) * {dk}u + kk) * {dv}u + e] = {store("s[kk]")};
    }}
"""
        grid = grid_for_groups(-(-count // THREADS), caps)
        wgsl = f"""{table.enables()}{table.declarations()}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let n = {workgroup_index(grid)} * {THREADS}u + li;
    if (n >= {count}u) {{ return; }}
    let e = n % {dv}u;
    let hk = (n / {dv}u) % {hkv}u;
    let b = n / {dv * hkv}u;
    var s: array<f32, {max(dk, 1)}>;
    for (var kk = 0u; kk < {dk}u; kk = kk + 1u) {{ s[kk] = {start}; }}
    for (var t = 0u; t < {steps}u; t = t + 1u) {{
{step}        let u = {update};
        for (var kk = 0u; kk < {dk}u; kk = kk + 1u) {{ s[kk] = fma({k_at}, u, s[kk]); }}
        for (var g = 0u; g < {group}u; g = g + 1u) {{
            let h = hk * {group}u + g;
            var o = 0.0;
            for (var kk = 0u; kk < {dk}u; kk = kk + 1u) {{
                o = fma(s[kk], {read(0, f"(b * {steps}u + t) * {hq * dk}u + h * {dk}u + kk")}, o);
            }}
            {out_name}[(b * {steps}u + t) * {hq * dv}u + h * {dv}u + e] = {store(f"o * {wgsl_f32(scale)}")};
        }}
    }}
{state}}}
"""
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        return single_kernel_plan("LinearAttention", wgsl, grid, table, compute, inputs, outputs, caps)
