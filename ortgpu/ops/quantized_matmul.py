"""MatMulInteger and QLinearMatMul: exact integer matrix products (CPU references).

Both subtract the zero points exactly, multiply in int64 (numpy's integer
matmul is exact) and wrap the sums to int32, the accumulator ONNX specifies
("accumulation may overflow if and only if in 32 bits").  A 1-D zero point of
``a`` is per row (one value per row of each matrix), of ``b`` per column.
QLinearMatMul then requantizes: ``saturate(round_half_even(acc * a_scale *
b_scale / y_scale) + y_zero_point)``, the multiplier in float32 as onnxruntime
computes it.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from ._kernel import Operator, TensorInfo
from ._registry import register
from .quantize import saturate_round

__all__ = ["MatMulInteger", "QLinearMatMul", "wrap_int32"]

_INTEGER_INPUTS = (np.dtype(np.uint8), np.dtype(np.int8))


def wrap_int32(values: np.ndarray) -> np.ndarray:
    """int64 sums as int32 with two's complement wrap-around (the accumulator's overflow)."""
    return values.astype(np.int64).astype(np.uint64).astype(np.uint32).view(np.int32)


def _per_row(value: np.ndarray | None, matrix: np.ndarray, op_type: str, what: str) -> np.ndarray:
    """A parameter of ``a`` shaped to broadcast over its rows (1-D: one value per row)."""
    if value is None:
        return np.zeros((), dtype=np.int64)
    if value.size == 1:
        return value.reshape(()).astype(np.int64)
    if value.ndim == 1:
        if matrix.ndim < 2 or value.shape[0] != matrix.shape[-2]:
            raise ShapeError(f"{op_type}: {what} of {value.shape[0]} values for rows of {matrix.shape}")
        return value.reshape(-1, 1).astype(np.int64)
    return value.astype(np.int64)


def _per_column(value: np.ndarray | None, matrix: np.ndarray, op_type: str, what: str) -> np.ndarray:
    """A parameter of ``b`` shaped to broadcast over its columns (1-D: one value per column)."""
    if value is None:
        return np.zeros((), dtype=np.int64)
    if value.size == 1:
        return value.reshape(()).astype(np.int64)
    if value.ndim == 1 and value.shape[0] != matrix.shape[-1]:
        raise ShapeError(f"{op_type}: {what} of {value.shape[0]} values for columns of {matrix.shape}")
    return value.astype(np.int64)


def integer_matmul(
    a: np.ndarray, b: np.ndarray, a_zero: np.ndarray | None, b_zero: np.ndarray | None, op_type: str
) -> np.ndarray:
    """``(a - a_zero) @ (b - b_zero)`` as int32 (wrapped)."""
    for name, value in (("A", a), ("B", b)):
        if value.dtype not in _INTEGER_INPUTS:
            raise UnsupportedOpError(f"{op_type}: {name} of dtype {value.dtype} (uint8 or int8 expected)")
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"{op_type}: inputs must have rank >= 1")
    left = a.astype(np.int64) - _per_row(a_zero, a, op_type, "a_zero_point")
    right = b.astype(np.int64) - _per_column(b_zero, b, op_type, "b_zero_point")
    try:
        product = np.matmul(left, right)
    except ValueError as error:
        raise ShapeError(f"{op_type}: shapes {a.shape} and {b.shape} do not multiply ({error})") from None
    return wrap_int32(np.asarray(product))


@register
class MatMulInteger(Operator):
    op_type = "MatMulInteger"
    since_version = 10

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        a_zero = inputs[2] if len(inputs) > 2 else None
        b_zero = inputs[3] if len(inputs) > 3 else None
        return [integer_matmul(a, b, a_zero, b_zero, self.op_type)]


@register
class QLinearMatMul(Operator):
    op_type = "QLinearMatMul"
    since_version = 10

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero = inputs[:8]
        assert a is not None and b is not None and a_scale is not None and b_scale is not None
        assert y_scale is not None and y_zero is not None
        for scale in (a_scale, b_scale, y_scale):
            if scale.dtype not in (np.float32, np.float16):
                raise UnsupportedOpError(f"QLinearMatMul: scales of dtype {scale.dtype} (float32 or float16)")
        if y_zero.dtype not in _INTEGER_INPUTS:
            raise UnsupportedOpError(f"QLinearMatMul: outputs of dtype {y_zero.dtype} (uint8 or int8 expected)")
        accumulated = integer_matmul(a, b, a_zero, b_zero, self.op_type)
        if y_scale.size != 1 or y_zero.size != 1:
            raise UnsupportedOpError("QLinearMatMul: y_scale and y_zero_point must be per tensor (one value)")
        input_scales = _scale_rows(a_scale).astype(np.float32) * _scale_columns(b_scale).astype(np.float32)
        multiplier = input_scales / y_scale.reshape(()).astype(np.float32)
        scaled = accumulated.astype(np.float32) * multiplier.astype(np.float32)
        return [saturate_round(np.rint(scaled.astype(np.float64)) + float(y_zero.reshape(-1)[0]), y_zero.dtype)]


def _scale_rows(scale: np.ndarray) -> np.ndarray:
    if scale.size == 1:
        return scale.reshape(())
    return scale.reshape(-1, 1) if scale.ndim == 1 else scale


def _scale_columns(scale: np.ndarray) -> np.ndarray:
    return scale.reshape(()) if scale.size == 1 else scale
