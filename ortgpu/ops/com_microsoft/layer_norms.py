"""onnxruntime's residual normalisations, as its transformer optimizer fuses them into BERT, GPT-2, ViT and LLaMA-style
graphs: ``SkipLayerNormalization`` and ``SkipSimplifiedLayerNormalization`` (com.microsoft, version 1).

Both normalise ``s = input + skip (+ bias)`` over the last axis (hidden size ``H``, epsilon default 1e-12):
``(s - mean(s)) / sqrt(var(s) + epsilon) * gamma (+ beta)``, and the simplified (RMS) one ``s / sqrt(mean(s^2) +
epsilon) * gamma``.  ``input`` is (batch, sequence, H) or (tokens, H); ``skip`` has input's shape, or for a 3-D input
(1, sequence, H) or (sequence, H), shared by every batch; gamma, beta and bias are (H,).  Optional outputs, as
onnxruntime's CPU kernel writes them: each row's mean (0 for the simplified one, which does not centre) and inverse
standard deviation (float32, shape ``input.shape[:-1] + (1,)``), and the sum ``s`` (input's type).

On the device the shared row kernel (:mod:`.._row_norm`) computes all of it in one dispatch: it adds the skip and
bias to the input at each read, in float32 (as onnxruntime does, float16 included), stores the sum and the row
statistics where asked.  The variance is the two-pass one (onnxruntime subtracts the squared mean from the mean
square; both agree within float32 rounding where the rows are not dominated by their mean).

onnxruntime registers its contributed ``LayerNormalization`` and ``SimplifiedLayerNormalization`` (what the
optimizer writes for un-fused norms) in the default domain, not in com.microsoft: they are in
:mod:`ortgpu.ops.ai_onnx.contrib_normalizations`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError

from .._kernel import DeviceCaps, Operator, OpPlan, TensorInfo
from .._registry import register
from .._row_norm import RowNorm, require_row_norm_dtypes, row_norm_plan

__all__ = ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "wanted_outputs"]

#: onnxruntime's default epsilon for the contributed normalisations of com.microsoft
DEFAULT_EPSILON = 1e-12


def wanted_outputs(outputs: Sequence[TensorInfo], count: int) -> list[bool]:
    """Which of a node's first ``count`` outputs it asks for: a missing optional output (named "" in the graph)
    reaches ``plan`` as an empty placeholder, and a wanted one of these operators is never empty once a row is."""
    return [index < len(outputs) and outputs[index].size > 0 for index in range(count)]


def check_vector(op_type: str, name: str, shape: Sequence[int], hidden: int) -> None:
    """ShapeError unless ``shape`` is (hidden,): the per-channel parameters are vectors over the last axis."""
    if tuple(shape) != (hidden,):
        raise ShapeError(
            f"{op_type}: {name} has shape {tuple(shape)}; it must be 1-D of the hidden size {hidden} (the input's "
            "last dimension)"
        )


def _check_shapes(op_type: str, shapes: Sequence[tuple[int, ...] | None]) -> None:
    x, skip = shapes[0], shapes[1]
    assert x is not None and skip is not None
    if len(x) not in (2, 3):
        raise ShapeError(
            f"{op_type}: input has shape {x}; it must be 3-D (batch, sequence, hidden) or 2-D (tokens, hidden)"
        )
    shared = len(x) == 3 and skip in ((1,) + x[1:], x[1:])
    if skip != x and not shared:
        raise ShapeError(
            f"{op_type}: skip has shape {skip}; it must be the input's {x}"
            + (f", or {(1,) + x[1:]} or {x[1:]} (shared by the batch)" if len(x) == 3 else "")
        )
    for name, shape in zip(("gamma", "beta", "bias"), shapes[2:]):
        if shape is not None:
            check_vector(op_type, name, shape, x[-1])


class _SkipNorm(Operator):
    """The two operators differ in centring and in whether a beta input sits between gamma and bias."""

    domain = "com.microsoft"
    since_version = 1
    simplified: ClassVar[bool] = False

    def _parameters(self, inputs: Sequence[Any]) -> tuple[Any, Any]:
        """(beta, bias) among the node's inputs (None where absent)."""
        rest = list(inputs[3:]) + [None, None]
        return (None, rest[0]) if self.simplified else (rest[0], rest[1])

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        x, skip, gamma = inputs[0], inputs[1], inputs[2]
        assert x is not None and skip is not None and gamma is not None
        beta, bias = self._parameters(inputs)
        _check_shapes(self.op_type, [a if a is None else tuple(a.shape) for a in (x, skip, gamma, beta, bias)])
        epsilon = float(attrs.get("epsilon", DEFAULT_EPSILON))
        # the sum in float32, in onnxruntime's order (input + skip, then + bias), float16 inputs widened first
        total = x.astype(np.float32) + skip.astype(np.float32)
        if bias is not None:
            total = total + bias.astype(np.float32)
        wide = total.astype(np.float64)
        if self.simplified:
            mean = np.zeros(wide.shape[:-1] + (1,))
            inv_std = 1.0 / np.sqrt(np.mean(wide * wide, axis=-1, keepdims=True) + epsilon)
        else:
            mean = np.mean(wide, axis=-1, keepdims=True)
            inv_std = 1.0 / np.sqrt(np.mean((wide - mean) ** 2, axis=-1, keepdims=True) + epsilon)
        y = (wide - mean) * inv_std * gamma.astype(np.float64)
        if beta is not None:
            y = y + beta.astype(np.float64)
        results = [y.astype(x.dtype), mean.astype(np.float32), inv_std.astype(np.float32), total.astype(x.dtype)]
        return results[: max(1, len(outputs))]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        x, skip = inputs[0], inputs[1]
        assert x is not None and skip is not None
        beta, bias = self._parameters(inputs)
        _check_shapes(self.op_type, [i if i is None else i.shape for i in list(inputs[:3]) + [beta, bias]])
        wanted = wanted_outputs(outputs, 4)
        require_row_norm_dtypes(self.op_type, list(inputs) + [o for o, w in zip(outputs, wanted) if w], caps)
        hidden = x.shape[-1]
        channel = f"return at % {hidden}u;"
        addends = [(1, "return at;" if skip.shape == x.shape else f"return at % {skip.size}u;")]
        if bias is not None:
            addends.append((3 if self.simplified else 4, channel))
        spec = RowNorm(
            "mean_square" if self.simplified else "variance",
            epsilon=float(attrs.get("epsilon", DEFAULT_EPSILON)),
            scale_input=2,
            scale_index=channel,
            bias_input=None if beta is None else 3,
            bias_index=None if beta is None else channel,
            addends=tuple(addends),
            mean_output=1 if wanted[1] else None,
            factor_output=2 if wanted[2] else None,
            sum_output=3 if wanted[3] else None,
        )

        def compute(full: list[np.ndarray | None]) -> list[np.ndarray]:
            if full[2] is None:  # the statistics-only kernel binds no gamma, on which its outputs do not depend
                full = full[:2] + [np.ones(hidden, np.float32)] + full[3:]
            return self.reference(full, attrs, outputs)

        axes = (len(x.shape) - 1,)
        bindings = sum(info is not None for info in inputs) + sum(wanted)
        if bindings <= caps.limits.max_storage_buffers_per_shader_stage:
            return row_norm_plan(self.op_type, spec, axes, inputs, outputs, caps, compute)
        # Every input and output at once needs more storage bindings than a kernel may have (WebGPU's default is 8):
        # a second kernel walks the rows again for the statistics alone.
        main = dataclasses.replace(spec, mean_output=None, factor_output=None)
        statistics = dataclasses.replace(spec, sum_output=None, store_normalized=False)
        kernels = [
            row_norm_plan(self.op_type, part, axes, inputs, outputs, caps, compute) for part in (main, statistics)
        ]
        return OpPlan(kernels=kernels[0].kernels + kernels[1].kernels)


@register
class SkipLayerNormalization(_SkipNorm):
    """SkipLayerNormalization-1 (com.microsoft): inputs input, skip, gamma, beta?, bias?."""

    op_type = "SkipLayerNormalization"


@register
class SkipSimplifiedLayerNormalization(_SkipNorm):
    """SkipSimplifiedLayerNormalization-1 (com.microsoft): inputs input, skip, gamma, bias? (RMS: no beta)."""

    op_type = "SkipSimplifiedLayerNormalization"
    simplified = True
