"""onnxruntime's contributed normalisations that it registers in the default domain (version 1), not in
com.microsoft: ``LayerNormalization`` before ONNX defined it (opset 17) and ``SimplifiedLayerNormalization`` (RMS),
which onnxruntime's transformer optimizer writes for the norms it does not fuse with a residual (BERT exported at
opset 13 or 14, T5, LLaMA).  They live here because a model names them in the default domain: a model importing
opset 13 gets this LayerNormalization, one importing 17 or later the standard one.

Both take X, a scale (and LayerNormalization a bias) broadcast to X, and may differ from X in type: Y has the
scale's type, as in onnxruntime (float32 X with a float16 scale gives float16 Y).  Their optional statistics (Mean
and InvStdDev; SimplifiedLayerNormalization has InvStdDev only, its output 1) are float32 for ``stash_type`` 1 (the
default), X's type for 0; shape X's with the normalised axes set to 1.

SimplifiedLayerNormalization runs on the shared row kernel (:mod:`.._row_norm`), which reads each tensor in its own
type and computes in float32; the normalised value is not rounded to X's type before the scale (onnxruntime does not;
ONNX's RMSNormalization-23 does).  LayerNormalization-1 plans as LayerNormalization-17 does (one type for X, scale,
bias and Y on the device; mixed types run on the CPU).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .._kernel import DeviceCaps, Operator, OpPlan, TensorInfo
from .._registry import register
from .._row_norm import RowNorm, require_row_norm_dtypes, row_norm_plan
from .._tiling import broadcast_strides, index_function
from .layer_normalization import LayerNormalization
from .rms_normalization import check_norm_scale, norm_axis, wide_mean_square

__all__ = ["LayerNormalization_1", "SimplifiedLayerNormalization"]


@register
class LayerNormalization_1(LayerNormalization):
    """LayerNormalization-1 (onnxruntime's, default domain): LayerNormalization-17 with Y in the scale's type."""

    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, scale = inputs[0], inputs[1]
        assert x is not None and scale is not None
        # computed from X in float64 (what the standard reference does inside), then stored in onnxruntime's types
        results = super().reference([x.astype(np.float64)] + list(inputs[1:]), attrs, outputs)
        stash = np.float32 if int(attrs.get("stash_type", 1)) == 1 else x.dtype
        return [results[0].astype(scale.dtype)] + [r.astype(stash) for r in results[1:]]


@register
class SimplifiedLayerNormalization(Operator):
    """SimplifiedLayerNormalization-1 (onnxruntime's, default domain): ``Y = X / sqrt(mean(X^2) + epsilon) *
    scale`` over the axes from ``axis`` (default -1) on; epsilon default 1e-5; optional output 1 InvStdDev."""

    op_type = "SimplifiedLayerNormalization"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, scale = inputs[0], inputs[1]
        assert x is not None and scale is not None
        axis = norm_axis(self.op_type, x.shape, attrs)
        check_norm_scale(self.op_type, scale.shape, x.shape)
        epsilon = float(attrs.get("epsilon", 1e-5))
        wide, mean_square = wide_mean_square(x, axis)
        inv_std = 1.0 / np.sqrt(mean_square + epsilon)
        y = (wide * inv_std * scale.astype(np.float64)).astype(scale.dtype)
        stash = np.float32 if int(attrs.get("stash_type", 1)) == 1 else x.dtype
        return [y, inv_std.astype(stash)][: max(1, len(outputs))]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x, scale = inputs[0], inputs[1]
        assert x is not None and scale is not None
        want_inv_std = len(outputs) > 1 and outputs[1].size > 0  # "" (absent) reaches here as an empty placeholder
        require_row_norm_dtypes(self.op_type, [x, scale, outputs[0]] + ([outputs[1]] if want_inv_std else []), caps)
        axis = norm_axis(self.op_type, x.shape, attrs)
        check_norm_scale(self.op_type, scale.shape, x.shape)
        spec = RowNorm(
            "mean_square",
            epsilon=float(attrs.get("epsilon", 1e-5)),
            scale_input=1,
            scale_index="return scale_at(at);",
            helpers=index_function("scale_at", x.shape, broadcast_strides(scale.shape, x.shape)),
            factor_output=1 if want_inv_std else None,
        )
        compute = lambda full: self.reference(full, attrs, outputs)  # noqa: E731
        return row_norm_plan(self.op_type, spec, range(axis, len(x.shape)), inputs, outputs, caps, compute)
