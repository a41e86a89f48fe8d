"""com.microsoft's QGemm: the Gemm of ``quantize_static``'s QOperator format, on 8-bit matrices.

Inputs A, a_scale, a_zero_point, B, b_scale, b_zero_point, then optional C (an int32 bias, already in the scale
``a_scale * b_scale``), y_scale and y_zero_point; attributes alpha (1.0), transA and transB (0).  As onnxruntime's CPU
kernel computes it: the int32 sum ``C + (A' - a_zero) @ (B' - b_zero)`` (wrapping; A' and B' transposed as asked),
then per column the float32 multiplier ``alpha * a_scale * b_scale[col]`` (in that order), divided by ``y_scale``
when it is given.  With a y_zero_point the output is quantized: ``saturate(round_half_even(f32(sum) * multiplier) +
y_zero_point)`` (MLAS's requantization); without one it is float32: ``f32(sum) * multiplier``.  A's scale and zero
point are per tensor; B's may be per column (one value per output column).

On the device it runs the integer matmul kernel of MatMulInteger/QLinearMatMul
(:func:`~ortgpu.ops.ai_onnx.quantized_matmul.integer_matmul_kernel`): the transposes become strides, the bias starts
each sum, and the multipliers, computed on the host in float32 exactly as onnxruntime does, are WGSL constants (a
WGSL division is not correctly rounded, a product is).  That needs the scales as constants (``quantize_static`` writes
them as initializers) and a per-tensor B zero point (or per-column zeros); otherwise the node runs on the CPU.

Where onnxruntime differs from this formula: with K = 0 its kernel fills the output its own way (the bias quantized
through ``a_scale * b_scale`` alone); ortgpu keeps the formula.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register
from ..ai_onnx.quantize import saturate_round
from ..ai_onnx.quantized_matmul import integer_matmul_kernel, wrap_int32

__all__ = ["QGemm", "output_multipliers"]

_BYTES = (np.dtype(np.uint8), np.dtype(np.int8))
F32 = np.float32


def _input(inputs: Sequence[Any], index: int) -> Any:
    return inputs[index] if len(inputs) > index else None


def _flags(attrs: Mapping[str, Any]) -> tuple[float, bool, bool]:
    return float(attrs.get("alpha", 1.0)), bool(int(attrs.get("transA", 0))), bool(int(attrs.get("transB", 0)))


def _dimensions(a_shape: Sequence[int], b_shape: Sequence[int], attrs: Mapping[str, Any]) -> tuple[int, int, int]:
    """(M, K, N) of the product, checked as onnxruntime's GemmHelper does (both operands 2-D)."""
    _, trans_a, trans_b = _flags(attrs)
    if len(a_shape) != 2 or len(b_shape) != 2:
        raise ShapeError(f"QGemm: A {tuple(a_shape)} and B {tuple(b_shape)} must both be matrices (rank 2)")
    m, k = (a_shape[1], a_shape[0]) if trans_a else (a_shape[0], a_shape[1])
    k_b, n = (b_shape[1], b_shape[0]) if trans_b else (b_shape[0], b_shape[1])
    if k != k_b:
        raise ShapeError(
            f"QGemm: A {tuple(a_shape)} (transA={int(trans_a)}) and B {tuple(b_shape)} (transB={int(trans_b)}) "
            "do not multiply; check the transpose attributes"
        )
    return int(m), int(k), int(n)


def _per_tensor(value: np.ndarray, what: str) -> np.ndarray:
    if value.size != 1 or value.ndim > 1:
        raise ShapeError(f"QGemm: {what} must be a scalar or one value, got shape {value.shape}")
    return value.reshape(())


def _per_column(value: np.ndarray, columns: int, what: str) -> np.ndarray:
    if value.ndim > 1 or value.size not in (1, columns):
        raise ShapeError(
            f"QGemm: {what} of shape {value.shape}, expected a scalar, one value or {columns} (per column)"
        )
    return value.reshape(()) if value.size == 1 else value.reshape(columns)


def output_multipliers(
    a_scale: np.ndarray, b_scale: np.ndarray, y_scale: np.ndarray | None, alpha: float, columns: int
) -> np.ndarray:
    """Per column (or one): ``alpha * a_scale * b_scale[col]`` (divided by ``y_scale`` when given), in float32."""
    for value, what in ((a_scale, "a_scale"), (b_scale, "b_scale"), (y_scale, "y_scale")):
        if value is not None and value.dtype != np.float32:
            raise UnsupportedOpError(f"QGemm: {what} of dtype {value.dtype} (float32 expected)")
    product = (F32(alpha) * _per_tensor(a_scale, "a_scale")).astype(F32) * _per_column(b_scale, columns, "b_scale")
    multipliers = np.atleast_1d(product.astype(F32))
    if y_scale is not None:
        multipliers = (multipliers / _per_tensor(y_scale, "y_scale")).astype(F32)
    return multipliers


@register
class QGemm(Operator):
    op_type = "QGemm"
    domain = "com.microsoft"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        a, a_scale, a_zero, b, b_scale, b_zero = inputs[:6]
        if a is None or a_scale is None or b is None or b_scale is None:
            raise ShapeError("QGemm: A, a_scale, B and b_scale are required")
        bias, y_scale, y_zero = _input(inputs, 6), _input(inputs, 7), _input(inputs, 8)
        for value, what in ((a, "A"), (b, "B")):
            if value.dtype not in _BYTES:
                raise UnsupportedOpError(f"QGemm: {what} of dtype {value.dtype} (uint8 or int8 expected)")
        alpha, trans_a, trans_b = _flags(attrs)
        m, _, n = _dimensions(a.shape, b.shape, attrs)
        left = (a.T if trans_a else a).astype(np.int64)
        right = (b.T if trans_b else b).astype(np.int64)
        if a_zero is not None:
            if a_zero.dtype != a.dtype:
                raise UnsupportedOpError(f"QGemm: a_zero_point of dtype {a_zero.dtype} differs from A's {a.dtype}")
            left = left - _per_tensor(a_zero, "a_zero_point").astype(np.int64)
        if b_zero is not None:
            if b_zero.dtype != b.dtype:
                raise UnsupportedOpError(f"QGemm: b_zero_point of dtype {b_zero.dtype} differs from B's {b.dtype}")
            right = right - _per_column(b_zero, n, "b_zero_point").astype(np.int64)
        total = left @ right
        if bias is not None:
            if bias.dtype != np.int32:
                raise UnsupportedOpError(f"QGemm: C of dtype {bias.dtype} (int32 expected, in a_scale * b_scale)")
            if bias.ndim > 2 or any(d not in (1, full) for d, full in zip(((1, 1) + bias.shape)[-2:], (m, n))):
                raise ShapeError(f"QGemm: bias C of shape {bias.shape} does not broadcast to ({m}, {n})")
            total = total + bias.astype(np.int64)
        accumulated = wrap_int32(np.asarray(total))
        multipliers = output_multipliers(a_scale, b_scale, y_scale, alpha, n)
        scaled = (accumulated.astype(F32) * (multipliers if multipliers.size > 1 else multipliers[0])).astype(F32)
        if y_zero is None:
            return [np.ascontiguousarray(scaled)]
        if y_zero.dtype not in _BYTES:
            raise UnsupportedOpError(f"QGemm: y_zero_point of dtype {y_zero.dtype} (uint8 or int8 expected)")
        zero = int(_per_tensor(y_zero, "y_zero_point"))
        return [saturate_round(np.rint(scaled.astype(np.float64)) + zero, y_zero.dtype)]

    def output_shapes(
        self, inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
    ) -> list[tuple[int, ...]] | None:
        a, b = inputs[0], inputs[3]
        assert a is not None and b is not None
        m, _, n = _dimensions(a.shape, b.shape, attrs)
        return [(m, n)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        a, b = inputs[0], inputs[3]
        assert a is not None and b is not None
        m, _, n = _dimensions(a.shape, b.shape, attrs)
        scale_positions = [1, 4] + ([7] if _input(inputs, 7) is not None else [])
        if not all(position in constants for position in scale_positions):
            raise NotOnDevice("QGemm: scales computed at run time run on the CPU (the multipliers are planned)")
        b_zero = inputs[5]
        if b_zero is not None and 5 in constants and not np.any(constants[5]):
            b_zero = None  # zeros (symmetric weights, what quantize_static writes per channel): nothing to subtract
        if b_zero is not None and b_zero.size != 1:
            raise NotOnDevice("QGemm: a per-column B zero point other than zeros runs on the CPU")
        alpha, trans_a, trans_b = _flags(attrs)
        y_scale = constants.get(7)
        multipliers = output_multipliers(constants[1], constants[4], y_scale, alpha, n)
        if not np.all(np.isfinite(multipliers)) or float(np.abs(multipliers).max()) * 2.0**31 >= 3.4e38:
            raise NotOnDevice("QGemm: a multiplier that could make a scaled sum infinite runs on the CPU")
        y_zero = _input(inputs, 8)
        bias = 6 if _input(inputs, 6) is not None else -1
        zero_positions = [2 if inputs[2] is not None else -1, 5 if b_zero is not None else -1]
        # the inputs the kernel binds, in its binding order: A, B, the zero points, y_zero_point, the bias
        bound = [0, 3] + [p for p in zero_positions if p >= 0] + ([8] if y_zero is not None else [])
        bound += [bias] if bias >= 0 else []
        operator, attributes = QGemm(self.opset), dict(attrs)

        def function(*arrays: np.ndarray) -> np.ndarray:
            values: list[np.ndarray | None] = [constants.get(i) for i in range(len(inputs))]
            for position, array in zip(bound, arrays):
                values[position] = array
            return operator.reference(values, attributes, outputs)[0]

        if m * n == 0:
            return OpPlan()
        values = [float(value) for value in multipliers]
        return integer_matmul_kernel(
            self.op_type,
            inputs,
            outputs,
            [0, 3, *zero_positions],
            caps,
            function,
            requantize=None if y_zero is None else (values, 8, y_zero.dtype.name),
            transposed=(trans_a, trans_b),
            integer_bias=bias,
            scaled=values if y_zero is None else None,
        )
