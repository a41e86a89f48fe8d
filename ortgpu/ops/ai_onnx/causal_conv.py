"""CausalConvWithState-27: a causal depthwise 1-D convolution that carries its state.

``input [B, C, L]``, ``weight [C, 1, K]``, optional ``bias [C]`` and ``past_state [B, C, K - 1]`` (zeros when
absent).  Over ``padded = concat(past_state, input)`` along the length,
``output[b, c, t] = bias[c] + sum_k weight[c, 0, k] * padded[b, c, t + k]``, optionally followed by SiLU
(``activation`` ``"silu"`` or its alias ``"swish"``); ``present_state`` is the last ``K - 1`` positions of
``padded``.

On the device (float32, or float16 loaded into f32 and rounded once at the store) one kernel computes both
outputs, one invocation per output element (a loop of K taps) and per present-state element.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import Binding, DeviceCaps, Operator, OpPlan, TensorInfo, check_loop_budget
from .._registry import register
from .._tiling import (
    THREADS,
    BindingTable,
    grid_for_groups,
    require_float,
    single_kernel_plan,
    workgroup_index,
)
from .conv import load_f32

__all__ = ["CausalConvWithState"]


@register
class CausalConvWithState(Operator):
    """CausalConvWithState-27."""

    op_type = "CausalConvWithState"
    since_version = 27

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, weight = inputs[0], inputs[1]
        assert x is not None and weight is not None
        bias = inputs[2] if len(inputs) > 2 else None
        past = inputs[3] if len(inputs) > 3 else None
        activation = attrs.get("activation", "none")
        activation = activation.decode() if isinstance(activation, bytes) else str(activation)
        if activation not in ("none", "silu", "swish"):
            raise UnsupportedOpError(
                f"CausalConvWithState: activation {activation!r} is not defined (silu, swish, none)"
            )
        if x.ndim != 3 or weight.ndim != 3 or weight.shape[:2] != (x.shape[1], 1) or weight.shape[2] < 1:
            raise ShapeError(f"CausalConvWithState: input {x.shape} needs weight [C, 1, K], got {weight.shape}")
        batch, channels, length = x.shape
        kernel = weight.shape[2]
        if bias is not None and bias.shape != (channels,):
            raise ShapeError(f"CausalConvWithState: bias must be [{channels}], got {bias.shape}")
        if past is None:
            past = np.zeros((batch, channels, kernel - 1), x.dtype)
        elif past.shape != (batch, channels, kernel - 1):
            raise ShapeError(
                f"CausalConvWithState: past_state must be {(batch, channels, kernel - 1)}, got {past.shape}"
            )
        padded = np.concatenate([past.astype(np.float64), x.astype(np.float64)], axis=2)
        w = weight.astype(np.float64)[:, 0, :]
        y = np.zeros((batch, channels, length))
        for k in range(kernel):
            y += w[None, :, k, None] * padded[:, :, k : k + length]
        if bias is not None:
            y += bias.astype(np.float64)[None, :, None]
        if activation != "none":
            e = np.exp(-np.abs(y))
            y = y * np.where(y >= 0, 1 / (1 + e), e / (1 + e))
        present = padded[:, :, padded.shape[2] - (kernel - 1) :]
        return [y.astype(x.dtype), present.astype(x.dtype)][: max(1, len(outputs))]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x, weight = inputs[0], inputs[1]
        assert x is not None and weight is not None
        bias = inputs[2] if len(inputs) > 2 else None
        past = inputs[3] if len(inputs) > 3 else None
        element = require_float("CausalConvWithState", list(inputs) + list(outputs), caps)
        activation = attrs.get("activation", "none")
        activation = activation.decode() if isinstance(activation, bytes) else str(activation)
        if activation not in ("none", "silu", "swish"):
            raise UnsupportedOpError(
                f"CausalConvWithState: activation {activation!r} is not defined (silu, swish, none)"
            )
        if len(x.shape) != 3 or len(weight.shape) != 3 or tuple(weight.shape[:2]) != (x.shape[1], 1):
            raise ShapeError(f"CausalConvWithState: input {x.shape} needs weight [C, 1, K], got {weight.shape}")
        batch, channels, length = (int(d) for d in x.shape)
        kernel = int(weight.shape[2])
        if kernel < 1 or (past is not None and tuple(past.shape) != (batch, channels, kernel - 1)):
            raise ShapeError(f"CausalConvWithState: past_state must be {(batch, channels, kernel - 1)}")
        if bias is not None and tuple(bias.shape) != (channels,):
            raise ShapeError(f"CausalConvWithState: bias must be [{channels}], got {bias.shape}")
        check_loop_budget("CausalConvWithState", kernel, caps)
        carry = kernel - 1
        count = batch * channels * length
        state_count = batch * channels * carry if len(outputs) > 1 else 0
        if count + state_count == 0:
            return OpPlan()
        table = BindingTable()
        x_name = table.add(Binding("input", 0), element)
        w_name = table.add(Binding("input", 1), element)
        # padded[b, c, p]: the past state for p < K - 1, else the input (as f32)
        past_read = (
            load_f32(table.add(Binding("input", 3), element), element, f"row * {carry}u + p")
            if past is not None
            else "0.0"
        )
        input_read = load_f32(x_name, element, f"row * {length}u + p - {carry}u")
        padded = f"""fn padded(row: u32, p: u32) -> f32 {{
    if (p < {carry}u) {{ return {past_read}; }}
    return {input_read};
}}
"""
        start = load_f32(table.add(Binding("input", 2), element), element, "c") if bias is not None else "0.0"
        finish = "y = y / (1.0 + exp(-y));" if activation != "none" else ""
        y_name = table.add(Binding("output", 0), element, writable=True)
        # f16 outputs round once at the store (the state's values are float16 already: its round trip is exact)
        store = "{}" if element == "f32" else element + "({})"
        state = ""
        if state_count:
            state_name = table.add(Binding("output", 1), element, writable=True)
            carried = store.format(f"padded(row, {length}u + n % {carry}u)")
            state = f"""    if (n < {state_count}u) {{
        let row = n / {carry}u;
        {state_name}[n] = {carried};
    }}
"""
        grid = grid_for_groups(-(-max(count, state_count) // THREADS), caps)
        weight_read = load_f32(w_name, element, f"c * {kernel}u + k")
        stored = store.format("y")
        wgsl = f"""{table.enables()}{table.declarations()}
{padded}
@compute @workgroup_size({THREADS})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let n = {workgroup_index(grid)} * {THREADS}u + li;
{state}    if (n >= {count}u) {{ return; }}
    let t = n % {length}u;
    let row = n / {length}u;
    let c = row % {channels}u;
    var y = {start};
    for (var k = 0u; k < {kernel}u; k = k + 1u) {{
        y = fma({weight_read}, padded(row, t + k), y);
    }}
    {finish}
    {y_name}[n] = {stored};
}}
"""
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        return single_kernel_plan("CausalConvWithState", wgsl, grid, table, compute, inputs, outputs, caps)
