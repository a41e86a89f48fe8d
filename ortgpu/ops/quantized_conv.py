"""ConvInteger and QLinearConv: exact integer convolutions (CPU references).

Zero points are subtracted before padding, so padded positions contribute 0
(as if padded with the zero point).  Products are summed in int64 and wrapped to
the int32 accumulator.  ``w``'s zero point (and QLinearConv's ``w_scale``) may
be per output channel.  QLinearConv adds the int32 bias and requantizes:
``saturate(round_half_even(acc * x_scale * w_scale / y_scale) + y_zero_point)``
with the multiplier in float32, as onnxruntime computes it.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ._kernel import Operator, TensorInfo
from ._registry import register
from .quantize import saturate_round
from .quantized_matmul import wrap_int32

__all__ = ["ConvInteger", "QLinearConv", "integer_conv"]

_INTEGER_INPUTS = (np.dtype(np.uint8), np.dtype(np.int8))


def _pads(
    attrs: Mapping[str, Any],
    spatial: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    op_type: str,
) -> list[tuple[int, int]]:
    auto_pad = str(attrs.get("auto_pad", "NOTSET"))
    rank = len(spatial)
    if auto_pad == "NOTSET":
        pads = [int(p) for p in attrs.get("pads", [0] * (2 * rank))]
        if len(pads) != 2 * rank:
            raise ShapeError(f"{op_type}: pads {pads} for {rank} spatial axes")
        return [(pads[d], pads[d + rank]) for d in range(rank)]
    if auto_pad == "VALID":
        return [(0, 0)] * rank
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        result = []
        for size, k, s, dil in zip(spatial, kernel, strides, dilations):
            total = max(0, (math.ceil(size / s) - 1) * s + (k - 1) * dil + 1 - size)
            small = total // 2
            result.append((small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small))
        return result
    raise UnsupportedOpError(f"{op_type}: auto_pad {auto_pad!r} is not supported")


def integer_conv(x: np.ndarray, w: np.ndarray, attrs: Mapping[str, Any], op_type: str) -> np.ndarray:
    """The convolution of int64 ``x`` (N, C, ...) and ``w`` (M, C/group, ...) in int64 (not yet wrapped)."""
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ShapeError(f"{op_type}: input {x.shape} and weight {w.shape} ranks")
    rank = x.ndim - 2
    group = int(attrs.get("group", 1))
    batch, channels = x.shape[:2]
    filters, per_group = w.shape[:2]
    kernel = list(w.shape[2:])
    if "kernel_shape" in attrs and [int(k) for k in attrs["kernel_shape"]] != kernel:
        raise ShapeError(f"{op_type}: kernel_shape {attrs['kernel_shape']} differs from the weight's {kernel}")
    if group < 1 or channels != per_group * group or filters % group:
        raise ShapeError(f"{op_type}: {channels} channels, weight {w.shape} and group {group} do not match")
    strides = [int(s) for s in attrs.get("strides", [1] * rank)]
    dilations = [int(d) for d in attrs.get("dilations", [1] * rank)]
    pads = _pads(attrs, x.shape[2:], kernel, strides, dilations, op_type)
    padded = np.pad(x, [(0, 0), (0, 0)] + pads)
    out_spatial = [(padded.shape[2 + d] - dilations[d] * (kernel[d] - 1) - 1) // strides[d] + 1 for d in range(rank)]
    if any(n <= 0 for n in out_spatial):
        raise ShapeError(f"{op_type}: the kernel {kernel} is larger than the padded input {padded.shape[2:]}")
    out = np.zeros((batch, filters) + tuple(out_spatial), dtype=np.int64)
    per_filter_group = filters // group
    for offset in itertools.product(*(range(k) for k in kernel)):
        window = tuple(
            slice(
                offset[d] * dilations[d], offset[d] * dilations[d] + (out_spatial[d] - 1) * strides[d] + 1, strides[d]
            )
            for d in range(rank)
        )
        patch = padded[(slice(None), slice(None)) + window]  # (N, C, *out)
        taps = w[(slice(None), slice(None)) + tuple(offset)]  # (M, C/group)
        for g in range(group):
            channels_g = slice(g * per_group, (g + 1) * per_group)
            filters_g = slice(g * per_filter_group, (g + 1) * per_filter_group)
            out[:, filters_g] += np.einsum("nc...,mc->nm...", patch[:, channels_g], taps[filters_g])
    return out


def _per_filter(value: np.ndarray | None, filters: int, op_type: str, what: str) -> np.ndarray:
    """A per-tensor or per-output-channel parameter shaped to broadcast over (M, C/group, ...) weights."""
    if value is None:
        return np.zeros((), dtype=np.int64)
    if value.size == 1:
        return value.reshape(())
    if value.ndim != 1 or value.shape[0] != filters:
        raise ShapeError(f"{op_type}: {what} of shape {value.shape} for {filters} output channels")
    return value.reshape(-1, 1)


def _check_dtype(op_type: str, name: str, value: np.ndarray) -> None:
    if value.dtype not in _INTEGER_INPUTS:
        raise UnsupportedOpError(f"{op_type}: {name} of dtype {value.dtype} (uint8 or int8 expected)")


def _shifted(
    x: np.ndarray, x_zero: np.ndarray | None, w: np.ndarray, w_zero: np.ndarray | None, op_type: str
) -> tuple[np.ndarray, np.ndarray]:
    _check_dtype(op_type, "x", x)
    _check_dtype(op_type, "w", w)
    if x_zero is not None and x_zero.size != 1:
        raise UnsupportedOpError(f"{op_type}: x_zero_point must be per tensor, got shape {x_zero.shape}")
    x_shift = 0 if x_zero is None else int(x_zero.reshape(-1)[0])
    filters = w.shape[0]
    w_shift = _per_filter(w_zero, filters, op_type, "w_zero_point").astype(np.int64).reshape(-1)
    if w_shift.size > 1:
        w_shift = w_shift.reshape((-1,) + (1,) * (w.ndim - 1))
    weights = w.astype(np.int64) - w_shift.reshape(w_shift.shape if w_shift.size > 1 else ())
    return x.astype(np.int64) - x_shift, weights


@register
class ConvInteger(Operator):
    op_type = "ConvInteger"
    since_version = 10

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, w = inputs[0], inputs[1]
        assert x is not None and w is not None
        x_zero = inputs[2] if len(inputs) > 2 else None
        w_zero = inputs[3] if len(inputs) > 3 else None
        shifted_x, shifted_w = _shifted(x, x_zero, w, w_zero, self.op_type)
        return [wrap_int32(integer_conv(shifted_x, shifted_w, attrs, self.op_type))]


@register
class QLinearConv(Operator):
    op_type = "QLinearConv"
    since_version = 10

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero = inputs[:8]
        bias = inputs[8] if len(inputs) > 8 else None
        assert x is not None and w is not None and x_scale is not None and w_scale is not None
        assert y_scale is not None
        for scale in (x_scale, w_scale, y_scale):
            if scale.dtype != np.float32:
                raise UnsupportedOpError(f"QLinearConv: scales of dtype {scale.dtype} (float32 expected)")
        if x_scale.size != 1 or y_scale.size != 1 or (y_zero is not None and y_zero.size != 1):
            raise UnsupportedOpError("QLinearConv: x_scale, y_scale and y_zero_point must be per tensor")
        out_dtype = x.dtype if y_zero is None else y_zero.dtype
        _check_dtype(self.op_type, "y_zero_point", np.zeros(0, out_dtype))
        shifted_x, shifted_w = _shifted(x, x_zero, w, w_zero, self.op_type)
        accumulated = integer_conv(shifted_x, shifted_w, attrs, self.op_type)
        filters = w.shape[0]
        spatial = (1,) * (x.ndim - 2)
        if bias is not None:
            if bias.dtype != np.int32 or bias.shape != (filters,):
                raise ShapeError(f"QLinearConv: bias {bias.dtype}{bias.shape} (int32 of {filters} expected)")
            accumulated = accumulated + bias.astype(np.int64).reshape((filters,) + spatial)
        total = wrap_int32(accumulated)
        w_scales = _per_filter(w_scale, filters, self.op_type, "w_scale").reshape(-1)
        multiplier = (np.float32(x_scale.reshape(-1)[0]) * w_scales.astype(np.float32)) / np.float32(
            y_scale.reshape(-1)[0]
        )
        multiplier = multiplier.reshape((-1,) + spatial) if multiplier.size > 1 else multiplier.reshape(())
        scaled = total.astype(np.float32) * multiplier.astype(np.float32)
        offset = 0.0 if y_zero is None else float(y_zero.reshape(-1)[0])
        return [saturate_round(np.rint(scaled.astype(np.float64)) + offset, out_dtype)]
