"""CausalConvWithState-27: a causal depthwise 1-D convolution that carries its state.

``input [B, C, L]``, ``weight [C, 1, K]``, optional ``bias [C]`` and ``past_state [B, C, K - 1]`` (zeros when
absent).  Over ``padded = concat(past_state, input)`` along the length,
``output[b, c, t] = bias[c] + sum_k weight[c, 0, k] * padded[b, c, t + k]``, optionally followed by SiLU
(``activation`` ``"silu"`` or its alias ``"swish"``); ``present_state`` is the last ``K - 1`` positions of
``padded``.

It runs on the CPU (this reference).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ._kernel import Operator, TensorInfo
from ._registry import register

__all__ = ["CausalConvWithState"]


@register
class CausalConvWithState(Operator):
    """CausalConvWithState-27 (CPU)."""

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
