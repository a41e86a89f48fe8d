"""com.microsoft's integer matmuls with float outputs (MatMulIntegerToFloat, DynamicQuantizeMatMul) and its own
QuantizeLinear/DequantizeLinear, which onnxruntime's quantization tools emit.

``MatMulIntegerToFloat``: ``Y = f32((A - a_zero) @ (B - b_zero)) * (a_scale * b_scale) + bias``: the int32 sum of
:func:`~ortgpu.ops.ai_onnx.quantized_matmul.integer_matmul`, converted to float32 once, times the float32 product of
the scales (onnxruntime multiplies the scales first), plus the bias.  B's scale and zero point may be per column
(one per column of B); A's are per tensor.

``DynamicQuantizeMatMul``: A (float32) is quantized to uint8 first exactly as DynamicQuantizeLinear does (scale and
zero point from A's range, which always includes 0), then as MatMulIntegerToFloat with that scale and zero point.

``QuantizeLinear``/``DequantizeLinear`` of this domain are the standard operators as of ONNX opset 13 (per tensor,
or per axis with ``axis``), so they are the standard classes fixed at that opset (no ``block_size``, no
``output_dtype``): same references, same device kernels.

On the device: MatMulIntegerToFloat runs the standard integer matmul kernel
(:func:`~ortgpu.ops.ai_onnx.quantized_matmul.integer_matmul_kernel`) finishing in float32, for uint8/int8 matrices of
rank >= 2 with B's scale and zero point per tensor or per column (1-D); the kernel reads the scales from their
buffers and multiplies them in float32 per output element, as the reference (and onnxruntime) multiply them first.
DynamicQuantizeMatMul is three kernels in one plan: DynamicQuantizeLinear's two (A's range, scale and zero point;
then A quantized) writing into scratch buffers, then the same integer matmul kernel reading A's scale and zero point
from those buffers (so nothing about A passes through the host).
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from ortgpu_core._errors import ShapeError, UnsupportedOpError

from .._kernel import Binding, DeviceCaps, NotOnDevice, Operator, OpPlan, TensorInfo
from .._registry import register
from ..ai_onnx import quantize as standard_quantize
from ..ai_onnx.quantized_matmul import integer_matmul, integer_matmul_kernel
from ._attention_parts import PlanBuilder

__all__ = ["MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QuantizeLinear", "DequantizeLinear"]

#: The ONNX opset whose QuantizeLinear/DequantizeLinear com.microsoft's version 1 matches.
STANDARD_QUANTIZE_OPSET = 13


def _optional(inputs: Sequence[Any], index: int) -> Any:
    return inputs[index] if len(inputs) > index else None


def _per_tensor(op_type: str, value: np.ndarray, what: str) -> np.ndarray:
    if value.size != 1:
        raise ShapeError(f"{op_type}: {what} must be one value (per tensor), got shape {value.shape}")
    return value.reshape(())


def _per_column(op_type: str, value: np.ndarray, columns: int, what: str) -> np.ndarray:
    """A parameter of B: one value, or one per column."""
    if value.size == 1:
        return value.reshape(())
    if value.ndim != 1 or value.shape[0] != columns:
        raise ShapeError(f"{op_type}: {what} of shape {value.shape}, expected one value or {columns} (one per column)")
    return value


def integer_matmul_to_float(
    op_type: str,
    a: np.ndarray,
    b: np.ndarray,
    a_scale: np.ndarray,
    b_scale: np.ndarray,
    a_zero: np.ndarray | None,
    b_zero: np.ndarray | None,
    bias: np.ndarray | None,
) -> np.ndarray:
    """``f32((a - a_zero) @ (b - b_zero)) * (a_scale * b_scale) + bias`` in float32."""
    if a_scale.dtype != np.float32 or b_scale.dtype != np.float32:
        raise UnsupportedOpError(f"{op_type}: scales of dtype {a_scale.dtype}/{b_scale.dtype} (float32 expected)")
    if b.ndim < 1:
        raise ShapeError(f"{op_type}: B must have rank >= 1")
    columns = b.shape[-1]
    a_zero = None if a_zero is None else _per_tensor(op_type, a_zero, "a_zero_point")
    b_zero = None if b_zero is None else _per_column(op_type, b_zero, columns, "b_zero_point")
    if a_zero is not None and a_zero.dtype != a.dtype or b_zero is not None and b_zero.dtype != b.dtype:
        raise UnsupportedOpError(f"{op_type}: a zero point's dtype differs from its matrix's")
    accumulated = integer_matmul(a, b, a_zero, b_zero, op_type)
    multiplier = _per_tensor(op_type, a_scale, "a_scale") * _per_column(op_type, b_scale, columns, "b_scale")
    y = accumulated.astype(np.float32) * multiplier.astype(np.float32)
    if bias is not None:
        if bias.dtype != np.float32 or bias.shape != (columns,):
            raise ShapeError(f"{op_type}: bias of shape {bias.shape} ({bias.dtype}), expected ({columns},) float32")
        y = y + bias
    return np.ascontiguousarray(y.astype(np.float32))


def _check_float_parameters(
    op_type: str, b_scale: TensorInfo, bias: TensorInfo | None, outputs: Sequence[TensorInfo]
) -> None:
    """``NotOnDevice`` unless B's scale, the bias and the output are float32 (the kernel's float type)."""
    if b_scale.dtype != np.float32 or outputs[0].dtype != np.float32:
        raise NotOnDevice(f"{op_type}: scales and outputs other than float32 run on the CPU")
    if bias is not None and bias.dtype != np.float32:
        raise NotOnDevice(f"{op_type}: a bias other than float32 runs on the CPU")


@register
class MatMulIntegerToFloat(Operator):
    op_type = "MatMulIntegerToFloat"
    domain = "com.microsoft"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        a, b, a_scale, b_scale = inputs[:4]
        assert a is not None and b is not None and a_scale is not None and b_scale is not None
        zeros = _optional(inputs, 4), _optional(inputs, 5)
        bias = _optional(inputs, 6)
        return [integer_matmul_to_float(self.op_type, a, b, a_scale, b_scale, *zeros, bias)]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        a_scale, b_scale, bias = inputs[2], inputs[3], _optional(inputs, 6)
        assert a_scale is not None and b_scale is not None
        if a_scale.size != 1 or a_scale.dtype != np.float32:
            raise NotOnDevice(f"{self.op_type}: an A scale other than one float32 value runs on the CPU")
        _check_float_parameters(self.op_type, b_scale, bias, outputs)
        present = [i if i < len(inputs) and inputs[i] is not None else -1 for i in (0, 1, 4, 5)]
        operator, attributes = MatMulIntegerToFloat(self.opset), dict(attrs)

        def function(*arrays: np.ndarray) -> np.ndarray:
            values: list[np.ndarray | None] = [None] * 7
            bound = [p for p in present if p >= 0] + [2, 3] + ([6] if bias is not None else [])
            for position, array in zip(bound, arrays):
                values[position] = array
            return operator.reference(values, attributes, outputs)[0]

        return integer_matmul_kernel(
            self.op_type,
            inputs,
            outputs,
            present,
            caps,
            function,
            to_float=(2, 3, 6 if bias is not None else -1),
            column_parameters=True,
        )


@register
class DynamicQuantizeMatMul(Operator):
    op_type = "DynamicQuantizeMatMul"
    domain = "com.microsoft"
    since_version = 1

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        a, b, b_scale = inputs[:3]
        assert a is not None and b is not None and b_scale is not None
        if a.dtype != np.float32:
            raise UnsupportedOpError(f"{self.op_type}: A of dtype {a.dtype} (float32 expected)")
        quantize = standard_quantize.DynamicQuantizeLinear(11)
        a_quantized, a_scale, a_zero = quantize.reference([a], {}, outputs)
        return [
            integer_matmul_to_float(
                self.op_type, a_quantized, b, a_scale, b_scale, a_zero, _optional(inputs, 3), _optional(inputs, 4)
            )
        ]

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        a, b, b_scale = inputs[:3]
        assert a is not None and b is not None and b_scale is not None
        b_zero, bias = _optional(inputs, 3), _optional(inputs, 4)
        if a.dtype != np.float32:
            raise NotOnDevice(f"{self.op_type}: A of dtype {a.dtype.name} runs on the CPU")
        _check_float_parameters(self.op_type, b_scale, bias, outputs)
        builder = PlanBuilder(self.op_type)
        # A quantized, its scale and its zero point: DynamicQuantizeLinear's outputs, kept in scratch buffers
        quantized = [TensorInfo(a.shape, np.dtype(np.uint8)), TensorInfo((), np.dtype(np.float32))]
        quantized.append(TensorInfo((), np.dtype(np.uint8)))
        at = [builder.scratch(info) for info in quantized]
        quantize = standard_quantize.DynamicQuantizeLinear(11).plan([a], quantized, {}, caps, {})
        builder.include(quantize, [Binding("input", 0)], at)
        # then MatMulIntegerToFloat over (A quantized, B, A's scale, B's scale, A's zero point, B's zero point, bias)
        infos = [quantized[0], b, quantized[1], b_scale, quantized[2], b_zero, bias]
        present = [0, 1, 4, 5 if b_zero is not None else -1]
        bound = [p for p in present if p >= 0] + [2, 3] + ([6] if bias is not None else [])
        op_type = self.op_type

        def function(*arrays: np.ndarray) -> np.ndarray:
            values: list[np.ndarray | None] = [None] * 7
            for position, array in zip(bound, arrays):
                values[position] = array
            a_q, b_q, a_scale, b_scale_value = values[:4]
            assert a_q is not None and b_q is not None and a_scale is not None and b_scale_value is not None
            return integer_matmul_to_float(op_type, a_q, b_q, a_scale, b_scale_value, *values[4:])

        gemm = integer_matmul_kernel(
            self.op_type,
            infos,
            outputs,
            present,
            caps,
            function,
            to_float=(2, 3, 6 if bias is not None else -1),
            column_parameters=True,
        )
        node = [Binding("input", index) if info is not None else None for index, info in enumerate(inputs)]
        node += [None] * (5 - len(node))
        builder.include(gemm, [at[0], node[1], at[1], node[2], at[2], node[3], node[4]], [Binding("output", 0)])
        return builder.build()


class _StandardAtOpset13(Operator):
    """A com.microsoft operator that is the standard one of the same name at ONNX opset 13: its reference and
    device plan are the standard class's (no ``opset_changes``: this domain has one version)."""

    standard: ClassVar[type[Operator]]

    def __init__(self, opset: int = 0) -> None:
        super().__init__(opset)
        self._standard = self.standard(STANDARD_QUANTIZE_OPSET)

    def reference(
        self,
        inputs: Sequence[np.ndarray | None],
        attrs: Mapping[str, Any],
        outputs: Sequence[TensorInfo],
    ) -> list[np.ndarray]:
        return self._standard.reference(inputs, attrs, outputs)

    def plan(
        self,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo],
        attrs: Mapping[str, Any],
        caps: DeviceCaps,
        constants: Mapping[int, np.ndarray],
    ) -> OpPlan:
        return self._standard.plan(inputs, outputs, attrs, caps, constants)


@register
class QuantizeLinear(_StandardAtOpset13):
    op_type = "QuantizeLinear"
    domain = "com.microsoft"
    since_version = 1
    standard = standard_quantize.QuantizeLinear


@register
class DequantizeLinear(_StandardAtOpset13):
    op_type = "DequantizeLinear"
    domain = "com.microsoft"
    since_version = 1
    standard = standard_quantize.DequantizeLinear
