"""Gemm: ``alpha * op(A) @ op(B) + beta * C`` with 2-D A and B, C broadcast to ``[M, N]`` (optional from
opset 11), then the fused epilogue of :mod:`ortgpu.ops.ai_onnx.matmul` (extra inputs from index 3)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import UnsupportedOpError

from .._epilogue import EpilogueStep, apply_epilogue, parse_epilogue
from .._kernel import DeviceCaps, Operator, OpPlan, TensorInfo
from .._registry import register
from .._tiling import require_float
from .matmul import plan_gemm

__all__ = ["Gemm"]


def _gemm_steps(
    attrs: Mapping[str, Any], shapes: Sequence[tuple[int, ...] | None], out_shape: tuple[int, ...]
) -> list[EpilogueStep]:
    """alpha, beta * C, then the user's epilogue."""
    alpha = float(attrs.get("alpha", 1.0))
    beta = float(attrs.get("beta", 1.0))
    steps: list[EpilogueStep] = []
    if alpha != 1.0:
        steps.append(EpilogueStep("scale", value=alpha))
    c_shape = shapes[2] if len(shapes) > 2 else None
    if c_shape is not None and beta != 0.0:
        padded = (1,) * (2 - len(c_shape)) + tuple(c_shape)
        if len(c_shape) > 2 or any(c not in (1, o) for c, o in zip(padded, out_shape)):
            raise UnsupportedOpError(f"Gemm: C of shape {c_shape} does not broadcast to {out_shape}")
        steps.append(EpilogueStep("add", 2, beta, tuple(c_shape)))
    return steps + parse_epilogue("Gemm", attrs, 3, shapes, out_shape)


def _gemm_out_shape(a_shape: tuple[int, ...], b_shape: tuple[int, ...], attrs: Mapping[str, Any]) -> tuple[int, int]:
    if len(a_shape) != 2 or len(b_shape) != 2:
        raise UnsupportedOpError(f"Gemm: A and B must be 2-D, got {a_shape} and {b_shape}")
    trans_a, trans_b = bool(attrs.get("transA", 0)), bool(attrs.get("transB", 0))
    m, k = (a_shape[1], a_shape[0]) if trans_a else a_shape
    k2, n = (b_shape[1], b_shape[0]) if trans_b else b_shape
    if k != k2:
        raise UnsupportedOpError(f"Gemm: inner dimensions differ ({k} vs {k2})")
    return (m, n)


@register
class Gemm(Operator):
    """Gemm-1/6/7/9/11/13."""

    op_type = "Gemm"
    since_version = 1
    opset_changes = (11,)

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        if self.opset and self.opset < 11 and (len(inputs) < 3 or inputs[2] is None):
            raise UnsupportedOpError(f"Gemm: input C is required before opset 11 (model opset {self.opset})")
        if attrs.get("transA", 0):
            a = a.T
        if attrs.get("transB", 0):
            b = b.T
        out_shape = _gemm_out_shape(inputs[0].shape, inputs[1].shape, attrs)  # type: ignore[union-attr]
        dtype = a.dtype
        if dtype == np.float16:  # as the kernels do: products and sums in float32, one rounding at the end
            a, b = a.astype(np.float32), b.astype(np.float32)
        y = np.asarray(np.matmul(a, b), dtype=a.dtype)
        shapes = [None if x is None else tuple(x.shape) for x in inputs]
        return [apply_epilogue(y, _gemm_steps(attrs, shapes, out_shape), inputs).astype(dtype, copy=False)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        require_float("Gemm", list(inputs) + list(outputs), caps)
        out_shape = _gemm_out_shape(a.shape, b.shape, attrs)
        steps = _gemm_steps(attrs, [None if x is None else x.shape for x in inputs], out_shape)
        return plan_gemm(
            "Gemm",
            a_shape=a.shape,
            b_shape=b.shape,
            trans_a=bool(attrs.get("transA", 0)),
            trans_b=bool(attrs.get("transB", 0)),
            steps=steps,
            out_shape=out_shape,
            compute=lambda full: self.reference(full, attrs, outputs),
            inputs=inputs,
            outputs=outputs,
            caps=caps,
        )
